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

A batch of acks (`Queue.ack_many`, `ack_leases`: what the server and the Spark source use)
reaps its own files right after its renames, outside the queue's lock, on its own thread
(`FilePool.reaping_here`), and its renames do not wake the reaper thread at all: on a 2-worker
server a stream drain ran 1.6x faster than with the reaper thread woken per batch, contending
for the GIL. Otherwise a retirement costs its caller
one rename: into the own pool, where no other process may touch
the file (before that rename another process may still move it, e.g. requeue an expired lease,
so nothing may be done to it earlier). Everything else happens on this process's reaper thread
(`_Reaper`, one per process, woken when a retirement queues work, in batches of `REAP_BATCH`):
it looks at the file (one name, small), blanks it (overwrites it with zeros, `_blank`: an
acknowledged message is not left readable) and keeps it, up to `OWN_POOL_FILES`, or hands it,
blank, to the shared pool, or, both being full, unlinks it (without looking: the common case of
a long drain costs the reaper one unlink). Until the reaper gets to it a file is "unreaped":
its bytes are the acknowledged message's, normally for well under a second. If the reaper falls
`MAX_UNREAPED` files behind, retirements unlink on the caller's path instead, so the own pool
never holds more than `OWN_POOL_FILES + MAX_UNREAPED` files whatever the rate of acks.

