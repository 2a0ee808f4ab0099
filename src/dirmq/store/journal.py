"""The commit journal (root format 6): a writethrough publish made durable by one append and one
`fdatasync` of this process's journal, instead of a flush of its files and their directories
(issue 37; docs/FORMAT.md, "The commit journal").

Theory of operation. A group of new message files (written, not flushed) is appended to this
Store's journal, `@journal/<process token>.<image>.<n>` (journal_format.py), as one record a
file (its queue and the queue's incarnation, its name in the queue, its bytes, a CRC), and
the journal is `fdatasync`ed once for every group appended meanwhile (the first waiter
flushes what all have appended). Only then are the files given their final names, with no
flush of the files or their directories, and, once each queue is found still the incarnation
its records name (incarnation.py: else the files are flushed by a `syncfs` here, since a
replay skips records of another incarnation), the publish answered:
after a machine crash, whatever a lost page cache took is in a journal, which the next opener
replays (journal_replay.py). A checkpoint thread, about once a second with anything appended
(at once past `CHECKPOINT_BYTES`), switches to a new journal file, waits for the groups still
publishing from the old one, `syncfs`es the root, and removes the old file: what it covered
is on the disk itself now (and, every 10 s, so is what a journal of a process that died
meanwhile covers: that journal goes too). A second without a publish closes and removes the
journal (an idle process holds no file open for writing: the filesystem can be remounted
read-only), and so does `close`.

Where it applies (`commit` returns False otherwise, and the caller takes the usual group
commit): a local filesystem (never the shared mode: another host's kernel could not flush our
pages), every file of the group with its bytes known (`PendingFile.data`: not a streamed body)
and at most `MAX_RECORD_DATA`, in a queue on the root's filesystem (the one a checkpoint's
`syncfs` flushes: not a queue mounted from another disk), in this process (not a forked child).

Errors: a failed append is truncated back (a failure of that too leaves a torn record, which
replay stops at, and the journal moves on to a new file); a failed `fdatasync` fails every
group not yet flushed in that file, and the file is truncated to what was flushed and left.
Either way the group's files are discarded: nothing half-visible, nothing counted. A journal
file that cannot be made (EMFILE, a full disk) is no error of the group's: it takes its own
flush; a checkpoint that cannot make the next file checkpoints all the same, with none. A
checkpoint whose `syncfs` fails keeps every journal of the Store (`unflushed.<name>`, or, where
that rename fails too, its write permission taken away; replayed after a reboot:
journal_replay.py), and every dead process's it was to remove, and turns the journal off for
the Store. A forked child closes its copies of the descriptors at once.

Why it is long: the writer and its checkpoint share one invariant (a journal file is removed
only once every group appended to it is named and `syncfs`ed without error), kept across
appends, flushes, file switches and the failures of each; the file format is
journal_format.py, recovery journal_replay.py.
"""

from __future__ import annotations

import atexit
import errno
import itertools
import os
import threading
import time
import weakref
from dataclasses import dataclass, field

from dirmq.errors import QueueNotFound, storage_error
from dirmq.store import layout, marker
from dirmq.store.filemodes import Access
from dirmq.store.fsio import PendingFile, fsync_dir, syncfs
from dirmq.store.incarnation import incarnation
from dirmq.store.journal_format import UNFLUSHED, boot_id, file_name, header, image, record_pieces
from dirmq.store.journal_judge import Verdict, judge_all, keep_dead_unflushed, mark_unflushed
from dirmq.store.processes import current

CHECKPOINT_S = 1.0  # a crash's replay covers about this much, and a checkpoint costs a syncfs
CHECKPOINT_BYTES = 64 << 20  # a journal this large is checkpointed at once
OTHERS_S = 10.0  # how often a checkpoint looks for the journals of dead processes
# A larger body keeps its own file's flush: copied into the journal it would be written twice.
MAX_RECORD_DATA = 1 << 20
_numbers = itertools.count(1)  # journal files of this process, across its Stores
_IOV_MAX = 1024  # the pieces one writev takes (Linux's UIO_MAXIOV)


