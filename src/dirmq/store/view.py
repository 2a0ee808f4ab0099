"""One queue as this process sees it: its configuration, its index, and waiting for changes.

Theory of operation. A `QueueView` holds what the operations of a `Queue` share: the
configuration (re-read from @queue.json when it changed, at most every `CONFIG_RECHECK_S`), the
`QueueIndex` of the queue's state directories, the watcher that keeps that index in step with
what every process does, and the one lock that serialises both within this process. The index
is built on first use (the watcher starts before the scan, so nothing in between is missed) and
what crashed processes left behind is recovered then. Blocking operations wait on the watcher
outside the lock, so another process's publish, ack or requeue wakes them at once.

A view nobody waits on (no listener, no blocked get) and nobody used for a while can be
released (`release_if_idle`): its watches go back to the user's inotify budget and its index
to the allocator, and its next use builds them again, as the first did.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from dirmq.errors import (
    ConfigError,
    CorruptConfig,
    QueueNotFound,
    StorageError,
    storage_error,
)
from dirmq.store import layout
from dirmq.store.backlog import MIGRATE_ABOVE
from dirmq.store.clock import now_ms
from dirmq.store.config import QueueConfig
from dirmq.store.context import QueueContext
from dirmq.store.delays import bucket_dir
from dirmq.store.files import QueueFiles
from dirmq.store.index import QueueIndex
from dirmq.store.message import SweepReport
from dirmq.store.poolreclaim import reclaim_pools
from dirmq.store.watch import (
    OUT_OF_INOTIFY,
    RESCAN,
    HubWatcher,
    PollingWatcher,
    Watcher,
    open_watcher,
    polls,
)

log = logging.getLogger(__name__)
CONFIG_RECHECK_S = 0.5
_WATCHED = (layout.READY, layout.LEASED, layout.DELAYED, layout.SLOTS, layout.BACKLOG)
# Where anything a get could lease, or a due time, comes from: empty, a queue needs no index
# to be waited on (`watch_if_idle`). All four are looked into; @leased is not watched: while the
# others are empty a lease can only be taken from @ready, whose watch tells of it.
_IDLE_LOOKED = (layout.READY, layout.BACKLOG, layout.DELAYED, layout.LEASED)
_IDLE_WATCHED = _IDLE_LOOKED[:3]
_NOTHING_RECOVERED = SweepReport()  # frozen: one for every view not yet opened


class QueueView:
    """The shared state of one open queue. `index` and `files` are used under `lock`."""

    def __init__(
        self,
        context: QueueContext,
        name: str,
        path: str,
        files: QueueFiles,
        config: QueueConfig | None,
        config_stamp: tuple[int, int] | None = None,
        polled: bool | None = None,
    ) -> None:
        self.name = name
        self.path = path
        self.files = files
        self.lock = threading.RLock()
        self.index: QueueIndex | None = None  # None until first used, and once closed
        # What opening the index recovered, until the next sweep reports it.
        self.recovered_on_open = _NOTHING_RECOVERED
        self._context = context
        self._config = config
        # (inode, mtime) of the @queue.json `_config` was read from: a check is a stat.
        self._config_stamp = config_stamp
        self._config_checked = time.monotonic()
        self._polled = polled  # watched by polling (watch.polls), if the Store told
        self._watcher: Watcher | None = None
        self._listeners: list[Callable[[], None]] = []
        self._used = 0.0  # time.monotonic() of the last sync of the index
        self._waiting = 0  # threads blocked in `wait`

    # -- configuration -------------------------------------------------------------------------
    @property
    def config(self) -> QueueConfig:
        """The current configuration (changes made by other processes show within 0.5 s)."""
        if self._config is None or time.monotonic() - self._config_checked > CONFIG_RECHECK_S:
            self.reload_config()
        assert self._config is not None  # reload_config read it, or raised
        return self._config

    def reload_config(self) -> None:
        """Re-read @queue.json now if it changed (QueueNotFound if the queue is gone)."""
        config_path = self.path + os.sep + layout.CONFIG_FILE  # a queue's path ends in no /
        try:
            if self._config is None and self._config_stamp is not None:
                # Opened lazily: stamped by the open's stat, which came first (a change since
                # then is read again at the next check).
                raw = _read_whole(config_path)
                stamp = self._config_stamp
            elif self._config_stamp is None:  # never read: read it, stamped by its descriptor
                fd = os.open(config_path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    st = os.fstat(fd)
                    raw = os.read(fd, st.st_size + 1)  # whole: replaced, never rewritten
                finally:
                    os.close(fd)
                stamp = (st.st_ino, st.st_mtime_ns)
            else:
                st = os.stat(config_path)
                stamp = (st.st_ino, st.st_mtime_ns)
                raw = None
                if stamp != self._config_stamp:
                    with open(config_path, "rb") as f:
                        raw = f.read()
            if raw is not None:
                try:
                    self._config = self._context.parse_config(raw)
                except ConfigError as exc:
                    raise CorruptConfig(
                        f"queue {self.name!r}: stored configuration: {exc}"
                    ) from exc
                self._config_stamp = stamp
        except FileNotFoundError:
            raise QueueNotFound.missing(self.name) from None
        except OSError as exc:
            raise storage_error(exc, f"reading the configuration of queue {self.name!r}") from exc
        self._config_checked = time.monotonic()

    # -- the index -------------------------------------------------------------------------------
    def synced(self) -> QueueIndex:
        """The index, brought up to date with every change any process made (call under lock)."""
        self._used = time.monotonic()
        if self.index is None or self._watcher is None:
            return self._open_index()
        result = self._watcher.drain()
        if getattr(self._watcher, "lost", False):  # the queue directory was deleted or replaced
            self._watcher.close()
            self._watcher = None
            return self._open_index()
        if result == RESCAN:
            self.index.rescan(self.path)
        elif isinstance(result, list) and result:
            self.index.apply(result)
        return self.index

    def _open_index(self) -> QueueIndex:
        self.reload_config()
        directories = {d: self.files.dir[d] for d in _WATCHED}
        context = self._context
        try:
            # A queue made before the backlog existed has none yet: it is watched from now.
            context.access.mkdir(directories[layout.BACKLOG])
        except FileExistsError:
            pass
        except FileNotFoundError:
            raise QueueNotFound.missing(self.name) from None
        except OSError as exc:
            raise storage_error(exc, f"making the backlog of queue {self.name!r}") from exc
        try:
            # The watcher starts before the scan, so nothing that happens in between is missed.
            self._watcher = open_watcher(
                directories,
                context.watch_mode,
                context.poll_interval_s,
                context.inotify_hub,
                self._polled,
            )
        except FileNotFoundError:
            raise QueueNotFound.missing(self.name) from None
        except OSError as exc:  # out of inotify watches is not one: the queue is polled
            raise storage_error(exc, f"watching queue {self.name!r}") from exc
        self._attach_listeners()
        index = QueueIndex()
        index.delayed.watch = self._watch_bucket
        try:
            index.rescan(self.path)
        except BaseException:
            # Else the next call opens another watcher and this one stays subscribed for good:
            # an eventfd and every event of the queue kept, per failed attempt.
            self._watcher.close()
            self._watcher = None
            raise
        self.index = index
        if len(index.ready) > MIGRATE_ABOVE and any(
            len(ids) > MIGRATE_ABOVE for ids in index.ready_ids_by_level().values()
        ):
            # A flat @ready of an earlier version (or written around the store): all but its
            # oldest go to the backlog now, once (backlog.py); the next open lists the head.
            # Each priority level keeps its own head of SPILL_AT.
            self.files.spill_excess(index)
        # Recovery on open: what crashed processes left behind is cleaned up now, not later;
        # the next sweep() reports it.
        orphans = self.files.remove_orphans()
        pools = reclaim_pools(self.files.dir[layout.FREE])
        if context.holders is not None:  # the root's, once a process: holders.py
            context.holders.sweep_once()
        try:
            promoted = self.files.promote(index, self.config, now_ms())
        except StorageError:  # a disk that refuses writes can still be read: gets promote later
            promoted = SweepReport()
        self.recovered_on_open = replace(promoted, orphans_removed=orphans, pools_reclaimed=pools)
        return index

    def _watch_bucket(self, minute: int, on: bool) -> bool:
        """Watch a delay bucket the index loads (`on`), or stop (delays.py); False if the
        bucket is gone. Out of inotify watches, the queue is polled from now (a warning)."""
        watcher = self._watcher
        if not isinstance(watcher, HubWatcher):
            return True  # polled: every rescan lists the loaded buckets again
        key = bucket_dir(minute)
        if not on:
            watcher.unwatch_optional(key)
            return True
        try:
            watcher.watch_optional(key, os.path.join(self.path, key))
        except FileNotFoundError:
            return False
        except OSError as exc:
            if exc.errno not in OUT_OF_INOTIFY:
                raise storage_error(exc, f"watching a delay bucket of queue {self.name!r}") from exc
            log.warning(
                "out of inotify watches (%s): queue %r is polled instead; raise "
                "fs.inotify.max_user_watches",
                exc.strerror or exc,
                self.name,
            )
            watcher.close()
            self._watcher = PollingWatcher(self._context.poll_interval_s)
            self._attach_listeners()
        return True

    def polling(self) -> bool:
        """Whether the index is kept by polling (it hears nothing of this process's changes)."""
        return self._watcher is not None and self._watcher.polls

    def polled(self) -> bool:
        """`Queue.polled`."""
        with self.lock:
            self.synced()
            return self.polling()

    # -- waiting ---------------------------------------------------------------------------------
    def fileno(self) -> int | None:
        """`Queue.fileno`."""
        with self.lock:
            self.synced()
            assert self._watcher is not None
            return self._watcher.fileno()

    def wait(self, timeout_s: float) -> None:
        """Sleep until the queue may have changed, or `timeout_s` (call outside the lock)."""
        with self.lock:
            watcher = self._watcher
            self._waiting += 1  # not released under us
        try:
            if watcher is not None:
                watcher.wait(timeout_s)
            else:
                time.sleep(timeout_s)
        finally:
            with self.lock:
                self._waiting -= 1

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """`Queue.subscribe`."""
        with self.lock:
            self.synced()
            self._listeners.append(listener)
            self._attach_listeners()

        def unsubscribe() -> None:
            with self.lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def watch_if_idle(self, listener: Callable[[], None]) -> Callable[[], None] | None:
        """`Queue.watch_if_idle`: watch the directories of `_IDLE_WATCHED`, then look into
        those of `_IDLE_LOOKED` (listed; @backlog: `_no_bucket`), so nothing arriving in
        between is missed; the unsubscribe if all four were empty, else None (also with an
        index already, a polled queue, no watch to be had, or a directory missing: the index's
        way of waiting handles each). A queue
        opened lazily has its configuration read first: what is wrong with it (CorruptConfig,
        QueueNotFound) is raised now, not at the first change."""
        if self.index is not None:
            return None
        if self._config is None:
            self.reload_config()
        context = self._context
        directories = self.files.dir
        polled = self._polled
        if polled is None:
            polled = polls(context.watch_mode, directories[layout.READY])
        if polled:
            return None
        try:
            signal = context.inotify_hub().listen(
                {d: directories[d] for d in _IDLE_WATCHED}, listener
            )
        except OSError:
            return None
        idle = False
        try:
            idle = (
                _empty(directories[layout.READY])
                and _empty(directories[layout.DELAYED])
                and _empty(directories[layout.LEASED])
                and _no_bucket(directories[layout.BACKLOG])
            )
        except OSError:  # a directory gone: the queue deleted, or being
            pass
        finally:
            if not idle:
                signal.close()
        return signal.close if idle else None

    def _attach_listeners(self) -> None:
        if self._watcher is not None:
            self._watcher.listeners = self._listeners

    def release_if_idle(self, unused_since: float) -> bool:
        """Stop watching and forget the index if nobody waits on the queue (no listener, no
        blocked get) and nobody synced it since `unused_since` (time.monotonic()); True if
        released. Never waits for the lock: a view in use is not idle."""
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if (
                self._watcher is None
                or self._listeners
                or self._waiting
                or self._used >= unused_since
            ):
                return False
            self._watcher.close()
            self._watcher = None
            self.index = None
            return True
        finally:
            self.lock.release()

    def close(self) -> None:
        """Stop watching and forget the index; listeners are called to look again."""
        with self.lock:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = None
            self.index = None
            listeners = list(self._listeners)
        for listener in listeners:  # let waiters look again: they will find out why
            listener()


def _empty(directory: str) -> bool:
    """Whether `directory` has no entry (its first, if any, is all that is read)."""
    with os.scandir(directory) as entries:
        return next(entries, None) is None


def _no_bucket(backlog: str) -> bool:
    """Whether the backlog at `backlog` holds no message: a stat when it has no subdirectory
    (a link count of 2: a message is only ever in a bucket, two levels down), else its first
    entry read, as `_empty` (a count of 1, as btrfs gives every directory, tells nothing). An
    empty directory's listing costs 2-3 times a stat (ext4 reads it as an indexed one)."""
    if os.stat(backlog).st_nlink == 2:
        return True
    return _empty(backlog)


def _read_whole(path: str) -> bytes:
    """A small file's bytes (a configuration: replaced, never rewritten), without an fstat."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, 4096)]
        while len(chunks[-1]) == 4096:  # larger than a configuration is: read on
            chunks.append(os.read(fd, 65536))
        return b"".join(chunks)
    finally:
        os.close(fd)
