"""Recycling message files instead of creating and unlinking one per message.

Why: creating an inode is the most expensive step of a put on ext4 under a queue's churn (the
allocator avoids and re-checks recently freed inodes: 0.3-1 ms per create measured here, against
~10 µs to reopen and overwrite an existing file), and an unlink costs more than a rename. So a
message that leaves the queue for good (ack, delete, purge, retention) is renamed into `@free/`
and a later put overwrites it and publishes it exactly like a new file (flush, then rename into
`@ready/`).

Two pools per queue:
- the process's own pool, `@free/<host>.<pidns>.<pid>.<start>-<nonce>/`: a directory only this
  process touches while it lives, so a put overwrites one of its files in place and publishes it
  with a single rename (no claim rename: nobody else can take it). Retirements made by this
  process go there first, up to `OWN_POOL_FILES`. One per process and queue (shared by every
  `Store` of the process; a forked child starts its own).
- the shared pool, the plain files of `@free/`: retirements beyond that, and the pools of dead
  processes. A put claims one by renaming it into `@tmp/` (the loser of a race gets ENOENT and
  tries the next name), then overwrites it.

An acknowledged message is not left readable: every retired file goes through this process's
own pool, where it is blanked (overwritten with zeros, `_blank`) before it is kept there or
renamed on into the shared pool. Nowhere else is blanking safe: before the rename another
process may still move the file (requeue an expired lease), after it a put may be writing it.

Nothing here is ever visible as a message: `@free/` holds zeros, and a file being overwritten
is published like a new file. With `writethrough` that is once its new content is durable, so a
crash mid-overwrite leaves garbage in a pool (or an orphan temp file that recovery removes).
With `writeback`/`memory` the rename may reach the disk before the data, leaving the file's old
content (zeros, or an acknowledged message whose blanking had not reached the disk either) under
the new name: its `Dirmq-Id` is not the new message's, so readers treat it as corrupt
(codec.py), never deliver it again.

The pool of a dead process is reclaimed by `reclaim_pools` (on queue open, by sweep and by
fsck): its blank files go back to the shared pool. Only files of at most `MAX_RECYCLED_BYTES` are
kept, at most `capacity` shared and `OWN_POOL_FILES` own per queue and process, so the pools
never hold much disk.

Space first. While the filesystem is short of space or inodes (under `SHORT_FREE_FRACTION`
free, checked at most once per `SPACE_CHECK_INTERVAL_S`), a retired file is unlinked instead:
at a full disk, draining a queue must give its space back, not park it in `@free`. A recycling
step that fails (ENOSPC when `@free` or a new pool directory must grow, EMFILE, ...) falls back
to the unlink too, so an ack never fails for want of space; on ENOSPC this process's pools are
emptied at once (`release_space`).

Why it is long: both pools (this process's own and the shared one), their claims, the reclaiming of
a dead process's pool and the space rules share one set of invariants about which file may be
overwritten by whom; apart, each half would have to re-check the other's.
"""

from __future__ import annotations

import atexit
import errno
import os
import re
import threading
import time
from dataclasses import dataclass, field
from enum import Enum

from dirmq.store import layout
from dirmq.store.access import Access
from dirmq.store.fsio import DirHandle, PendingFile, overwrite_pending

MAX_RECYCLED_BYTES = 64 * 1024
DEFAULT_POOL_FILES = 1024
OWN_POOL_FILES = 256
RELIST_INTERVAL_S = 1.0  # after a listing of @free that found nothing
SHORT_FREE_FRACTION = 0.05  # less free space or inodes than this: retired files are unlinked
SPACE_CHECK_INTERVAL_S = 1.0
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
ORPHAN_POOL_GRACE_S = 3600.0  # a pool of another host: its owner is presumed dead after this

_ZEROS = memoryview(bytes(MAX_RECYCLED_BYTES))  # what a retired file is overwritten with
_POOL_DIR_RE = re.compile(r"([0-9a-f]{8})\.(\d+)\.(\d+)\.(\d+)-([0-9a-f]{8})")