@dataclass(eq=False)
class _File:
    """One journal file of this Store, open for appends until a checkpoint switches away."""

    path: str
    fd: int
    appended: int  # bytes written (the header's at first)
    empty_at: int  # `appended` with no record in it
    durable: int = 0  # bytes known flushed
    inflight: int = 0  # groups appended and not yet published (or failed)
    error: OSError | None = None  # a failed flush: every record past `durable` failed with it
    sync_lock: threading.Lock = field(default_factory=threading.Lock)


class Journal:
    """The commit journal of one Store (one file at a time, `@journal/<token>.<n>`). Thread-safe.

    `enabled` False (`Store(journal=False)`, `dirmq serve --no-journal`): `commit` always
    declines, and the caller flushes each group as before."""

    def __init__(self, root: str, access: Access, *, enabled: bool = True) -> None:
        self.root = root
        self.dir = os.path.join(root, layout.JOURNAL_DIR)
        self._prefix = root + "/"
        self._access = access
        self._boot = boot_id()
        self._forked = False  # set in a forked child (`_after_fork`): the journal is its parent's
        _every_journal.add(self)
        self.enabled = enabled and bool(self._boot)
        # One lock, two conditions: `_cond` for groups still naming their files (a checkpoint
        # waits for them to drain), `_wake` for the checkpoint thread's sleep. One condition for
        # both woke that thread at every group's end (2-3 wake-ups and GIL handoffs a message).
        lock = threading.Lock()
        self._cond = threading.Condition(lock)
        self._wake = threading.Condition(lock)
        self._current: _File | None = None
        self._retired: list[_File] = []  # switched away from, removed by the next checkpoint
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.last_error: OSError | None = None  # of a checkpoint (its journal is kept)
        self.checkpoints = 0
        self._others_at = 0.0  # when the next checkpoint looks for dead processes' journals
        # The root, open from before the first record a checkpoint covers until none is left
        # (the thread ends): `syncfs` reports a writeback error to each descriptor open when
        # it happened (once), so one opened for each checkpoint would miss an error another
        # process's flush saw first.
        self._root_fd: int | None = None
        # The root's filesystem, which a checkpoint flushes, and whether each queue is on it.
        self._device = os.stat(root).st_dev
        self._devices: dict[str, bool] = {}
        # Each queue's incarnation as last seen: a record names it; checked after its files
        # are named (`_check_incarnations`), so one statx a queue and group.
        self._incarnations: dict[str, str] = {}

    # -- the writer -------------------------------------------------------------------------
    def commit(self, files: list[PendingFile]) -> bool:
        """Make `files` durable by a journal record each, then give them their final names: True.
        False, touching nothing, where the journal does not apply (the module's docstring).
        Raises as `GroupCommit.commit` does (`StorageError`, `QueueNotFound`), leaving nothing."""
        if not self.enabled or not files or self._forked:
            return False
        pieces: list[bytes] = []
        prefix, skip = self._prefix, len(self._prefix)
        queues: dict[str, str] = {}  # each queue's incarnation, in every record of it
        for f in files:
            data, final = f.data, f.final_path
            if data is None or len(data) > MAX_RECORD_DATA or not final.startswith(prefix):
                return False
            queue, sep, name = final[skip:].partition("/@")
            if not sep or not self._on_root_device(queue):
                return False
            born = queues.get(queue)
            if born is None:
                born = self._incarnations.get(queue)
                if born is None:
                    try:
                        born = self._incarnations[queue] = incarnation(prefix + queue)
                    except OSError:
                        return False  # the caller's own commit says what is wrong
                queues[queue] = born
            pieces += record_pieces(queue, "@" + name, data, born)
        published: list[str] = []
        try:
            appended = self._append(pieces)
            if appended is None:
                return False  # closed: the caller's own flush (no journal left behind)
            journal, end = appended
            try:
                self._flush(journal, end)
                for f in files:
                    f.publish()
                    published.append(f.final_path)
                self._check_incarnations(queues)
            finally:
                with self._cond:
                    journal.inflight -= 1
                    if not journal.inflight:
                        self._cond.notify_all()
        except OSError as exc:
            for f in files:
                f.discard()
            for path in published:  # all or nothing, as GroupCommit.commit
                try:
                    os.unlink(path)
                except OSError:
                    pass
            if exc.errno == errno.ENOENT:
                raise QueueNotFound(
                    "the queue was deleted while messages were being stored"
                ) from exc
            raise storage_error(exc, "storing new messages") from exc
        return True

    def _check_incarnations(self, queues: dict[str, str]) -> None:
        """After a group's files are named: each queue is still the creation its records name
        (incarnation.py), known since before they were appended, so the files are in it. One
        that is not (deleted and created again since this Store last published into it, or
        while the files were named, by path: into either creation) has its files flushed
        here, with the whole filesystem: a replay skips records of another creation than the
        queue's. FileNotFoundError if a queue is gone (deleted meanwhile)."""
        stale = False
        for queue, born in queues.items():
            try:
                now = incarnation(self._prefix + queue)
            except FileNotFoundError:
                self._incarnations.pop(queue, None)
                raise
            if now != born:
                self._incarnations[queue] = now
                stale = True
        if stale:
            _flush_root(self.root)

    def forget(self, queue: str) -> None:
        """`queue` was deleted through this Store: its next creation is another incarnation."""
        self._incarnations.pop(queue, None)

    def _on_root_device(self, queue: str) -> bool:
        """Whether `queue`'s directory is on the root's filesystem, the one a checkpoint's
        `syncfs` flushes (a queue may be a mount point of another disk): asked once a queue."""
        known = self._devices.get(queue)
        if known is None:
            try:
                device = os.stat(self._prefix + queue).st_dev
            except OSError:
                return False  # the caller's own commit says what is wrong
            known = self._devices[queue] = device == self._device
        return known

    def _append(self, pieces: list[bytes]) -> tuple[_File, int] | None:
        """Append `pieces` to the current file (made at first use): the file and its end after
        them, counted in flight; None once `close` began (a file made then would have no
        checkpoint to remove it). On failure the file is truncated back (or, if that fails too,
        left for a new one) and the error raised."""
        with self._cond:
            if self._stopping or not self.enabled:  # closing, or a checkpoint failed
                return None
            journal = self._current
            if journal is None:
                try:
                    journal = self._current = self._open_file(first=True)
                except OSError:  # no journal to be had (EMFILE, a full disk): the caller's
                    return None  # own flush, which meets what is wrong itself if it lasts
            start = journal.appended
            try:
                _write_all(journal.fd, pieces)
            except OSError:
                try:
                    os.ftruncate(journal.fd, start)
                except OSError:  # a torn record stays: replay stops there, so start afresh
                    self._retire_current()
                raise
            journal.appended = end = start + sum(map(len, pieces))
            journal.inflight += 1
            if end >= CHECKPOINT_BYTES:
                self._wake.notify()
            return journal, end

    def _flush(self, journal: _File, end: int) -> None:
        """`fdatasync` `journal` up to at least `end`, once for every group appended meanwhile."""
        with journal.sync_lock:
            if journal.durable >= end:
                return
            if journal.error is not None:
                raise OSError(journal.error.errno, journal.error.strerror)
            target = journal.appended  # what is written now: every waiter's up to here
            try:
                os.fdatasync(journal.fd)
            except OSError as exc:
                with self._cond:
                    journal.error = exc
                    try:  # the records that failed are not counted: gone from the file
                        os.ftruncate(journal.fd, journal.durable)
                        os.fdatasync(journal.fd)  # and from the disk, which may hold part
                    except OSError:  # of them (a replay after a crash would bring them back)
                        pass
                    if journal is self._current:
                        self._retire_current()
                raise
            journal.durable = max(journal.durable, target)

    def _open_file(self, *, first: bool = False) -> _File:
        """A new journal file, its header and its name durable. The first of a Store marks the
        root format 6 first (an older process then refuses the root) and starts the checkpoints."""
        if first:
            marker.mark_journaled(self.root, self._access)
            if not os.path.isdir(self.dir):
                self._access.makedirs(self.dir)
                fsync_dir(self.root)  # its name durable, as every journal's in it will be
        if self._root_fd is None:
            self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            _open_journals.add(self)  # its descriptors closed at exit, and in a forked child
        token = current().token()
        path = os.path.join(self.dir, file_name(token, next(_numbers)))
        fd = self._access.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        try:
            head = header(self._boot, f"{token}.{image()}")
            _write_all(fd, [head])
            os.fdatasync(fd)
            fsync_dir(self.dir)
            if first:  # marked again before any record: a process that rewrites the marker
                # whole (`dirmq init`, an earlier version) may have read it before our mark
                marker.mark_journaled(self.root, self._access)
        except BaseException:
            os.close(fd)
            try:
                os.unlink(path)
            except OSError:
                pass
            raise
        if first and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="dirmq-journal-checkpoint", daemon=True
            )
            self._thread.start()
        return _File(path, fd, len(head), len(head), durable=len(head))

    def _retire_current(self) -> None:
        """(Under the lock.) Leave the current file to the next checkpoint; appends go to a new
        one, made at the next append."""
        if self._current is not None:
            self._retired.append(self._current)
            self._current = None

    # -- checkpoints ------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                deadline = time.monotonic() + CHECKPOINT_S
                while not self._stopping:
                    current = self._current
                    if current is not None and current.appended >= CHECKPOINT_BYTES:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._wake.wait(remaining)
                if self._stopping:
                    return
                current = self._current
                empty = current is not None and current.appended == current.empty_at
                idle = (current is None or empty) and not self._retired
                if idle and current is None:  # no journal: the thread ends (the next
                    self._thread = None  # journal file starts another), so a Store left
                    # unclosed costs no thread waking each second, nor a descriptor (every
                    # record is flushed: the next first file opens the root again)
                    fd, self._root_fd = self._root_fd, None
                    if fd is not None:
                        os.close(fd)
                    return
            try:
                if not idle:
                    self.checkpoint()
                elif empty:  # a second without a publish: no journal kept open (the next
                    self.checkpoint(last=True)  # publish makes one), nothing to recover
            except OSError as exc:  # the journal stays: the next checkpoint tries again
                self.last_error = exc

    def checkpoint(self, *, last: bool = False) -> None:
        """Switch to a new file (none if `last`), wait for the groups publishing from the old
        ones, `syncfs` the root, remove the old files. Raises OSError (files kept) on failure."""
        # A current file with no record is kept, not switched for another: a checkpoint
        # retrying a failed syncfs each second would otherwise leave a file each time.
        with self._cond:
            current = self._current
            keep = not last and current is not None and current.appended == current.empty_at
        fresh = None
        if not last and not keep:
            try:
                fresh = self._open_file()
            except OSError as exc:  # checkpointed all the same (a journal left to grow,
                self.last_error = exc  # never switched away from, is never removed): the
                # next append makes a file, or takes its own flush
        with self._cond:
            if not keep:
                self._retire_current()
                self._current = fresh
            while any(j.inflight for j in self._retired):
                self._cond.wait()
            covered = list(self._retired)
        if not covered:
            return
        dead = self._dead_journals()  # judged before the syncfs, which then covers them too
        if self._root_fd is None:  # (a file is made only once it is open)
            self._root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            syncfs(self._root_fd)
        except OSError:
            self._keep_unflushed()
            raise
        removed: list[_File] = []
        try:
            for journal in covered:
                _close(journal)
                try:
                    os.unlink(journal.path)
                except FileNotFoundError:
                    pass
                removed.append(journal)  # (one whose unlink failed stays: the next tries)
        finally:
            with self._cond:
                self._retired = [j for j in self._retired if j not in removed]
        for path in dead:
            try:
                os.unlink(path)
            except OSError:
                pass  # another process recovered it, or may (its own checkpoint goes on)
        fsync_dir(self.dir)  # a removal lost to a crash would replay acknowledged consumption
        self.checkpoints += 1

    def _keep_unflushed(self) -> None:
        """A checkpoint's `syncfs` failed: some file a journal covers may never reach the disk,
        and the kernel reports that error once (a retry would succeed). So every journal file
        of this Store is kept, renamed `unflushed.<name>` (never removed by a checkpoint or a
        same-boot recovery; replayed after a reboot: FORMAT.md), and the journal is off for
        this Store from now on: each group takes its own flush, whose errors are its own."""
        with self._cond:
            self.enabled = False
            self._retire_current()
            while any(j.inflight for j in self._retired):
                self._cond.wait()
            kept, self._retired = self._retired, []
        # Every file, whatever fails on this disk meanwhile (the caller raises the syncfs's
        # error): one error here left the rest open, under the names of a live process.
        for journal in kept:
            _close(journal)
            name = os.path.basename(journal.path)
            empty = journal.appended == journal.empty_at  # no record: nothing it could lose
            try:
                if empty:
                    os.unlink(journal.path)
                else:
                    os.rename(journal.path, os.path.join(self.dir, f"{UNFLUSHED}.{name}"))
            except FileNotFoundError:
                pass
            except OSError:  # under this process's name, it would be judged a dead process's
                if not empty:  # once this one is (flushed and removed): marked kept instead
                    mark_unflushed(journal.path)
        try:
            fsync_dir(self.dir)
        except OSError:
            pass
        keep_dead_unflushed(self.root)  # what dead processes' journals cover is as unsure

    def _dead_journals(self) -> list[str]:
        """The journals of other processes that died in this boot, every `OTHERS_S` (else
        none): this checkpoint's `syncfs` flushes what they cover, so they go with its own.
        Left until the next opener, a dead publisher's journal would outlive every ack it
        covers, and a machine crash later replay all of them (not the last second's)."""
        now = time.monotonic()
        if now < self._others_at:
            return []
        self._others_at = now + OTHERS_S

        try:
            judged = judge_all(self.root)
        except OSError:  # another user's journal: its recovery is its user's, not a failure
            return []  # of this checkpoint, which must remove this Store's own journals
        return [os.path.join(self.dir, j.name) for j in judged if j.verdict is Verdict.DEAD]

    def close(self) -> None:
        """A last checkpoint: every journal of this Store flushed and removed (kept, for the next
        opener to flush, if that fails); a group committed after it is flushed by the caller
        (`commit` declines). Nothing in a forked child: the journal is its parent's
        (and a lock a parent's thread held at the fork stays held)."""
        if self._forked:
            return
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            self._wake.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        try:
            self.checkpoint(last=True)
        except OSError as exc:
            self.last_error = exc
        with self._cond:
            fd, self._root_fd = self._root_fd, None
        if fd is not None:
            os.close(fd)

    def _drop_in_child(self) -> None:
        """In a forked child, at once: close the parent's descriptors it copied (the child
        never uses them: `commit` declines there). Held open, a journal file the parent's
        checkpoint removes kept its blocks on the disk for the child's life, and stayed open
        for writing (no read-only remount). Takes no lock: a parent's thread may have held it
        at the fork."""
        files = [*self._retired, *([self._current] if self._current is not None else [])]
        fds = [f.fd for f in files if f.fd >= 0]
        if self._root_fd is not None:
            fds.append(self._root_fd)
        self._current, self._retired, self._root_fd, self._thread = None, [], None, None
        self.enabled = False
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass


