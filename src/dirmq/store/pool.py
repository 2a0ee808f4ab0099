"""Recycling message files instead of creating and unlinking one per message.

Why: creating an inode is the most expensive step of a put on ext4 under a queue's churn (the
allocator avoids and re-checks recently freed inodes: 0.3-1 ms per create measured here, against
~10 µs to reopen and overwrite an existing file), and an unlink costs more than a rename. So a
message that leaves the queue for good (ack, delete, purge, retention) is renamed into `@free/`
and a later put overwrites it and publishes it exactly like a new file (flush, then rename into
`@ready/`).

Two pools per queue:
- the process's own pool, `@free/<process>-<nonce>/` (processes.py): a directory only this
  process touches while it lives, so a put overwrites one of its files in place and publishes it
  with a single rename (no claim rename: nobody else can take it). One per process and queue
  (shared by every `Store` of the process; a forked child starts its own).
- the shared pool, the plain files of `@free/`: what the own pools cannot keep, and the pools of
  dead processes. A put claims one by renaming it into `@tmp/` (the loser of a race gets ENOENT
  and tries the next name), then overwrites it.

The own pools and their reaper thread are ownpool.py (how a retirement reaches a blank file a
put may take); the pools of dead processes are reclaimed by poolreclaim.py; what a recycled
file may be (its size, its blanking, the space rule) is recycled.py. This module is the
queue's view of its `@free/`: retirements, the shared pool and its claims, and the space
checks. A retirement costs its caller one rename into the own pool; if the reaper falls
`MAX_UNREAPED` files behind, retirements unlink on the caller's path instead, so the own pool
never holds more than `OWN_POOL_FILES + MAX_UNREAPED` files whatever the rate of acks.

Nothing here is ever visible as a message: `@free/` holds zeros (the own pool of a live process
also unreaped files, which only it touches), and a file being overwritten is published like a
new file. With `writethrough` that is once its new content is durable, so a crash
mid-overwrite leaves garbage in a pool (or an orphan temp file that recovery removes). With
`writeback`/`memory` the rename may reach the disk before the data, leaving the file's old
content (zeros, or an acknowledged message whose blanking had not reached the disk either) under
the new name: its `Dirmq-Id` is not the new message's, so readers treat it as corrupt
(codec.py), never deliver it again.

Only files of at most `MAX_RECYCLED_BYTES` are kept, at most `capacity` shared and
`OWN_POOL_FILES` own per queue and process, so the pools never hold much disk.

Space first. While the filesystem is short of space or inodes (under `SHORT_FREE_FRACTION`
free, checked at most once per `SPACE_CHECK_INTERVAL_S`, by the reaper while things go well),
a retired file is unlinked instead: at a full disk, draining a queue must give its space back,
not park it in `@free`. A recycling step that fails (ENOSPC when `@free` or a new pool directory
must grow, EMFILE, ...) falls back to the unlink too, so an ack never fails for want of space;
on ENOSPC this process's pools are emptied at once (`release_space`), unreaped files included.

Why it is long: `FilePool` is the one handle on a queue's @free that retirements, puts and the
reaper all go through, and what it knows (the shared pool as last listed, the space check) is
shared by its retirements and its claims; split, each half would keep its own copy.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence

from dirmq.store import layout, ownpool
from dirmq.store.filemodes import Access
from dirmq.store.fsio import DirHandle, PendingFile, overwrite_pending
from dirmq.store.ownpool import (
    OWN_POOL_FILES,
    OwnPool,
    deferred_reaping,
    drop_own_pools,
    own_pool,
    own_pools,
    reap_some,
)
from dirmq.store.recycled import DEFAULT_POOL_FILES, NO_SPACE, space_short, unlink_quietly

# A drain keeps the files it frees for the puts that follow, up to the queue's depth when the
# drain began (`FilePool.note_depth`) within these bounds; the surplus beyond `OWN_POOL_FILES`
# goes once the pool has been idle `TRIM_IDLE_S` (ownpool.py). A larger bound
# makes a longer drain cheaper (262,144: two processes draining 100,000 messages each by name
# ran at ~32,000 msg/s on the disk instead of ~23,000, docs/benchmarks-spark.md, session 8),
# but what is kept is unlinked at exit, or by whoever next opens the queue after a kill
# (`reclaim_pools`), ~60-130 µs a file on that disk: 65,536 bounds that stall to seconds.
DRAIN_KEEP_FILES = 65_536
DRAIN_KEEP_BYTES = 256 * 1024 * 1024
MAX_UNREAPED = 1024  # retired files waiting for the reaper (in hand too); then retirements unlink
# Inside `reaping_here`, past this many unreaped files the reaper thread is woken after all: a
# batch of thousands (the Spark source's) is reaped alongside, not unlinked past MAX_UNREAPED.
DEFER_UNREAPED = 256
RELIST_INTERVAL_S = 1.0  # after a listing of @free that found nothing
# How often a shared pool this process counts as full is listed to check (`FilePool.full`):
# a listing of 1,024 names costs well under a millisecond, and between two, a consumer hands
# on at most what publishers took since the last one.
FULL_RECHECK_S = 0.1
SPACE_CHECK_INTERVAL_S = 1.0


class FilePool:
    """The `@free/` directory of one queue, as this process knows it."""

    def __init__(
        self,
        free_dir: str,
        access: Access,
        capacity: int = DEFAULT_POOL_FILES,
        *,
        shared: bool = False,
        tmp_dir: str | None = None,
    ) -> None:
        """`shared`: the shared-filesystem mode (`QueueContext.shared`): nothing is recycled,
        a retired file is renamed to a temp name of ours in `tmp_dir` and unlinked there."""
        self.dir = free_dir
        self.shared = shared
        self._tmp_dir = tmp_dir or os.path.join(os.path.dirname(free_dir), layout.TMP)
        self._access = access  # for this process's own pool directory
        self._capacity = capacity
        self._known: list[str] = []  # shared pool files, as last listed
        self._lock = threading.Lock()
        self._listed_at = 0.0
        self._full_listed_at = 0.0  # when `full` last listed the pool to check its count
        self._short = False  # the filesystem was short of space when last checked
        self._space_checked_at = -SPACE_CHECK_INTERVAL_S

    def retire(self, path: str, message_id: str) -> None:
        """Remove the message file at `path` for good (FileNotFoundError if it is already gone).

        One rename into this process's own pool, where the reaper blanks it later and keeps
        it, hands it on or unlinks it; unlinked at once instead while the filesystem is short
        of space, when the reaper is `MAX_UNREAPED` behind, or when the rename fails (an ack
        never fails for want of space). Only the unlink's errors propagate.

        In the shared-filesystem mode, `retire_unshared` instead."""
        if self.shared:
            self.retire_unshared(path, message_id)
            return
        # The space check itself is the reaper's while recycling goes on: none on this path.
        if self._short and self.short_of_space():
            os.unlink(path)  # no space to spare
            return
        own = own_pool(self.dir)
        if own.behind() >= MAX_UNREAPED:
            os.unlink(path)  # the reaper is behind: the pool must not grow without bound
            return
        try:
            if self._retire_own(own, path, message_id):
                return
        except FileNotFoundError:
            raise
        except OSError as exc:  # recycling is an optimisation: never a reason to fail an ack
            if exc.errno in NO_SPACE:
                self.release_space()
        os.unlink(path)

    def retire_many(self, directory: str, names: Sequence[str]) -> dict[str, OSError]:
        """`retire` of the files `names` in `directory`, each named for its message (its id is
        the name's first `layout.ID_LENGTH` characters): the failures by name,
        FileNotFoundError for a file already gone. Nothing is raised.

        One pass for the batch: a rename each, relative to the open directories, and the own
        pool's lock taken once, not per file. A file whose rename fails, and a batch that
        would not be recycled anyway (shared filesystem, short of space, the reaper behind),
        takes `retire`'s way, with its rules unchanged."""
        if len(names) < 2:  # no directory to open for one file
            return self._retire_each(directory, names)
        own = None if self.shared or self._short else own_pool(self.dir)
        handle = None
        if own is not None and own.behind() + len(names) < MAX_UNREAPED:
            try:
                handle = self._own_handle(own)
            except OSError:  # no pool directory to be had (ENOSPC, EMFILE): `retire` unlinks
                handle = None
        if own is None or handle is None:
            return self._retire_each(directory, names)
        try:
            source = DirHandle(directory)
        except OSError:
            return self._retire_each(directory, names)  # its errors, file by file
        failures: dict[str, OSError] = {}
        retired: list[str] = []
        rename, source_fd, target_fd, id_length = os.rename, source.fd, handle.fd, layout.ID_LENGTH
        for name in names:
            try:
                rename(name, name[:id_length], src_dir_fd=source_fd, dst_dir_fd=target_fd)
            except OSError:
                # Gone, our pool directory removed, a full disk: `retire` knows what each means.
                failures.update(self._retire_each(directory, [name]))
                continue
            retired.append(name[:id_length])
        if retired:
            self._hand_to_reaper(own, handle, retired)
        return failures

    def _hand_to_reaper(self, own: OwnPool, handle: DirHandle, names: list[str]) -> None:
        """`names`, just renamed into the own pool open as `handle`, wait for the reaper (or
        for the end of `reaping_here`); unlinked at once if the directory was found gone
        meanwhile (nobody would reap them)."""
        with own.lock:
            kept = own.handle is handle
            if kept:
                own.unreaped.extend(names)
                own.touched_at = time.monotonic()
        if not kept:
            for name in names:
                unlink_quietly(name, handle)
            return
        deferred = deferred_reaping.pools
        if deferred is not None and len(own.unreaped) < DEFER_UNREAPED:
            deferred.add(self.dir)  # reaped at the end of `reaping_here`
        else:
            ownpool.reaper.poke()

    def _retire_each(self, directory: str, names: Sequence[str]) -> dict[str, OSError]:
        failures: dict[str, OSError] = {}
        for name in names:
            try:
                self.retire(f"{directory}/{name}", name[: layout.ID_LENGTH])
            except OSError as exc:
                failures[name] = exc
        return failures

    def retire_unshared(self, path: str, message_id: str) -> None:
        """Remove the file at `path` for good on a shared filesystem (FileNotFoundError if it
        is gone): never recycled, since another host's client may still serve its old bytes
        for a recycled inode (docs/FORMAT.md, "Filesystems"). First an exclusive rename to a
        temp name of this process in @tmp: only it says whether the file was still ours (an
        `unlink` by a name another host renamed away may succeed and remove nothing); then
        the unlink of the name we have just given it. A crash in between leaves an orphan
        temp file, which recovery removes like any other."""
        doomed = os.path.join(self._tmp_dir, layout.tmp_name(message_id))
        os.rename(path, doomed)
        try:
            os.unlink(doomed)
        except FileNotFoundError:
            pass  # another thread of ours retiring the same id: it is gone either way

    def short_of_space(self) -> bool:
        """`space_short` for this pool's filesystem, asked at most once per
        `SPACE_CHECK_INTERVAL_S`; when it turns short, the pools give their files back."""
        now = time.monotonic()
        if now - self._space_checked_at >= SPACE_CHECK_INTERVAL_S:
            self._space_checked_at = now
            short = space_short(self.dir)
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

    # `full` and `known_more` take no lock: the reaper calls them, and a child forked while it
    # held this pool's lock would inherit the lock held for good. len() and append() are atomic
    # (an append racing a relist that replaces the list is lost: `_known` is an estimate).
    def full(self) -> bool:
        """Whether the shared pool holds `capacity` files, as far as this process knows. A
        count that says full is checked against a listing, at most once per
        `FULL_RECHECK_S`: other processes' puts take files out of the pool without telling
        this one, and a process that only consumes would otherwise call it full for good after
        its first `capacity` hand-offs, and unlink every file it retires from then on (while
        the publishing processes create new ones)."""
        if len(self._known) < self._capacity:
            return False
        now = time.monotonic()
        if now - self._full_listed_at < FULL_RECHECK_S:
            return True
        self._full_listed_at = now
        try:
            with os.scandir(self.dir) as entries:
                listed = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:
            return True
        self._known = listed[: self._capacity]  # replaced whole: see `claim`
        return len(listed) >= self._capacity

    def room(self) -> int:
        """How many more files the shared pool takes, as far as this process knows."""
        return self._capacity - len(self._known)

    def note_depth(self, ready: int) -> None:
        """The queue holds `ready` messages: a drain may keep as many of the files it frees
        (bounded by `DRAIN_KEEP_FILES`, `DRAIN_KEEP_BYTES`), for the puts that follow to
        overwrite instead of creating inodes; cheap when nothing changes."""
        if ready <= OWN_POOL_FILES or self.shared:
            return
        own = own_pool(self.dir)
        wanted = min(ready, DRAIN_KEEP_FILES)
        if wanted <= own.keep:
            return
        # Keeping costs no more disk than the queue uses now, but a drain must still give the
        # space back where it is scarce: no more than a tenth of what is free now.
        try:
            st = os.statvfs(self.dir)
            spare = st.f_bavail * st.f_frsize // 10
        except OSError:
            spare = 0
        with own.lock:
            if wanted > own.keep:
                own.keep = wanted
                own.keep_bytes = min(DRAIN_KEEP_BYTES, spare)

    def reap_here(self) -> None:
        """Blank (keep, hand on or unlink) what this process retired in this queue, on the
        calling thread and now: for a caller that has just retired a batch outside any lock
        (`Queue.ack_many`), which saves the reaper thread's wake-up and GIL turns per batch."""
        own = None if self.shared else own_pools.get(self.dir)
        if own is not None and own.unreaped:
            reap_some(own, None, None)

    @contextlib.contextmanager
    def reaping_here(self) -> Iterator[None]:
        """Retirements on this thread inside the block wake no reaper thread; at its end (call
        it outside the queue's lock) this queue's are reaped here (`reap_here`), and the
        reaper is woken only for another queue's. A wake-up per ack cost a thread switch and
        GIL turns each: `strace` of a GET + DELETE drain showed 2.5 futex calls a message."""
        outer = deferred_reaping.pools
        if outer is not None:  # nested: the outermost block reaps
            yield
            return
        deferred_reaping.pools = set()
        try:
            yield
        finally:
            pools, deferred_reaping.pools = deferred_reaping.pools, None
            self.reap_here()
            if pools - {self.dir}:
                ownpool.reaper.poke()

    def known_more(self, name: str) -> None:
        """This process put `name` into the shared pool."""
        self._known.append(name)

    def _retire_own(self, own: OwnPool, path: str, message_id: str) -> bool:
        """Rename `path` into this process's own pool as `message_id`, for the reaper; False
        (nothing done) if there is no pool directory."""
        for _attempt in range(2):  # a pool directory removed (by hand?) is made again once
            handle = self._own_handle(own)
            if handle is None:
                return False
            try:
                os.rename(path, message_id, dst_dir_fd=handle.fd)
            except FileNotFoundError:
                if not os.path.lexists(path):
                    raise
                own.forget(handle)
                continue
            self._hand_to_reaper(own, handle, [message_id])
            return True
        return False

    def _own_handle(self, own: OwnPool) -> DirHandle | None:
        """The open own pool directory, made on first use; None if there can be none."""
        with own.lock:
            if own.sink is None:
                own.sink = self
            if own.handle is None:
                try:
                    self._access.mkdir(own.dir)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    return None  # no @free (an older queue, or the queue is going away)
                try:
                    own.handle = DirHandle(own.dir)
                except FileNotFoundError:
                    return None
            return own.handle

    def overwrite_own(self, final_path: str, data: bytes) -> PendingFile | None:
        """A file of this process's own pool, overwritten with exactly `data`, to be published
        as `final_path` (a rename, like a temp file); None if the own pool is empty (always in
        the shared-filesystem mode). On a write error the file is removed and the error
        propagates."""
        if self.shared:
            return None
        own = own_pool(self.dir)
        with own.lock:
            if not own.files or own.handle is None:
                return None
            name, size = own.files.pop()
            own.kept_bytes -= size
            own.touched_at = time.monotonic()
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
        """Move a shared pool file to `tmp_path` for overwriting; False if the pool is empty
        (always in the shared-filesystem mode: another host may still read its old bytes)."""
        if self.shared:
            return False
        while True:
            with self._lock:
                if not self._known and not self._relist():
                    return False
                try:
                    name = self._known.pop()
                except IndexError:  # `full` replaced the list meanwhile (it takes no lock)
                    continue

            try:
                os.rename(os.path.join(self.dir, name), tmp_path)
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
            with os.scandir(self.dir) as entries:
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
            with os.scandir(self.dir) as entries:
                names = [e.name for e in entries if e.is_file(follow_symlinks=False)]
        except OSError:  # gone, or unreadable now (a failing disk): nothing to trim
            return 0
        for name in names[keep:]:
            try:
                os.unlink(os.path.join(self.dir, name))
                removed += 1
            except OSError:
                pass
        with self._lock:
            self._known = []
            self._listed_at = 0.0
        return removed

    def own_files(self) -> int:
        """How many files this process's own pool holds (for tests and stats)."""
        own = own_pool(self.dir)
        with own.lock:
            return len(own.files)