def _pid_namespace() -> int:
    """This process's pid namespace (0 if unknown): pids mean something only inside it, and
    containers sharing a root may well share a host name."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


_PID_NS = _pid_namespace()


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None if unknown or gone.

    With the pid it names one process for good: a pid reused by a later process has another
    start time, so a dead process's pool is never taken for a live one's (or the other way)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def pool_dir_name() -> str:
    """This process's own pool directory name (a fresh nonce each time: never reused)."""
    pid = os.getpid()
    start = _start_ticks(pid) or 0
    return f"{layout.HOST_TAG}.{_PID_NS}.{pid}.{start}-{os.urandom(4).hex()}"


class Owner(Enum):
    """Whose a pool directory is, as far as this process can tell."""

    ALIVE = "alive"  # its process runs (or might: another host, not old): leave it alone
    DEAD = "dead"  # its process is gone for sure: its files may be reused
    STALE = "stale"  # another host's, untouched for an hour: delete, never reuse (see below)
    UNKNOWN = "unknown"  # not a pool directory name


def pool_owner(name: str, path: str) -> Owner:
    match = _POOL_DIR_RE.fullmatch(name)
    if match is None:
        return Owner.UNKNOWN
    host, pid_ns, pid, start = match.group(1), *map(int, match.group(2, 3, 4))
    if host != layout.HOST_TAG or (pid_ns and _PID_NS and pid_ns != _PID_NS):
        # Liveness on another host (or in another pid namespace) cannot be checked; an owner
        # that is merely idle could still be overwriting a file it took, so its files are only
        # ever deleted (a put of its that loses its file fails), never handed to another writer.
        try:
            idle_s = time.time() - os.lstat(path).st_mtime
        except OSError:  # gone, or its age cannot be read now: judged again next time
            return Owner.ALIVE
        return Owner.STALE if idle_s > ORPHAN_POOL_GRACE_S else Owner.ALIVE
    ticks = _start_ticks(pid)
    if ticks is not None:
        return Owner.ALIVE if start in (0, ticks) else Owner.DEAD
    try:  # no /proc: the pid alone must do (a reused pid keeps a dead pool until it exits)
        os.kill(pid, 0)
    except ProcessLookupError:
        return Owner.DEAD
    except PermissionError:
        pass
    return Owner.ALIVE


def _blank(name: str, size: int, directory: DirHandle) -> None:
    """Overwrite the first `size` bytes of file `name` in `directory` with zeros (its length
    stays: a later put overwrites it, as `overwrite_pending` expects).

    Why zeros and not a truncate: on this project's ext4 (mounted with `discard`) truncating a
    file whose blocks are allocated costs 60-70 µs (the blocks are freed, then allocated again
    by the next put, which gets slower too), while this open + pwrite + close of a page that
    is almost always cached (the consumer has just read it) costs ~2.5 µs."""
    if size == 0:
        return
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=directory.fd)
    try:
        done = os.pwrite(fd, _ZEROS[:size], 0)
        while done < size:  # rare (a signal): no loop on the common path
            done += os.pwrite(fd, _ZEROS[done:size], done)
    finally:
        os.close(fd)


def is_blank(path: str, size: int) -> bool:
    """Whether the file at `path` holds nothing but zeros (it was blanked when retired)."""
    with open(path, "rb") as f:
        return f.read(MAX_RECYCLED_BYTES + 1) == _ZEROS[:size]


def _unlink_quietly(name: str, directory: DirHandle) -> None:
    try:
        os.unlink(name, dir_fd=directory.fd)
    except OSError:
        pass


