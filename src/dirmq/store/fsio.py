"""Durable file creation with group commit.

Theory of operation. A put writes its message to `@tmp/`, makes the data durable itself (one
`fsync` for a single file; for a batch one `syncfs`, or each file's `fsync` on several threads,
whichever costs less now), renames it into its state directory, and
only then joins the root's `GroupCommit` to make the rename durable: the first caller to arrive
becomes the leader and fsyncs every directory the waiting callers renamed into; callers that
arrive meanwhile form the next group. Data fsyncs of concurrent writers run in parallel (the
filesystem merges them into shared journal commits) and directory fsyncs are shared, so N
concurrent puts cost about N/k + 1 flushes and one `put_many` of N costs two: this is how a
file-per-message store gets past ~1k durable messages/s on one disk.

A message becomes visible only after its data is durable, so a crash never exposes a partial
file. If a flush fails (EIO, ENOSPC) the caller gets a `StorageError` and its files are removed
(temp files before the rename, the renamed files if the directory flush failed). After a failed
fsync the page cache cannot be trusted, so a flush is never retried with the same files.

`syncfs` for a batch or a flush per file: on this project's unjournalled ext4, a batch of 16-64
files cost 1.1-9 ms either way, and which won changed from one minute to the next (per-file
flushes from threads won after mass deletions and while neighbours wrote, whose dirty pages a
`syncfs` writes too; `syncfs` on a quiet disk: docs/benchmarks-http.md, docs/benchmarks.md). So a
Store's group commit takes whichever has cost less lately for batches of that size
(dataflush.py); either way every file is durable before any is renamed.

On a shared filesystem (NFS, FUSE such as GlusterFS, ...: `filesystems.is_shared`, or a root
opened with `Store(shared=True)`) `syncfs` is no flush: FUSE passes it on only to filesystems that
ask for it, which GlusterFS does not (docs/FORMAT.md, "Filesystems"), so a batch fsyncs each file.
There every call is a round trip through the filesystem's client and servers (on GlusterFS a
create costs 2 ms, a rename 3 ms, an fsync 1 ms: docs/benchmarks.md, "GlusterFS"), so a batch's
files are written, fsynced and renamed `overlap`ped on OVERLAP_THREADS threads, one barrier
between steps (every file durable before any is renamed: all or nothing as above). Overlap pays
where the latency is the network's or the servers' disks'; where the filesystem's own processes
are the bottleneck (GlusterFS over loopback on 2 cores: about one core busy at any concurrency)
it gains little, and what counts is the calls a batch saves: one directory fsync per batch.

`writeback` renames at once and lets a background thread flush within `writeback_delay_s`
(writeback.py); `memory` never flushes. There a crash can leave a recycled file (pool.py) under
its new name with its old content, a complete older message: the codec's `Dirmq-Id` check makes
that corrupt.

Why it is long: every step of making a new file durable lives here (temp files and their
O_TMPFILE/linkat fallbacks, the group commit, its overlapped form for shared filesystems), so
the ordering that durability rests on can be read in one place.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from dirmq.errors import QueueNotFound, storage_error
from dirmq.store.filemodes import Access
from dirmq.store.filesystems import is_shared
from dirmq.store.libc import LIBC_PATH

T = TypeVar("T")
R = TypeVar("R")
# Threads that overlap one batch's round trips on a shared filesystem. GlusterFS over loopback
# gained up to 2x at 4-16 in flight on a busy machine and nothing on a quieter one (its own
# processes saturate a core: docs/benchmarks.md, "GlusterFS"); a network's latency leaves more
# to overlap.
OVERLAP_THREADS = 16

_libc = ctypes.CDLL(LIBC_PATH, use_errno=True)
_syncfs = getattr(_libc, "syncfs", None)


def syncfs(fd: int) -> None:
    """Flush the whole filesystem holding `fd` (data and metadata)."""
    if _syncfs is None:  # pragma: no cover - every Linux libc since 2.14 has it
        os.sync()
        return
    if _syncfs(fd) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _sync_filesystem_of(path: str) -> None:
    """`syncfs` of the filesystem of the nearest existing directory above `path`."""
    parent = os.path.dirname(path)
    while parent and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    fd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new_file(path: str, data: bytes, access: Access) -> int:
    """Create `path` exclusively, with the root's `access`, and write `data`; return the open fd
    (the caller flushes/closes).

    On any failure the partial file is removed before the error propagates.
    """
    fd = access.open(path)
    try:
        _write_all(fd, data)
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    return fd


def _unlink_quietly(path: str, directory: DirHandle | None = None) -> None:
    try:
        os.unlink(path, dir_fd=None if directory is None else directory.fd)
    except OSError:
        pass


_overlap_executor: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): not across fork
_overlap_lock = threading.Lock()


def _forget_overlap_in_child() -> None:
    """A forked child has none of the parent's threads, and the lock may have been held by one."""
    global _overlap_executor, _overlap_lock
    _overlap_executor, _overlap_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_overlap_in_child)


