"""This process's own pools of recycled files, and the reaper thread that blanks what
retirements rename into them (pool.py tells the whole story; this is its first pool).

A batch of acks (`Queue.ack_many`, `ack_leases`: what the server and the Spark source use)
reaps its own files right after its renames, outside the queue's lock, on its own thread
(`FilePool.reaping_here`), and its renames do not wake the reaper thread at all: on a 2-worker
server a stream drain ran 1.6x faster than with the reaper thread woken per batch, contending
for the GIL. Otherwise a retirement costs its caller
one rename: into the own pool, where no other process may touch
the file (before that rename another process may still move it, e.g. requeue an expired lease,
so nothing may be done to it earlier). Everything else happens on this process's reaper thread
(`Reaper`, one per process, woken when a retirement queues work, in batches of `REAP_BATCH`):
it looks at the file (one name, small), blanks it (overwrites it with zeros, `recycled.blank`: an
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
a published message's inode (see `poolreclaim.reclaim_pool`), and an unreaped file has not
been looked at; a put that looked itself would put that syscall back on some caller's path;
(2) a blanked file keeps its length, which the pool records, so a put that is no shorter needs
no `ftruncate`;
(3) the reaper and a put never touch the same file: a put takes files only from `files`, the
reaper only from `unreaped`, each under the pool's lock; (4) a crash leaves nothing new: a
file a put is overwriting holds zeros or the new message, as before. When puts outrun the
reaper they make new files, which is what they would do with an empty pool anyway.

A process that exits normally stops its reaper, reaps what is left itself and hands its own
pools to the shared ones (`release_own_pools`).

Why it is long: the own pool, its reaper and their hand-offs share one set of invariants
about which file may be overwritten by whom (a put takes only blank files, the reaper only
unreaped ones, each under the pool's lock); apart, each part would have to re-check the
other's.
"""

from __future__ import annotations

import atexit
import logging
import os
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Protocol

from dirmq.store.fsio import DirHandle
from dirmq.store.poolreclaim import pool_dir_name
from dirmq.store.recycled import (
    DEFAULT_POOL_FILES,
    MAX_RECYCLED_BYTES,
    NO_SPACE,
    blank,
    unlink_quietly,
)

OWN_POOL_FILES = 256
TRIM_IDLE_S = 30.0
REAP_BATCH = 64  # files the reaper handles per pool before it looks at the others again
REAP_GATHER_S = 0.002  # the reaper, woken, waits this long for more work to do at once
log = logging.getLogger(__name__)


class SharedPool(Protocol):
    """What the reaper needs of a queue's shared pool (pool.py's `FilePool`; a protocol, not
    an import: pool.py imports this module)."""

    dir: str

    def full(self) -> bool: ...
    def room(self) -> int: ...
    def known_more(self, name: str) -> None: ...
    def short_of_space(self) -> bool: ...
    def release_space(self) -> int: ...


@dataclass(slots=True)
class OwnPool:
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
    sink: SharedPool | None = None
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


own_pools: dict[str, OwnPool] = {}  # @free path -> this process's pool there
_own_lock = threading.Lock()


class Reaper:
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
            for pool in list(own_pools.values()):
                if self.stopping:
                    return
                try:
                    worked |= reap_some(pool, REAP_BATCH, self)
                except Exception:  # a bug: the files stay for reclaim_pools, retirements unlink
                    log.exception("the recycled-file reaper failed on %s", pool.dir)
            if worked:
                continue
            if any(_trim_some(pool) for pool in list(own_pools.values())):
                continue
            self.wake.clear()  # before the last look: a retirement after it sets it again
            if not any(p.unreaped for p in list(own_pools.values())):
                surplus = any(len(p.files) > OWN_POOL_FILES for p in list(own_pools.values()))
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


reaper = Reaper()


class DeferredReaping(threading.local):
    """Per thread: the own pools whose retirements inside `FilePool.reaping_here` did not wake
    the reaper (None outside such a block)."""

    pools: set[str] | None = None


deferred_reaping = DeferredReaping()


def reap_some(pool: OwnPool, limit: int | None, reaper: Reaper | None) -> bool:
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


def _trim_some(pool: OwnPool) -> bool:
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
        unlink_quietly(name, handle)
    return True