def reclaim_pool(pool_dir: str, free_dir: str, owner: Owner, room: int) -> int:
    """Empty and remove the pool directory of a process that is gone; returns files handled.

    A dead owner's files go back to the shared pool (up to `room` of them), the rest are
    unlinked. A file that also has another name is only unlinked: after a machine crash on a
    filesystem without ordered metadata, a rename can survive at its target while its source
    entry comes back, so a pool name can share its inode with a published message; overwriting
    it would change that message. So is a file that is not blank: its owner died between
    renaming it into its pool and blanking it (an acknowledged message is never shared)."""
    handled = 0
    try:
        entries = list(os.scandir(pool_dir))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
            reuse = (
                owner is Owner.DEAD
                and room > 0
                and entry.is_file(follow_symlinks=False)
                and st.st_nlink == 1
                and st.st_size <= MAX_RECYCLED_BYTES
                and is_blank(entry.path, st.st_size)
            )
            if reuse:
                os.rename(entry.path, os.path.join(free_dir, entry.name))
                room -= 1
            else:
                os.unlink(entry.path)
            handled += 1
        except FileNotFoundError:
            continue  # another process reclaimed it first
        except IsADirectoryError:
            continue  # not ours to guess about; the rmdir below fails and fsck reports it
        except OSError:
            break  # the disk refuses writes now (read-only, failing): reclaimed next time
    try:
        os.rmdir(pool_dir)
    except OSError:
        pass
    return handled


def reclaim_pools(free_dir: str, capacity: int = DEFAULT_POOL_FILES) -> int:
    """Reclaim the pools of dead processes in `free_dir`, keeping the shared pool within
    `capacity` files; returns how many pools."""
    reclaimed = 0
    try:
        with os.scandir(free_dir) as it:
            entries = list(it)
    except OSError:  # gone, or unreadable now (a failing disk): reclaimed next time
        return 0
    dirs = [e for e in entries if e.is_dir(follow_symlinks=False)]
    room = capacity - (len(entries) - len(dirs))
    for entry in dirs:
        owner = pool_owner(entry.name, entry.path)
        if owner in (Owner.DEAD, Owner.STALE):
            room -= reclaim_pool(entry.path, free_dir, owner, room)
            reclaimed += 1
    return reclaimed


@dataclass(slots=True)
class _OwnPool:
    """This process's pool in one queue: files it alone may overwrite, with their sizes.

    `files` are names relative to `handle`, the open pool directory (None until the first
    retirement makes it, and again once it is found gone). Both change together, under `lock`.
    """

    dir: str
    files: list[tuple[str, int]] = field(default_factory=list)
    handle: DirHandle | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def forget(self, handle: DirHandle) -> None:
        """The directory behind `handle` is gone: drop what we knew of it (once)."""
        with self.lock:
            if self.handle is handle:
                self.handle = None
                self.files.clear()


_own_pools: dict[str, _OwnPool] = {}  # @free path -> this process's pool there
_own_lock = threading.Lock()


def _forget_own_pools() -> None:
    # A forked child must not write into its parent's pool: it starts its own.
    global _own_lock
    _own_pools.clear()
    _own_lock = threading.Lock()


def release_own_pool(free_dir: str) -> int:
    """Hand this process's own pool in `free_dir` over to the shared pool there; returns how
    many files moved. Files taken by puts in flight are not affected."""
    pool = _own_pools.get(free_dir)
    if pool is None:
        return 0
    with pool.lock:
        files, pool.files = pool.files, []
        handle, pool.handle = pool.handle, None
    if handle is None:
        return 0
    moved = 0
    for name, _size in files:
        try:
            os.rename(name, os.path.join(free_dir, name), src_dir_fd=handle.fd)
            moved += 1
        except OSError:
            pass
    try:
        os.rmdir(pool.dir)
    except OSError:
        pass  # a file retired meanwhile: reclaimed as a dead process's pool later
    return moved


def drop_own_pools() -> int:
    """Unlink every file of this process's own pools (all queues: they share filesystems);
    returns how many. For a full disk, where the space matters more than the recycling."""
    dropped = 0
    for pool in list(_own_pools.values()):
        with pool.lock:
            files, pool.files = pool.files, []
            handle = pool.handle
        if handle is None:
            continue
        for name, _size in files:
            try:
                os.unlink(name, dir_fd=handle.fd)
                dropped += 1
            except OSError:
                pass
    return dropped