def _executor() -> ThreadPoolExecutor:
    global _overlap_executor
    with _overlap_lock:
        if _overlap_executor is None or _overlap_executor[0] != os.getpid():
            pool = ThreadPoolExecutor(OVERLAP_THREADS, thread_name_prefix="dirmq-overlap")
            _overlap_executor = (os.getpid(), pool)
        return _overlap_executor[1]


def overlap(
    fn: Callable[[T], R], items: Sequence[T]
) -> tuple[list[R | None], BaseException | None]:
    """`fn` over `items` at once (on OVERLAP_THREADS threads, the caller doing the first item):
    each item's result (None where it failed) and the first error, after every call ended, so
    the caller can undo what succeeded."""
    if len(items) <= 1:
        try:
            return [fn(x) for x in items], None
        except BaseException as exc:
            return [None] * len(items), exc
    submit = _executor().submit
    futures = [submit(fn, x) for x in items[1:]]
    results: list[R | None] = []
    error: BaseException | None = None
    try:
        results.append(fn(items[0]))
    except BaseException as exc:
        results.append(None)
        error = exc
    for future in futures:
        try:
            results.append(future.result())
        except BaseException as exc:
            results.append(None)
            error = error or exc
    return results, error


class DirHandle:
    """An open directory, to name files relative to it (a shorter path walk per syscall).

    Its descriptor is closed only when nothing refers to the handle any more: a file named
    relative to it holds it, so a rename can never follow a closed descriptor's number into
    whatever directory or socket reused it."""

    __slots__ = ("__weakref__", "fd")

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        # Not at exit: atexit hooks (ownpool.release_own_pools) may still use it; the OS closes it.
        weakref.finalize(self, os.close, self.fd).atexit = False