def _room(pool: OwnPool, size: int) -> bool:
    """Whether `pool` keeps one more blank file of `size` bytes (call under its lock)."""
    if len(pool.files) < OWN_POOL_FILES:
        return True
    return len(pool.files) < pool.keep and pool.kept_bytes + size <= pool.keep_bytes


def _reap_batch(
    pool: OwnPool, handle: DirHandle, sink: SharedPool, names: list[str], epoch: int
) -> None:
    """Blank and keep each unreaped file of `names` in `pool`, or hand it on blank, or unlink
    it (`epoch`: the pool's when the files were taken from `unreaped`). What holds for the whole
    batch (room, space, the epoch) is looked at once, and the pool's lock taken once."""
    full = not _room(pool, 0) and sink.full()
    if full or pool.epoch != epoch or sink.short_of_space():
        for name in names:
            unlink_quietly(name, handle)  # nowhere to keep them: no need to look at them
        return
    blanked: list[tuple[str, int]] = []
    lstat, is_regular, directory = os.lstat, stat.S_ISREG, handle.fd
    for i, name in enumerate(names):
        try:
            st = lstat(name, dir_fd=directory)
        except OSError:
            continue  # gone (our pool directory was removed), or unreadable: left to reclaim
        if not is_regular(st.st_mode) or st.st_nlink > 1 or st.st_size > MAX_RECYCLED_BYTES:
            unlink_quietly(name, handle)  # a second name may be a message's: never blanked
            continue
        try:
            blank(name, st.st_size, handle)
        except OSError as exc:
            unlink_quietly(name, handle)
            if exc.errno in NO_SPACE:
                sink.release_space()  # the pools are emptied: keep nothing of this batch
                for rest in names[i + 1 :]:
                    unlink_quietly(rest, handle)
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
        unlink_quietly(name, handle)


def wait_reaped(timeout_s: float) -> bool:
    """Wait until this process's reaper has handled every retired file (for tests, and
    whoever must know the acknowledged bytes are gone); False if `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    # In this order: a batch is taken out of `unreaped` and marked busy in one lock hold.
    while any(p.unreaped for p in list(own_pools.values())) or reaper.busy:
        if time.monotonic() >= deadline:
            return False
        reaper.poke()
        time.sleep(0.001)
    return True


def unreaped_files() -> int:
    """How many retired files of this process wait for the reaper (all queues; for tests)."""
    return sum(len(p.unreaped) for p in list(own_pools.values()))


def _forget_own_pools() -> None:
    # A forked child must not write into its parent's pool: it starts its own, and its own
    # reaper (the parent's thread does not exist in the child).
    global _own_lock, reaper
    own_pools.clear()
    _own_lock = threading.Lock()
    reaper = Reaper()


def release_own_pool(free_dir: str) -> int:
    """Hand this process's own pool in `free_dir` over to the shared pool there; returns how
    many files moved. Files taken by puts in flight are not affected. Unreaped files are reaped
    first (blanked): nothing unblanked reaches the shared pool (a batch the reaper has in hand
    meanwhile goes there blank too, or is unlinked)."""
    pool = own_pools.get(free_dir)
    if pool is None:
        return 0
    reap_some(pool, None, None)
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
        unlink_quietly(name, handle)
    # What a drain kept beyond the shared pool's room is not handed on (nobody would trim it).
    room = max(DEFAULT_POOL_FILES if sink is None else sink.room(), 0)
    for name, _size in files[room:]:
        unlink_quietly(name, handle)
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
    for pool in list(own_pools.values()):
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


def release_own_pools() -> int:
    """Stop the reaper, then hand every own pool of this process over to the shared pools (run
    at exit: what a dead process leaves is reclaimed too, but only when someone next opens the
    queue)."""
    reaper.stop(timeout_s=5.0)
    return sum(release_own_pool(free_dir) for free_dir in list(own_pools))


os.register_at_fork(after_in_child=_forget_own_pools)
atexit.register(release_own_pools)


def own_pool(free_dir: str) -> OwnPool:
    pool = own_pools.get(free_dir)
    if pool is None:
        with _own_lock:
            pool = own_pools.get(free_dir)
            if pool is None:
                pool = own_pools[free_dir] = OwnPool(os.path.join(free_dir, pool_dir_name()))
    return pool