def space_short(path: str) -> bool:
    """Whether the filesystem holding `path` has less than `SHORT_FREE_FRACTION` of its space
    or of its inodes free (for this user: `f_bavail`). False when that cannot be told."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    if st.f_bavail < st.f_blocks * SHORT_FREE_FRACTION:
        return True
    return bool(st.f_files) and st.f_favail < st.f_files * SHORT_FREE_FRACTION


def release_own_pools() -> int:
    """Hand every own pool of this process over to the shared pools (run at exit: what a dead
    process leaves is reclaimed too, but only when someone next opens the queue)."""
    return sum(release_own_pool(free_dir) for free_dir in list(_own_pools))


os.register_at_fork(after_in_child=_forget_own_pools)
atexit.register(release_own_pools)


def _own_pool(free_dir: str) -> _OwnPool:
    pool = _own_pools.get(free_dir)
    if pool is None:
        with _own_lock:
            pool = _own_pools.get(free_dir)
            if pool is None:
                pool = _own_pools[free_dir] = _OwnPool(os.path.join(free_dir, pool_dir_name()))
    return pool


class FilePool:
    """The `@free/` directory of one queue, as this process knows it."""

    def __init__(self, free_dir: str, access: Access, capacity: int = DEFAULT_POOL_FILES) -> None:
        self._dir = free_dir
        self._access = access  # for this process's own pool directory
        self._capacity = capacity
        self._known: list[str] = []  # shared pool files, as last listed
        self._lock = threading.Lock()
        self._listed_at = 0.0
        self._short = False  # the filesystem was short of space when last checked
        self._space_checked_at = -SPACE_CHECK_INTERVAL_S

    def retire(self, path: str, message_id: str) -> None:
        """Remove the message file at `path` for good (FileNotFoundError if it is already gone).

        It is recycled when small, alone (one name) and a pool has room (this process's own
        first), and the filesystem is not short of space, else unlinked. A recycled file is
        blanked first (`_retire_own`). Only the unlink's errors propagate."""
        if self.short_of_space() or (
            len(_own_pool(self._dir).files) >= OWN_POOL_FILES and self._full()
        ):
            os.unlink(path)  # no space to spare, or both pools are full: no need for its size
            return
        st = os.lstat(path)
        if st.st_size > MAX_RECYCLED_BYTES or st.st_nlink > 1:
            os.unlink(path)  # a second name may be a message's (see reclaim_pool): not blanked
            return
        try:
            if self._retire_own(path, message_id, st.st_size):
                return
        except FileNotFoundError:
            raise
        except OSError as exc:  # recycling is an optimisation: never a reason to fail an ack
            if exc.errno in _NO_SPACE:
                self.release_space()
        os.unlink(path)

    def short_of_space(self) -> bool:
        """`space_short` for this pool's filesystem, asked at most once per
        `SPACE_CHECK_INTERVAL_S`; when it turns short, the pools give their files back."""
        now = time.monotonic()
        if now - self._space_checked_at >= SPACE_CHECK_INTERVAL_S:
            self._space_checked_at = now
            short = space_short(self._dir)
            if short and not self._short:
                self.release_space()
            self._short = short
        return self._short

    def release_space(self) -> int:
        """The disk is full: unlink the files of this process's own pools and of this queue's
        shared pool; returns how many. Retirements unlink until the next space check."""
        self._short = True
        self._space_checked_at = time.monotonic()
        return drop_own_pools() + self.trim(keep=0)

    def _full(self) -> bool:
        with self._lock:
            return len(self._known) >= self._capacity

    def _retire_own(self, path: str, message_id: str, size: int) -> bool:
        """Retire `path` through this process's own pool: renamed there, where no other process
        may touch it, and blanked there (overwritten with zeros: an acknowledged message is not
        left readable, and nobody can be writing the file meanwhile); then kept, or handed to
        the shared pool when ours is full. False (nothing done) if there is no pool directory."""
        own = _own_pool(self._dir)
        with own.lock:
            if own.handle is None:
                try:
                    self._access.mkdir(own.dir)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    return False  # no @free (an older queue, or the queue is going away)
                try:
                    own.handle = DirHandle(own.dir)
                except FileNotFoundError:
                    return False
            handle = own.handle
        try:
            os.rename(path, message_id, dst_dir_fd=handle.fd)
        except FileNotFoundError:
            if not os.path.lexists(path):
                raise
            own.forget(handle)  # our directory was removed (by hand?): remade next time
            return False
        try:
            _blank(message_id, size, handle)
        except OSError as exc:
            _unlink_quietly(message_id, handle)
            if exc.errno in _NO_SPACE:
                self.release_space()
            return True
        with own.lock:
            if own.handle is handle and len(own.files) < OWN_POOL_FILES:
                own.files.append((message_id, size))
                return True
        if not self._full():  # ours is full: the shared pool takes it, blank
            try:
                os.rename(message_id, os.path.join(self._dir, message_id), src_dir_fd=handle.fd)
            except OSError:
                pass
            else:
                with self._lock:
                    self._known.append(message_id)
                return True
        _unlink_quietly(message_id, handle)
        return True

    def overwrite_own(self, final_path: str, data: bytes) -> PendingFile | None:
        """A file of this process's own pool, overwritten with exactly `data`, to be published
        as `final_path` (a rename, like a temp file); None if the own pool is empty. On a write
        error the file is removed and the error propagates."""
        own = _own_pool(self._dir)
        with own.lock:
            if not own.files or own.handle is None:
                return None
            name, size = own.files.pop()
            handle = own.handle
        try:
            return overwrite_pending(name, final_path, data, size, handle)
        except FileNotFoundError:
            own.forget(handle)  # our pool directory is gone: the next retirement remakes it
            return None

    def overwrite_shared(self, tmp_path: str, final_path: str, data: bytes) -> PendingFile | None:
        """A shared pool file, claimed by renaming it to `tmp_path` and overwritten with exactly
        `data`; None if the shared pool is empty."""
        if not self.claim(tmp_path):
            return None
        return overwrite_pending(tmp_path, final_path, data)

    def claim(self, tmp_path: str) -> bool:
        """Move a shared pool file to `tmp_path` for overwriting; False if the pool is empty."""
        while True:
            with self._lock:
                if not self._known and not self._relist():
                    return False
                name = self._known.pop()
            try:
                os.rename(os.path.join(self._dir, name), tmp_path)
            except FileNotFoundError:
                continue  # another process claimed it (or the queue is gone: caller finds out)
            return True

    def _relist(self) -> bool:
        """Learn what other processes retired (call under the lock). A listing that found files
        paid for itself (one entry scanned per file claimed), so the next may follow at once;
        after one that found none, wait `RELIST_INTERVAL_S` (puts create files meanwhile)."""
        now = time.monotonic()
        if now - self._listed_at < RELIST_INTERVAL_S:
            return False
        try:
            with os.scandir(self._dir) as entries:
                self._known = [e.name for e in entries if e.is_file(follow_symlinks=False)]
            del self._known[self._capacity :]
        except FileNotFoundError:
            self._known = []
        self._listed_at = 0.0 if self._known else now
        return bool(self._known)

    def trim(self, keep: int = 0) -> int:
        """Unlink shared pool files beyond `keep`; returns how many were removed. (The pools of
        live processes are theirs; `reclaim_pools` handles those of dead ones.)"""
        removed = 0
        try:
            with os.scandir(self._dir) as entries:
                names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:  # gone, or unreadable now (a failing disk): nothing to trim
            return 0
        for name in names[keep:]:
            try:
                os.unlink(os.path.join(self._dir, name))
                removed += 1
            except OSError:
                pass
        with self._lock:
            self._known = []
            self._listed_at = 0.0
        return removed

    def own_files(self) -> int:
        """How many files this process's own pool holds (for tests and stats)."""
        own = _own_pool(self._dir)
        with own.lock:
            return len(own.files)