A drain keeps what it frees: a get notes the queue's depth (`FilePool.note_depth`), and the
own pool may then keep that many blank files (at most `DRAIN_KEEP_FILES`, and a tenth of the
filesystem's free space then, in bytes) instead of `OWN_POOL_FILES`: the puts that follow
overwrite them instead of creating inodes, and a drain on a disk where an unlink is dear (ext4
with `discard`: more than the rest of an ack) unlinks nothing per message. The reaper unlinks the
surplus once the pool has been idle `TRIM_IDLE_S` (`_trim_some`); exiting, a process unlinks what
the shared pool has no room for.

Why a put reuses only blanked files, never an unreaped one (though overwriting it with the new
content, then truncating, would also destroy the old bytes, and skip the blanking): (1) the
reaper's look at the file is what makes it safe to overwrite: a file with a second name may be
a published message's inode (see `reclaim_pool`), and an unreaped file has not been looked at;
a put that looked itself would put that syscall back on some caller's path; (2) a blanked file
keeps its length, which the pool records, so a put that is no shorter needs no `ftruncate`;
(3) the reaper and a put never touch the same file: a put takes files only from `files`, the
reaper only from `unreaped`, each under the pool's lock; (4) a crash leaves nothing new: a
file a put is overwriting holds zeros or the new message, as before. When puts outrun the
reaper they make new files, which is what they would do with an empty pool anyway.

Nothing here is ever visible as a message: `@free/` holds zeros (the own pool of a live process
also unreaped files, which only it touches), and a file being overwritten is published like a
new file. With `writethrough` that is once its new content is durable, so a crash
mid-overwrite leaves garbage in a pool (or an orphan temp file that recovery removes). With
`writeback`/`memory` the rename may reach the disk before the data, leaving the file's old
content (zeros, or an acknowledged message whose blanking had not reached the disk either) under
the new name: its `Dirmq-Id` is not the new message's, so readers treat it as corrupt
(codec.py), never deliver it again.

The pool of a dead process is reclaimed by `reclaim_pools` (on queue open, by sweep and by
fsck): its blank files go back to the shared pool, and the others (unreaped, or half
overwritten when it died) are unlinked, never handed on. A process that exits normally stops
its reaper, reaps what is left itself and hands its own pools to the shared ones
(`release_own_pools`). Only files of at most `MAX_RECYCLED_BYTES` are kept, at most `capacity`
shared and `OWN_POOL_FILES` own per queue and process, so the pools never hold much disk.

Space first. While the filesystem is short of space or inodes (under `SHORT_FREE_FRACTION`
free, checked at most once per `SPACE_CHECK_INTERVAL_S`, by the reaper while things go well),
a retired file is unlinked instead: at a full disk, draining a queue must give its space back,
not park it in `@free`. A recycling step that fails (ENOSPC when `@free` or a new pool directory
must grow, EMFILE, ...) falls back to the unlink too, so an ack never fails for want of space;
on ENOSPC this process's pools are emptied at once (`release_space`), unreaped files included.

Why it is long: both pools (this process's own and the shared one), their claims, the reaper,
the reclaiming of a dead process's pool and the space rules share one set of invariants about
which file may be overwritten by whom; apart, each part would have to re-check the others'.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import re
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum

from dirmq.store import layout
from dirmq.store.filemodes import Access
from dirmq.store.fsio import DirHandle, PendingFile, overwrite_pending
from dirmq.store.processes import Liveness, current, liveness, parse_token

MAX_RECYCLED_BYTES = 64 * 1024
DEFAULT_POOL_FILES = 1024
OWN_POOL_FILES = 256
# A drain keeps the files it frees for the puts that follow, up to the queue's depth when the
# drain began (`FilePool.note_depth`) within these bounds; the surplus beyond `OWN_POOL_FILES`
# goes once the pool has been idle `TRIM_IDLE_S` (see the module docstring). A larger bound
# makes a longer drain cheaper (262,144: two processes draining 100,000 messages each by name
# ran at ~32,000 msg/s on the disk instead of ~23,000, docs/benchmarks-spark.md, session 8),
# but what is kept is unlinked at exit, or by whoever next opens the queue after a kill
# (`reclaim_pools`), ~60-130 µs a file on that disk: 65,536 bounds that stall to seconds.
DRAIN_KEEP_FILES = 65_536
DRAIN_KEEP_BYTES = 256 * 1024 * 1024
TRIM_IDLE_S = 30.0
MAX_UNREAPED = 1024  # retired files waiting for the reaper (in hand too); then retirements unlink
REAP_BATCH = 64  # files the reaper handles per pool before it looks at the others again
# Inside `reaping_here`, past this many unreaped files the reaper thread is woken after all: a
# batch of thousands (the Spark source's) is reaped alongside, not unlinked past MAX_UNREAPED.
DEFER_UNREAPED = 256
REAP_GATHER_S = 0.002  # the reaper, woken, waits this long for more work to do at once
RELIST_INTERVAL_S = 1.0  # after a listing of @free that found nothing
# How often a shared pool this process counts as full is listed to check (`FilePool.full`):
# a listing of 1,024 names costs well under a millisecond, and between two, a consumer hands
# on at most what publishers took since the last one.
FULL_RECHECK_S = 0.1
SHORT_FREE_FRACTION = 0.05  # less free space or inodes than this: retired files are unlinked
SPACE_CHECK_INTERVAL_S = 1.0
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
log = logging.getLogger(__name__)
ORPHAN_POOL_GRACE_S = 3600.0  # a pool of another host: its owner is presumed dead after this

_ZEROS = memoryview(bytes(MAX_RECYCLED_BYTES))  # what a retired file is overwritten with
_POOL_DIR_RE = re.compile(r"(.+)-([0-9a-f]{8})")


def pool_dir_name() -> str:
    """This process's own pool directory name, `<process>-<nonce>` (processes.py: its identity;
    a fresh nonce each time: never reused)."""
    return f"{current().token()}-{os.urandom(4).hex()}"


class Owner(Enum):
    """Whose a pool directory is, as far as this process can tell."""

    ALIVE = "alive"  # its process runs (or might: another host, not old): leave it alone
    DEAD = "dead"  # its process is gone for sure: its files may be reused
    STALE = "stale"  # another host's, untouched for an hour: delete, never reuse (see below)
    UNKNOWN = "unknown"  # not a pool directory name


def pool_owner(name: str, path: str) -> Owner:
    match = _POOL_DIR_RE.fullmatch(name)
    # A pool's name has always carried all four fields (no earlier, shorter form).
    owner = parse_token(match.group(1)) if match and match.group(1).count(".") == 3 else None
    if owner is None:
        return Owner.UNKNOWN
    alive = liveness(owner)
    if alive is not Liveness.UNKNOWN:
        return Owner.ALIVE if alive is Liveness.ALIVE else Owner.DEAD
    # Liveness on another host (or in another pid namespace) cannot be checked; an owner
    # that is merely idle could still be overwriting a file it took, so its files are only
    # ever deleted (a put of its that loses its file fails), never handed to another writer.
    try:
        idle_s = time.time() - os.lstat(path).st_mtime
    except OSError:  # gone, or its age cannot be read now: judged again next time
        return Owner.ALIVE
    return Owner.STALE if idle_s > ORPHAN_POOL_GRACE_S else Owner.ALIVE


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
    """This process's pool in one queue: files it alone may overwrite.

    `files` are blank files a put may overwrite, with their sizes; `unreaped` are files renamed
    in by retirements that the reaper has not blanked yet (a put never takes those). Names are
    relative to `handle`, the open pool directory (None until the first retirement makes it,
    and again once it is found gone). All three change together, under `lock`. `sink` is the
    queue's `FilePool` that the reaper hands surplus files to (any of the process's will do).
    """

    dir: str
    files: list[tuple[str, int]] = field(default_factory=list)
    unreaped: list[str] = field(default_factory=list)
    handle: DirHandle | None = None
    sink: FilePool | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Bumped whenever the pool is emptied (space, a vanished directory): what the reaper had in
    # hand then is not kept, nor handed to the shared pool that was emptied too.
    epoch: int = 0
    # How many blank files a drain may keep beyond OWN_POOL_FILES: the queue's depth before it
    # (`FilePool.note_depth`); 0 again once the surplus is trimmed.
    keep: int = 0
    keep_bytes: int = 0  # and in bytes: a tenth of the filesystem's free space then, at most
    kept_bytes: int = 0  # the sizes of `files`, summed
    touched_at: float = 0.0  # monotonic time of the last retirement into it or take from it
    in_hand: int = 0  # files taken out of `unreaped` that the reaper has not handled yet

    def behind(self) -> int:
        """How many retired files wait for the reaper (read without the lock: an estimate)."""
        return len(self.unreaped) + self.in_hand

    def forget(self, handle: DirHandle) -> None:
        """The directory behind `handle` is gone: drop what we knew of it (once)."""
        with self.lock:
            if self.handle is handle:
                self.handle = None
                self.files.clear()
                self.kept_bytes = 0
                self.unreaped.clear()
                self.epoch += 1


_own_pools: dict[str, _OwnPool] = {}  # @free path -> this process's pool there
_own_lock = threading.Lock()


class _Reaper:
    """The thread that blanks, hands on or unlinks what retirements renamed into this
    process's own pools (see the module docstring). One per process, started by the first
    retirement; a daemon, stopped by `stop` (at exit) and never inherited by a forked child."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.busy = False  # a batch is out of `unreaped` and not handled yet

    def poke(self) -> None:
        """There is work: wake the thread (starting it the first time). Cheap when awake."""
        if self.thread is None:
            with self.lock:
                if self.thread is None and not self.stopping:
                    self.thread = threading.Thread(
                        target=self._run, name="dirmq-pool-reaper", daemon=True
                    )
                    self.thread.start()
        if not self.wake.is_set():
            self.wake.set()

    def _run(self) -> None:
        while not self.stopping:
            worked = False
            for pool in list(_own_pools.values()):
                if self.stopping:
                    return
                try:
                    worked |= _reap_some(pool, REAP_BATCH, self)
                except Exception:  # a bug: the files stay for reclaim_pools, retirements unlink
                    log.exception("the recycled-file reaper failed on %s", pool.dir)
            if worked:
                continue
            if any(_trim_some(pool) for pool in list(_own_pools.values())):
                continue
            self.wake.clear()  # before the last look: a retirement after it sets it again
            if not any(p.unreaped for p in list(_own_pools.values())):
                surplus = any(len(p.files) > OWN_POOL_FILES for p in list(_own_pools.values()))
                if self.wake.wait(TRIM_IDLE_S / 2 if surplus else None):
                    # Let the acks of a burst gather: one wake-up (and one turn of the GIL)
                    # for many files, instead of one per ack.
                    time.sleep(REAP_GATHER_S)

    def stop(self, timeout_s: float) -> None:
        """Stop the thread (after its current batch); the caller reaps what is left."""
        with self.lock:
            self.stopping = True
            thread = self.thread
        self.wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)


_reaper = _Reaper()


class _Deferred(threading.local):
    """Per thread: the own pools whose retirements inside `FilePool.reaping_here` did not wake
    the reaper (None outside such a block)."""

    pools: set[str] | None = None


_deferred = _Deferred()


def _reap_some(pool: _OwnPool, limit: int | None, reaper: _Reaper | None) -> bool:
    """Handle up to `limit` (None: all) unreaped files of `pool`; False if there were none.
    Never raises: what fails is unlinked, or left for `reclaim_pools` after this process."""
    with pool.lock:
        if not pool.unreaped or pool.handle is None or pool.sink is None:
            return False
        if limit is None or limit >= len(pool.unreaped):
            batch, pool.unreaped = pool.unreaped, []
        else:
            batch, pool.unreaped = pool.unreaped[:limit], pool.unreaped[limit:]
        handle, sink, epoch = pool.handle, pool.sink, pool.epoch
        pool.in_hand += len(batch)
        if reaper is not None:
            reaper.busy = True
    try:
        _reap_batch(pool, handle, sink, batch, epoch)
    finally:
        with pool.lock:
            pool.in_hand -= len(batch)
        if reaper is not None:
            reaper.busy = False
    return True


def _trim_some(pool: _OwnPool) -> bool:
    """Unlink up to `REAP_BATCH` blank files of `pool` beyond `OWN_POOL_FILES` once it has been
    idle `TRIM_IDLE_S` (what a drain kept and no put took); False if there was nothing to do."""
    with pool.lock:
        surplus = len(pool.files) - OWN_POOL_FILES
        if surplus <= 0 or time.monotonic() - pool.touched_at < TRIM_IDLE_S:
            return False
        handle = pool.handle
        if handle is None:
            return False
        cut = min(surplus, REAP_BATCH)
        batch, pool.files = pool.files[:cut], pool.files[cut:]  # the oldest first
        pool.kept_bytes -= sum(size for _name, size in batch)
        if surplus == cut:
            pool.keep = 0
    for name, _size in batch:
        _unlink_quietly(name, handle)
    return True


def _room(pool: _OwnPool, size: int) -> bool:
    """Whether `pool` keeps one more blank file of `size` bytes (call under its lock)."""
    if len(pool.files) < OWN_POOL_FILES:
        return True
    return len(pool.files) < pool.keep and pool.kept_bytes + size <= pool.keep_bytes


def _reap_batch(
    pool: _OwnPool, handle: DirHandle, sink: FilePool, names: list[str], epoch: int
) -> None:
    """Blank and keep each unreaped file of `names` in `pool`, or hand it on blank, or unlink
    it (`epoch`: the pool's when the files were taken from `unreaped`). What holds for the whole
    batch (room, space, the epoch) is looked at once, and the pool's lock taken once."""
    full = not _room(pool, 0) and sink.full()
    if full or pool.epoch != epoch or sink.short_of_space():
        for name in names:
            _unlink_quietly(name, handle)  # nowhere to keep them: no need to look at them
        return
    blanked: list[tuple[str, int]] = []
    lstat, is_regular, directory = os.lstat, stat.S_ISREG, handle.fd
    for i, name in enumerate(names):
        try:
            st = lstat(name, dir_fd=directory)
        except OSError:
            continue  # gone (our pool directory was removed), or unreadable: left to reclaim
        if not is_regular(st.st_mode) or st.st_nlink > 1 or st.st_size > MAX_RECYCLED_BYTES:
            _unlink_quietly(name, handle)  # a second name may be a message's: never blanked
            continue
        try:
            _blank(name, st.st_size, handle)
        except OSError as exc:
            _unlink_quietly(name, handle)
            if exc.errno in _NO_SPACE:
                sink.release_space()  # the pools are emptied: keep nothing of this batch
                for rest in names[i + 1 :]:
                    _unlink_quietly(rest, handle)
                break
            continue
        blanked.append((name, st.st_size))
    surplus: list[str] = []
    with pool.lock:
        current = pool.epoch == epoch  # else emptied meanwhile: the files go too
        keeping = current and pool.handle is handle
        for name, size in blanked:
            if keeping and _room(pool, size):
                pool.files.append((name, size))
                pool.kept_bytes += size
            else:
                surplus.append(name)
    for name in surplus:
        if current and not sink.full():  # ours is full: the shared pool takes it, blank
            try:
                os.rename(name, os.path.join(sink.dir, name), src_dir_fd=handle.fd)
            except OSError:
                pass
            else:
                sink.known_more(name)
                continue
        _unlink_quietly(name, handle)


def wait_reaped(timeout_s: float) -> bool:
    """Wait until this process's reaper has handled every retired file (for tests, and
    whoever must know the acknowledged bytes are gone); False if `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    # In this order: a batch is taken out of `unreaped` and marked busy in one lock hold.
    while any(p.unreaped for p in list(_own_pools.values())) or _reaper.busy:
        if time.monotonic() >= deadline:
            return False
        _reaper.poke()
        time.sleep(0.001)
    return True


def unreaped_files() -> int:
    """How many retired files of this process wait for the reaper (all queues; for tests)."""
    return sum(len(p.unreaped) for p in list(_own_pools.values()))


def _forget_own_pools() -> None:
    # A forked child must not write into its parent's pool: it starts its own, and its own
    # reaper (the parent's thread does not exist in the child).
    global _own_lock, _reaper
    _own_pools.clear()
    _own_lock = threading.Lock()
    _reaper = _Reaper()


def release_own_pool(free_dir: str) -> int:
    """Hand this process's own pool in `free_dir` over to the shared pool there; returns how
    many files moved. Files taken by puts in flight are not affected. Unreaped files are reaped
    first (blanked): nothing unblanked reaches the shared pool (a batch the reaper has in hand
    meanwhile goes there blank too, or is unlinked)."""
    pool = _own_pools.get(free_dir)
    if pool is None:
        return 0
    _reap_some(pool, None, None)
    with pool.lock:
        files, pool.files = pool.files, []
        pool.kept_bytes = 0
        pool.keep = 0
        unreaped, pool.unreaped = pool.unreaped, []
        handle, pool.handle = pool.handle, None
        sink = pool.sink
    if handle is None:
        return 0
    for name in unreaped:  # retired while we reaped (another thread, at exit): not blanked
        _unlink_quietly(name, handle)
    # What a drain kept beyond the shared pool's room is not handed on (nobody would trim it).
    room = max(DEFAULT_POOL_FILES if sink is None else sink.room(), 0)
    for name, _size in files[room:]:
        _unlink_quietly(name, handle)
    moved = 0
    for name, _size in files[:room]:
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
    """Unlink every file of this process's own pools (all queues: they share filesystems),
    unreaped ones included; returns how many. For a full disk, where the space matters more
    than the recycling."""
    dropped = 0
    for pool in list(_own_pools.values()):
        with pool.lock:
            files, pool.files = pool.files, []
            pool.kept_bytes = 0
            pool.keep = 0
            unreaped, pool.unreaped = pool.unreaped, []
            handle = pool.handle
            pool.epoch += 1
        if handle is None:
            continue
        for name in [n for n, _size in files] + unreaped:
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
    """Stop the reaper, then hand every own pool of this process over to the shared pools (run
    at exit: what a dead process leaves is reclaimed too, but only when someone next opens the
    queue)."""
    _reaper.stop(timeout_s=5.0)
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
        own = _own_pool(self.dir)
        if own.behind() >= MAX_UNREAPED:
            os.unlink(path)  # the reaper is behind: the pool must not grow without bound
            return
        try:
            if self._retire_own(own, path, message_id):
                return
        except FileNotFoundError:
            raise
        except OSError as exc:  # recycling is an optimisation: never a reason to fail an ack
            if exc.errno in _NO_SPACE:
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
        own = None if self.shared or self._short else _own_pool(self.dir)
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

    def _hand_to_reaper(self, own: _OwnPool, handle: DirHandle, names: list[str]) -> None:
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
                _unlink_quietly(name, handle)
            return
        deferred = _deferred.pools
        if deferred is not None and len(own.unreaped) < DEFER_UNREAPED:
            deferred.add(self.dir)  # reaped at the end of `reaping_here`
        else:
            _reaper.poke()

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
        own = _own_pool(self.dir)
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
        own = None if self.shared else _own_pools.get(self.dir)
        if own is not None and own.unreaped:
            _reap_some(own, None, None)

    @contextlib.contextmanager
    def reaping_here(self) -> Iterator[None]:
        """Retirements on this thread inside the block wake no reaper thread; at its end (call
        it outside the queue's lock) this queue's are reaped here (`reap_here`), and the
        reaper is woken only for another queue's. A wake-up per ack cost a thread switch and
        GIL turns each: `strace` of a GET + DELETE drain showed 2.5 futex calls a message."""
        outer = _deferred.pools
        if outer is not None:  # nested: the outermost block reaps
            yield
            return
        _deferred.pools = set()
        try:
            yield
        finally:
            pools, _deferred.pools = _deferred.pools, None
            self.reap_here()
            if pools - {self.dir}:
                _reaper.poke()

    def known_more(self, name: str) -> None:
        """This process put `name` into the shared pool."""
        self._known.append(name)

    def _retire_own(self, own: _OwnPool, path: str, message_id: str) -> bool:
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

    def _own_handle(self, own: _OwnPool) -> DirHandle | None:
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
        own = _own_pool(self.dir)
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
        own = _own_pool(self.dir)
        with own.lock:
            return len(own.files)