@dataclass(slots=True)
class PendingFile:
    """A written, unflushed new file and the name it takes once durable.

    `tmp_path` is None for an unnamed `O_TMPFILE` inode: it has no name until it is linked into
    place, so a crash before that leaves nothing behind at all. With `tmp_dir`, `tmp_path` is
    relative to that directory.
    """

    fd: int
    tmp_path: str | None
    final_path: str
    open: bool = True
    tmp_dir: DirHandle | None = None
    # Makes the final directory again when the rename finds it gone (a backlog bucket a
    # refill emptied and removed between its making and this rename: backlog.py).
    make_dir: Callable[[], object] | None = None
    # The file's whole content as written, for the commit journal (journal.py); None where the
    # file is written otherwise (a streamed body).
    data: bytes | None = None

    @property
    def message_id(self) -> str:
        """The id in the final name (`<id>[~group]` in @ready, `<id>.0.<due>[~group]` in
        @delayed)."""
        return os.path.basename(self.final_path).split("~", 1)[0].split(".", 1)[0]

    def close(self) -> None:
        if self.open:
            self.open = False
            os.close(self.fd)

    def flush(self) -> None:
        """fsync the file's data (reopening it by its temp name if it was `detach`ed)."""
        if self.open:
            os.fsync(self.fd)
            return
        assert self.tmp_path is not None  # a detached file always has a name
        dir_fd = None if self.tmp_dir is None else self.tmp_dir.fd
        fd = os.open(self.tmp_path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def own_descriptor(self) -> int:
        """A descriptor of this file for the caller to close, valid after `publish` (a `dup`,
        or an open by its temp name if it was `detach`ed)."""
        if self.open:
            return os.dup(self.fd)
        assert self.tmp_path is not None  # a detached file always has a name
        dir_fd = None if self.tmp_dir is None else self.tmp_dir.fd
        return os.open(self.tmp_path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)

    def publish(self) -> None:
        """Give the file its final name (EEXIST/ENOENT propagate), then close it. With
        `make_dir`, a final directory found gone is made again and the name given once more,
        up to three times."""
        try:
            for attempt in range(4):
                try:
                    self._name()
                    return
                except FileNotFoundError:
                    if self.make_dir is None or attempt == 3:
                        raise
                    self.make_dir()
        finally:
            self.close()

    def _name(self) -> None:
        if self.tmp_path is None:
            _link_fd(self.fd, self.final_path)
        elif self.tmp_dir is not None:
            os.rename(self.tmp_path, self.final_path, src_dir_fd=self.tmp_dir.fd)
        else:
            os.rename(self.tmp_path, self.final_path)

    def detach(self, tmp_dir: str, tmp_name: str) -> None:
        """Close the descriptor now and keep the file by a name until it is published, so a
        batch does not hold one descriptor per message (EMFILE): an unnamed inode is first
        linked into `tmp_dir` as `tmp_name`. On failure the file is discarded."""
        try:
            if self.tmp_path is None:
                path = f"{tmp_dir}/{tmp_name}"
                _link_fd(self.fd, path)
                self.tmp_path = path
            self.close()
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Close and remove an unpublished file (idempotent)."""
        self.close()
        if self.tmp_path is not None:
            _unlink_quietly(self.tmp_path, self.tmp_dir)


_AT_FDCWD = -100
_AT_SYMLINK_FOLLOW = 0x400
_AT_EMPTY_PATH = 0x1000
_NO_TMPFILE = {errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL}
# How linkat(fd, "", AT_EMPTY_PATH) is refused: ENOENT without CAP_DAC_READ_SEARCH before 6.10,
# the others by kernels or sandboxes (seccomp) that do not allow the flag.
_NO_EMPTY_PATH = {errno.EPERM, errno.ENOENT, errno.EINVAL, errno.EACCES}
_tmpfile_unsupported: set[str] = set()
_empty_path_link = True  # until the kernel refuses it once


def _link_fd(fd: int, path: str) -> None:
    """Give the unnamed inode behind `fd` the name `path`.

    linkat(fd, "", AT_EMPTY_PATH) names the open file directly; through /proc/self/fd/N the
    kernel first walks procfs (~7 µs a message on tmpfs, the largest syscall cost of a put). The
    kernel allows the former to a caller with CAP_DAC_READ_SEARCH, or (6.10+) for a file the
    caller opened itself. A refusal looks like a missing target directory (ENOENT), so it is
    only taken as one when the procfs path then succeeds; from then on that path is used.
    """
    global _empty_path_link
    target = os.fsencode(path)
    refused = False
    if _empty_path_link:
        if _libc.linkat(fd, b"", _AT_FDCWD, target, _AT_EMPTY_PATH) == 0:
            return
        code = ctypes.get_errno()
        if code not in _NO_EMPTY_PATH:
            raise OSError(code, os.strerror(code), path)
        refused = True
    # os.link does not pass AT_SYMLINK_FOLLOW on every Python, which /proc/self/fd/N needs.
    source = b"/proc/self/fd/%d" % fd
    if _libc.linkat(_AT_FDCWD, source, _AT_FDCWD, target, _AT_SYMLINK_FOLLOW) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    if refused:
        _empty_path_link = False


def create_pending(
    tmp_dir: str,
    tmp_name: str,
    final_path: str,
    data: bytes,
    access: Access,
    *,
    unnamed: bool = True,
) -> PendingFile:
    """Write `data` to a new file in `tmp_dir` (created with the root's `access`), to be
    published as `final_path`.

    Uses an unnamed `O_TMPFILE` inode where the filesystem supports it (one directory operation
    fewer per message, and no orphan after a crash), else `tmp_dir/tmp_name`. On failure nothing
    is left behind. `unnamed` False: always the named temp (the shared-filesystem mode, where
    FUSE and NFS have no `O_TMPFILE`: no failed attempt per directory and process).
    """
    if unnamed and tmp_dir not in _tmpfile_unsupported:
        try:
            fd = access.open(tmp_dir, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno not in _NO_TMPFILE:
                raise
            _tmpfile_unsupported.add(tmp_dir)
        else:
            try:
                _write_all(fd, data)
            except BaseException:
                os.close(fd)
                raise
            return PendingFile(fd, None, final_path, data=data)
    tmp_path = os.path.join(tmp_dir, tmp_name)
    return PendingFile(write_new_file(tmp_path, data, access), tmp_path, final_path, data=data)


def overwrite_pending(
    path: str,
    final_path: str,
    data: bytes,
    size: int | None = None,
    directory: DirHandle | None = None,
) -> PendingFile:
    """Overwrite the existing (recycled) file at `path` (relative to `directory` if given) with
    exactly `data`, to be published as `final_path`. `size` is the file's current size if known:
    a file no longer than `data` needs no `ftruncate` (a syscall per message in a batch). On
    failure the file is removed."""
    dir_fd = None if directory is None else directory.fd
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        _unlink_quietly(path, directory)
        raise
    try:
        _write_all(fd, data)
        if size is None or size > len(data):
            os.ftruncate(fd, len(data))
    except BaseException:
        os.close(fd)
        _unlink_quietly(path, directory)
        raise
    return PendingFile(fd, path, final_path, tmp_dir=directory, data=data)


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written < len(data):  # rare (a signal, a full disk): no memoryview on the common path
        view = memoryview(data)[written:]
        while view:
            view = view[os.write(fd, view) :]


@dataclass(slots=True)
class _Waiter:
    dirs: set[str]
    done: bool = False
    error: OSError | None = None


def _syncfs_batch(files: list[PendingFile]) -> None:
    syncfs(files[0].fd)


class GroupCommit:
    """Shares directory fsyncs between every thread publishing under one root in this process.

    `flush_data` makes a local batch's data durable (two or more files, the first still open):
    one `syncfs` unless the Store gives its chooser (dataflush.py)."""

    def __init__(self, flush_data: Callable[[list[PendingFile]], None] = _syncfs_batch) -> None:
        self.flush_data = flush_data  # replaceable, e.g. by a test that wants one way
        self._cond = threading.Condition(threading.Lock())
        self._waiting: list[_Waiter] = []
        self._leader_busy = False
        self._syncfs_flushes: dict[str, bool] = {}  # target directory -> not on a shared fs

    def flush_each(self, directory: str) -> bool:
        """Whether files in `directory` must be fsynced one by one (`syncfs` is no flush on a
        shared filesystem); asked once per directory."""
        flushes = self._syncfs_flushes.get(directory)
        if flushes is None:
            flushes = self._syncfs_flushes[directory] = not is_shared(directory)
        return not flushes

    def commit(
        self, files: list[PendingFile], shared: bool = False, *, each: bool | None = None
    ) -> None:
        """Make `files` durable and visible under their final names, or raise and leave nothing.

        `shared` (the root's shared-filesystem mode): flush each file, overlapped, as on a
        filesystem where `syncfs` is no flush. `each`: whether the files' filesystem is one
        (`flush_each`) when the caller knows; None: asked of the first file's directory.
        Raises `StorageError` if a flush failed, `QueueNotFound` if the target directory
        vanished (the queue was deleted meanwhile). Closes every fd either way.
        """
        published: list[str] = []
        try:
            if len(files) > 1 and (
                shared
                or (
                    self.flush_each(files[0].final_path.rpartition("/")[0])
                    if each is None
                    else each
                )
            ):
                self._flush_and_publish_overlapped(files, published)
            else:
                if len(files) == 1:
                    os.fsync(files[0].fd)
                elif files:
                    self.flush_data(files)
                for f in files:
                    f.publish()
                    published.append(f.final_path)
            # Final paths are always "<dir>/<name>" (rpartition: a third of os.path.dirname).
            self._sync_dirs({path.rpartition("/")[0] for path in published})
        except OSError as exc:
            for f in files:
                f.discard()
            for path in published:  # all or nothing: a failed put leaves no message behind
                _unlink_quietly(path)
            if exc.errno == errno.ENOENT:
                raise QueueNotFound(
                    "the queue was deleted while messages were being stored"
                ) from exc
            raise storage_error(exc, "storing new messages") from exc

    @staticmethod
    def _flush_and_publish_overlapped(files: list[PendingFile], published: list[str]) -> None:
        """fsync every file, then rename every file, each step overlapped; what was renamed is
        appended to `published` (for the caller to undo on failure)."""
        _, error = overlap(PendingFile.flush, files)
        if error is not None:
            raise error
        done, error = overlap(_publish, files)
        published.extend(path for path in done if path is not None)
        if error is not None:
            raise error

    def _sync_dirs(self, dirs: set[str]) -> None:
        """fsync `dirs`, sharing the work with every other thread waiting to do the same."""
        waiter = _Waiter(dirs)
        with self._cond:
            self._waiting.append(waiter)
            while not waiter.done:
                if self._leader_busy:
                    self._cond.wait()
                    continue
                self._leader_busy = True
                group, self._waiting = self._waiting, []
                self._cond.release()
                try:
                    _fsync_group(group)
                finally:
                    self._cond.acquire()
                    self._leader_busy = False
                    self._cond.notify_all()
        if waiter.error is not None:
            raise waiter.error


def _publish(f: PendingFile) -> str:
    f.publish()
    return f.final_path


def _fsync_group(group: list[_Waiter]) -> None:
    failed: dict[str, OSError] = {}
    for path in set().union(*(w.dirs for w in group)):
        try:
            fsync_dir(path)
        except FileNotFoundError as exc:
            # A backlog bucket a refill emptied and removed after our rename into it: our files
            # moved on (into @ready, or further), by renames nobody flushed. Flushing the whole
            # filesystem makes them durable wherever they are now.
            try:
                _sync_filesystem_of(path)
            except OSError:
                failed[path] = exc
        except OSError as exc:
            failed[path] = exc
    for waiter in group:
        waiter.error = next((failed[d] for d in waiter.dirs if d in failed), None)
        waiter.done = True