_open_journals: weakref.WeakSet[Journal] = weakref.WeakSet()
_every_journal: weakref.WeakSet[Journal] = weakref.WeakSet()  # open or not: for `_after_fork`


def _after_fork() -> None:
    """In a forked child every journal made before the fork is its parent's: no append, no
    checkpoint (a flag, not a getpid(2) at every commit), and no descriptor of it kept."""
    for journal in list(_every_journal):
        journal._forked = True
    for journal in list(_open_journals):
        journal._drop_in_child()


os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def _close_at_exit() -> None:
    """A process that exits without closing its Store leaves no journal for others to flush
    (a crash or SIGKILL does: the next opener's, journal_replay.py)."""
    for journal in list(_open_journals):
        journal.close()


def _flush_root(root: str) -> None:
    """`syncfs` through a descriptor of its own: an error it sees is still reported to the
    checkpoint's (each descriptor is told of an error once, from its open on)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


def _close(journal: _File) -> None:
    """Close a journal file's descriptor, once: a checkpoint whose unlink of it failed tries
    again later, and a fork meanwhile closes what is still open (`_drop_in_child`), so its
    number, free then and soon another file's, is forgotten before it is closed."""
    fd, journal.fd = journal.fd, -1
    if fd >= 0:
        os.close(fd)


def _write_all(fd: int, pieces: list[bytes]) -> None:
    """`writev` of every piece, IOV_MAX at a time (a group of 400 messages is 1,200 pieces)."""
    for start in range(0, len(pieces), _IOV_MAX):
        chunk = pieces[start : start + _IOV_MAX]
        written = os.writev(fd, chunk)
        total = sum(map(len, chunk))
        if written < total:  # rare (a signal, a full disk): the rest as one buffer
            rest = memoryview(b"".join(chunk))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]
