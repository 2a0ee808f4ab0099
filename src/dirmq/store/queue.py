"""One queue: publish, lease, acknowledge, requeue, dead-letter, from any number of processes.

Theory of operation. A message is one immutable file; its state is the directory it sits in and
its name (see `layout`). Every transition is one `rename` (see `files.py`), so whichever
process performs it first wins and the others see ENOENT and move on: no locks, which is what makes
the queue safe on NFS too. Each process keeps a `QueueIndex` fed by watcher events, so a get is a
heap pop plus one rename whatever the backlog. Processes that wait (blocking `get`, a put at
capacity) sleep on the watcher, so another process's publish, ack or requeue wakes them at once,
and they also wake when the earliest lease or delay in the index falls due, and promote it
themselves. Expired leases return to `@ready` under their original id, i.e. their FIFO place.
"""

from __future__ import annotations

import errno
import heapq
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from dirmq.errors import (
    ConfigError,
    CorruptConfig,
    DiskFull,
    InvalidArgument,
    MessageNotFound,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    StaleReceipt,
    StorageError,
    storage_error,
)
from dirmq.store import codec, layout, smallfiles
from dirmq.store.bounds import check_seconds
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.files import QueueFiles, expired_by_retention, now_ms
from dirmq.store.fsio import PendingFile, create_pending
from dirmq.store.ids import id_time_us, is_id, new_ids
from dirmq.store.index import GroupRuns, QueueIndex
from dirmq.store.layout import parse_entry, parse_receipt
from dirmq.store.message import Message, OutgoingMessage, QueueStats, SweepReport
from dirmq.store.pool import DEFAULT_POOL_FILES, reclaim_pools
from dirmq.store.recovery import remove_orphans
from dirmq.store.watch import RESCAN, Watcher, open_watcher

if TYPE_CHECKING:
    from dirmq.store.root import Store

CONFIG_RECHECK_S = 0.5
_WATCHED = (layout.READY, layout.LEASED, layout.DELAYED, layout.SLOTS)
ProgressFn = Callable[[int], None]  # called with how many items were just processed
_SETTLE_ACTIONS = ("ack", "nack", "extend", "dead_letter")
_ACK_CHUNK = 64  # acks of one ack_many applied per lock hold (and per index sync)
_MAX_VALIDATED = 4096  # validated messages remembered per queue (a server batch is <= 1024)
READ_CHUNK = 256  # `read_leases`: lease files opened before moved ones are looked for
OPEN_FILES_PER_BATCH = 256  # a batch's files beyond these are closed once written (EMFILE)


def _check_seconds(name: str, value: float | None) -> None:
    """A duration the store accepts (bounds.py): it may end up in a file name."""
    if value is not None:
        check_seconds(name, value)


def _check_timeout(name: str, value: float | None) -> None:
    """How long a call may block: never in a name, so only non-negative (inf: no limit)."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
    ):
        raise InvalidArgument(f"{name} must be a non-negative number of seconds, got {value!r}")


class Queue:
    """A queue directory opened by this process. Thread-safe; obtain it from `Store`."""

    def __init__(self, store: Store, name: str, path: str, config: QueueConfig) -> None:
        self.name = name
        self.path = path
        self._store = store
        self._lock = threading.RLock()
        self._files = QueueFiles(store, name, path)
        self._config = config
        self._config_stamp: tuple[int, int] | None = None
        self._config_checked = time.monotonic()
        self._index: QueueIndex | None = None
        self._watcher: Watcher | None = None
        self._recovered_on_open = SweepReport()
        self._listeners: list[Callable[[], None]] = []
        # Messages `validate` passed, by id(): (the message, the config it passed against). The
        # reference keeps the id from being reused while the record lives.
        self._validated: dict[int, tuple[OutgoingMessage, QueueConfig]] = {}

    # -- configuration -------------------------------------------------------------------------
    @property
    def config(self) -> QueueConfig:
        """The current configuration (changes made by other processes show within 0.5 s)."""
        if time.monotonic() - self._config_checked > CONFIG_RECHECK_S:
            self.reload_config()
        return self._config

    def reload_config(self) -> None:
        """Re-read @queue.json now if it changed (QueueNotFound if the queue is gone)."""
        config_path = os.path.join(self.path, layout.CONFIG_FILE)
        try:
            st = os.stat(config_path)
            stamp = (st.st_ino, st.st_mtime_ns)
            if stamp != self._config_stamp:
                with open(config_path, "rb") as f:
                    raw = f.read()
                try:
                    self._config = QueueConfig.loads(raw)
                except ConfigError as exc:
                    raise CorruptConfig(
                        f"queue {self.name!r}: stored configuration: {exc}"
                    ) from exc
                self._config_stamp = stamp
        except FileNotFoundError:
            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
        except OSError as exc:
            raise storage_error(exc, f"reading the configuration of queue {self.name!r}") from exc
        self._config_checked = time.monotonic()

    # -- the index -------------------------------------------------------------------------------
    def _synced_index(self) -> QueueIndex:
        """The index, brought up to date with every change any process made (call under lock)."""
        if self._index is None or self._watcher is None:
            return self._open_index()
        result = self._watcher.drain()
        if getattr(self._watcher, "lost", False):  # the queue directory was deleted or replaced
            self._watcher.close()
            self._watcher = None
            return self._open_index()
        if result == RESCAN:
            self._index.rescan(self.path)
        elif isinstance(result, list) and result:
            self._index.apply(result)
        return self._index

    def _open_index(self) -> QueueIndex:
        self.reload_config()
        directories = {d: self._files.dir[d] for d in _WATCHED}
        try:
            # The watcher starts before the scan, so nothing that happens in between is missed.
            self._watcher = open_watcher(
                directories,
                self._store.watch_mode,
                self._store.poll_interval_s,
                self._store.inotify_hub,
            )
        except FileNotFoundError:
            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
        except OSError as exc:  # e.g. out of inotify watches: the operator must act
            raise storage_error(exc, f"watching queue {self.name!r}") from exc
        self._attach_listeners()
        index = QueueIndex()
        try:
            index.rescan(self.path)
        except BaseException:
            # Else the next call opens another watcher and this one stays subscribed for good:
            # an eventfd and every event of the queue kept, per failed attempt.
            self._watcher.close()
            self._watcher = None
            raise
        self._index = index
        # Recovery on open: what crashed processes left behind is cleaned up now, not later;
        # the next sweep() reports it.
        orphans = remove_orphans(self._files.dir[layout.TMP])
        pools = reclaim_pools(self._files.dir[layout.FREE])
        try:
            promoted = self._files.promote(index, self._config, now_ms())
        except StorageError:  # a disk that refuses writes can still be read: gets promote later
            promoted = SweepReport()
        self._recovered_on_open = replace(promoted, orphans_removed=orphans, pools_reclaimed=pools)
        return index

    def _polling(self) -> bool:
        return self._watcher is not None and self._watcher.fileno() is None

    def fileno(self) -> int | None:
        """A file descriptor that becomes readable when the queue changes (None when polling).
        Changes reach it when the Store's shared inotify descriptor is pumped: an event loop
        must also watch `Store.watch_fileno()` and call `Store.pump_watches()`."""
        with self._lock:
            self._synced_index()
            assert self._watcher is not None
            return self._watcher.fileno()

    def _wait(self, timeout_s: float) -> None:
        watcher = self._watcher
        if watcher is not None:
            watcher.wait(timeout_s)
        else:
            time.sleep(timeout_s)

    # -- publishing ------------------------------------------------------------------------------
    def put(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        delay_s: float | None = None,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
        dedup_id: str | None = None,
    ) -> str:
        """Publish one message and return its id.

        Returns only once the message is stored at the queue's durability level (`writethrough`:
        on stable storage). At capacity, blocks up to `timeout_s` (None: indefinitely) then
        raises `QueueFull`. Raises `StorageError` (nothing stored, nothing partial visible) if the
        filesystem fails. With `dedup_id`, a message already published with that id within the
        queue's `dedup_window_s` is not stored again and its id is returned.
        """
        message = OutgoingMessage(body, headers or {}, delay_s, dedup_id)
        return self.put_many([message], timeout_s=timeout_s, durability=durability)[0]

    def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        *,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
    ) -> list[str]:
        """Publish several messages with one group commit; all are stored or none is. Returns
        their ids in order (for a deduplicated message, the original's id)."""
        _check_timeout("timeout_s", timeout_s)
        config = self.config
        level = Durability(durability) if durability is not None else config.durability
        outgoing = [m if isinstance(m, OutgoingMessage) else OutgoingMessage(m) for m in messages]
        validated = self._validated
        for message in outgoing:
            record = validated.pop(id(message), None) if validated else None
            if record is None or record[0] is not message or record[1] is not config:
                self._check_outgoing(message, config)
        if not any(m.dedup_id is not None for m in outgoing):
            return self._publish_files(outgoing, config, level, timeout_s)[0]
        return self._put_deduplicated(outgoing, config, level, timeout_s)

    def _put_deduplicated(
        self,
        outgoing: list[OutgoingMessage],
        config: QueueConfig,
        level: Durability,
        timeout_s: float | None,
    ) -> list[str]:
        dedup = self._files.dedup
        window_s = config.dedup_window_s
        owner: dict[str, str] = {}  # dedup id -> message id, for repeats inside this batch
        fresh: list[OutgoingMessage] = []
        for message in outgoing:
            key = message.dedup_id
            if key is None:
                fresh.append(message)
            elif key not in owner:
                existing = dedup.lookup(key, window_s)
                if existing is None:
                    fresh.append(message)
                    owner[key] = ""  # to be stored
                else:
                    owner[key] = existing
        stored = iter(self._publish_files(fresh, config, level, timeout_s)[1])
        result: list[str] = []
        for message in outgoing:
            key = message.dedup_id
            if key is not None and owner[key]:
                result.append(owner[key])
                continue
            published = next(stored)
            if key is not None:
                winner = dedup.record(key, published.message_id, window_s)
                if winner != published.message_id:  # a concurrent publisher recorded it first
                    self._withdraw(published)
                owner[key] = winner
                result.append(winner)
            else:
                result.append(published.message_id)
        return result

    def _withdraw(self, published: PendingFile) -> None:
        directory = os.path.basename(os.path.dirname(published.final_path))
        name = os.path.basename(published.final_path)
        with self._lock:
            self._files.remove(self._index, directory, name, published.message_id)

    def _publish_files(
        self,
        outgoing: list[OutgoingMessage],
        config: QueueConfig,
        level: Durability,
        timeout_s: float | None,
    ) -> tuple[list[str], list[PendingFile]]:
        """Write and publish `outgoing` (already validated); their ids and published files, in
        order."""
        if not outgoing:
            return [], []
        ids = new_ids(len(outgoing))
        slots: list[str | None] = [None] * len(ids)
        if config.capacity is not None:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            slots = list(self._acquire_slots(ids, config.capacity, deadline))
        pending: list[PendingFile] = []
        try:
            at_ms = now_ms()
            for message_id, message, slot in zip(ids, outgoing, slots, strict=True):
                system = {"Slot": slot} if slot else {}
                if message.group is not None:
                    system["Group"] = message.group
                data = codec.encode(message.body, message.headers, system, message_id=message_id)
                keep_open = len(pending) < OPEN_FILES_PER_BATCH
                pending.append(self._write_tmp(message_id, data, message, config, at_ms, keep_open))
            self._commit(pending, level, config)
        except BaseException as exc:
            if isinstance(exc, DiskFull):
                self._files.pool.release_space()  # recycled files are space the disk needs now
            for f in pending:
                f.discard()
            for message_id, slot in zip(ids, slots, strict=True):
                if slot is not None:
                    self._files.slots.release(slot, message_id, self._index)
            raise
        with self._lock:
            # With inotify the index learns of these files from their own events, in order
            # with everything else; adding them here could resurrect one that another thread
            # claimed in between. Polling hears nothing, so there we add them ourselves.
            if self._index is not None and self._polling():
                for f in pending:
                    self._index.add(
                        os.path.basename(os.path.dirname(f.final_path)),
                        os.path.basename(f.final_path),
                    )
        return ids, pending

    def validate(self, message: OutgoingMessage) -> None:
        """Raise what `put` would raise for this message's content (size, headers, delay), so a
        caller can refuse one bad message before batching it with good ones.

        A message that passes is not checked again by the next `put_many` that stores it, as
        long as the queue's configuration is unchanged (the server validates every message
        before it joins a batch). The message is frozen, and a `bytes` body immutable; headers
        must not be changed in between."""
        config = self.config
        self._check_outgoing(message, config)
        if type(message.body) is bytes:
            validated = self._validated
            if len(validated) >= _MAX_VALIDATED:  # records of messages never stored: forget
                validated.clear()
            validated[id(message)] = (message, config)

    def _check_outgoing(self, message: OutgoingMessage, config: QueueConfig) -> None:
        if not isinstance(message.body, bytes | bytearray | memoryview):
            raise InvalidArgument(f"message body must be bytes, got {type(message.body).__name__}")
        if len(message.body) > config.max_message_bytes:
            raise MessageTooLarge(
                f"message is {len(message.body)} bytes; queue {self.name!r} accepts at most "
                f"{config.max_message_bytes}"
            )
        _check_seconds("delay_s", message.delay_s)
        codec.check_headers(message.headers)
        codec.check_label("group", message.group)
        codec.check_label("dedup_id", message.dedup_id)

    def _write_tmp(
        self,
        message_id: str,
        data: bytes,
        message: OutgoingMessage,
        config: QueueConfig,
        at_ms: int,
        keep_open: bool = True,
    ) -> PendingFile:
        """The message's file, written, to be published (open unless `keep_open` is false)."""
        delay_s = config.delay_s if message.delay_s is None else message.delay_s
        tag = None if message.group is None else layout.group_tag(message.group)
        if delay_s > 0:
            due_ms = at_ms + round(delay_s * 1000)
            name = layout.timed_name(message_id, 0, due_ms, tag)
            final = f"{self._files.dir[layout.DELAYED]}/{name}"
        else:
            final = f"{self._files.dir[layout.READY]}/{layout.ready_name(message_id, 0, tag)}"
        try:
            pool = self._files.pool
            tmp_dir = self._files.dir[layout.TMP]
            pending = pool.overwrite_own(final, data)
            if pending is None:
                tmp_name = layout.tmp_name(message_id)
                pending = pool.overwrite_shared(f"{tmp_dir}/{tmp_name}", final, data)
                if pending is None:
                    pending = create_pending(tmp_dir, tmp_name, final, data)
            if not keep_open:
                pending.detach(tmp_dir, layout.tmp_name(message_id))
            return pending
        except FileNotFoundError:
            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
        except OSError as exc:
            raise storage_error(exc, f"writing a message to queue {self.name!r}") from exc

    def _commit(self, pending: list[PendingFile], level: Durability, config: QueueConfig) -> None:
        if level is Durability.WRITETHROUGH:
            self._store.group_commit.commit(pending)
            return
        for i, f in enumerate(pending):
            try:
                f.publish()
            except OSError as exc:
                for g in pending[i:]:
                    g.discard()
                if exc.errno == errno.ENOENT:
                    raise QueueNotFound(f"queue {self.name!r} was deleted") from exc
                raise storage_error(exc, f"publishing to queue {self.name!r}") from exc
        if level is Durability.WRITEBACK:
            self._store.writeback.mark_dirty(config.writeback_delay_s, time.monotonic())

    # -- capacity ---------------------------------------------------------------------------------
    def _acquire_slots(
        self, ids: list[str], capacity: int, deadline: float | None
    ) -> list[str | None]:
        """One capacity token per message, waiting while the queue is full; all or none."""
        taken: list[str | None] = []
        try:
            for message_id in ids:
                taken.append(self._acquire_slot(message_id, capacity, deadline))
        except BaseException:
            for slot, message_id in zip(taken, ids, strict=False):
                if slot is not None:
                    self._files.slots.release(slot, message_id, self._index)
            raise
        return taken

    def _acquire_slot(self, message_id: str, capacity: int, deadline: float | None) -> str:
        while True:
            with self._lock:
                slot = self._files.slots.try_acquire(message_id, capacity, self._synced_index())
            if slot is not None:
                return slot
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise QueueFull(f"queue {self.name!r} is at its capacity of {capacity} messages")
            # A consumer's ack anywhere frees a slot and wakes us through the watcher.
            self._wait(1.0 if remaining is None else min(remaining, 1.0))

    # -- receiving --------------------------------------------------------------------------------
    def get(
        self,
        max_count: int = 1,
        *,
        visibility_s: float | None = None,
        wait_s: float = 0.0,
        max_per_group: int | None = 1,
    ) -> list[Message]:
        """Lease up to `max_count` messages, oldest first.

        Waits up to `wait_s` for the first message (returns [] if none came). Each message stays
        invisible to others for `visibility_s` (default: the queue's visibility timeout); ack it
        with its receipt before then, or it returns to its FIFO place.

        Messages of a group come in order, and only from a group none of whose messages is in
        flight. This get may take up to `max_per_group` consecutive messages of such a group
        (None: as many as it can, like SQS FIFO); the group then stays held back from every
        other get, in any process, until none of them is in flight (acked, returned, expired).
        Keep the default of 1 when the messages of one get are shared among several consumers.
        """
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise InvalidArgument(f"max_count must be a positive integer, got {max_count!r}")
        if max_per_group is not None and (
            isinstance(max_per_group, bool)
            or not isinstance(max_per_group, int)
            or max_per_group < 1
        ):
            raise InvalidArgument(
                f"max_per_group must be a positive integer or None, got {max_per_group!r}"
            )
        _check_seconds("visibility_s", visibility_s)
        _check_seconds("wait_s", wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                config = self.config
                index = self._synced_index()
                at_ms = now_ms()
                self._files.promote(index, config, at_ms)
                visibility = config.visibility_timeout_s if visibility_s is None else visibility_s
                visibility_ms = round(visibility * 1000)
                got: list[Message] = []
                runs = GroupRuns(max_per_group)
                while len(got) < max_count:
                    try:
                        message = self._files.claim(index, config, at_ms, visibility_ms, runs)
                    except OSError:
                        if got:  # what is leased already goes to the caller, not to waste
                            break
                        raise
                    if message is None:
                        break
                    got.append(message)
                remaining = deadline - time.monotonic()
                if got or remaining <= 0:
                    return got
                timeout = min(remaining, _next_due_s(index, at_ms))
            self._wait(timeout)

    # -- planned claims (cooperating consumers) -----------------------------------------------
    def ready_names(
        self, limit: int | None = None, *, promote: bool = True, groups: bool = False
    ) -> list[str]:
        """The file names of the oldest ready messages (all, or the oldest `limit`), oldest
        first, without leasing them: a plan that one coordinator splits among cooperating
        consumers, each of which `claim_named`s its share, so that no two of them race for the
        head of the queue. Due delayed messages and expired leases are made ready first (unless
        `promote` is false). The list stops before the first message of a group (a group's
        order needs `get`), unless `groups` is true: then it holds every ready message.

        Read from the directories, not from the index: a planner that lists once per batch
        does not pay for following every claim and ack of the consumers it plans for."""
        try:
            with self._lock:
                config = self.config
                if promote:
                    self._promote_listed(config, now_ms())
                names = os.listdir(self._files.dir[layout.READY])
        except FileNotFoundError:
            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
        except OSError as exc:
            raise storage_error(exc, f"listing queue {self.name!r}") from exc
        oldest = sorted(names) if limit is None else heapq.nsmallest(limit, names)
        planned = []
        for name in oldest:  # ids are fixed-width: names sort in id order
            entry = parse_entry(name)
            if entry is None or entry.at_ms is not None:
                continue
            if entry.group is not None and not groups:
                break
            planned.append(name)
        return planned

    def _promote_listed(self, config: QueueConfig, at_ms: int) -> None:
        """`promote` from listings of @leased and @delayed instead of the index."""
        listed = QueueIndex()
        for directory in (layout.LEASED, layout.DELAYED):
            for name in os.listdir(self._files.dir[directory]):
                entry = parse_entry(name)
                if entry is not None and entry.at_ms is not None and entry.at_ms <= at_ms:
                    listed.add(directory, name)
        if not listed.leased.names and not listed.delayed.names:
            return
        if self._files.slots.any_held():  # a dead-lettered message must free its token
            listed.slots.update(os.listdir(self._files.dir[layout.SLOTS]))
        self._files.promote(listed, config, at_ms)

    def claim_named(
        self, names: list[str], *, visibility_s: float | None = None
    ) -> list[tuple[str, Message]]:
        """Lease the ready messages `names` (from `ready_names`) that nobody took meanwhile, in
        order: (lease name, message) pairs. The lease name acknowledges the message with
        `ack_leases`. This process's index is neither opened nor synced for it."""
        taken, deadline_ms = self._take_named(names, visibility_s)
        leased = []
        try:
            for lease, entry in taken:
                count = entry.count + 1
                message = self._files.open_claimed(lease, entry.message_id, count, deadline_ms)
                if message is not None:
                    leased.append((lease, message))
        except OSError as exc:
            raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
        return leased

    def lease_named(self, names: list[str], *, visibility_s: float | None = None) -> list[str]:
        """`claim_named` without reading the messages: the lease names of those taken, in
        order. Read them with `read_leases`, one at a time: a consumer that must record what
        it leased before processing any of it then never holds the whole lot in memory."""
        taken, _deadline_ms = self._take_named(names, visibility_s)
        return [lease for lease, _ in taken]

    def _take_named(
        self, names: list[str], visibility_s: float | None
    ) -> tuple[list[tuple[str, layout.Entry]], int]:
        """Rename the named ready files into @leased: (lease name, parsed ready name) of each
        one taken, and their lease deadline."""
        _check_seconds("visibility_s", visibility_s)
        entries = _ready_entries(names)
        try:
            with self._lock:
                config = self.config
                visibility = config.visibility_timeout_s if visibility_s is None else visibility_s
                at_ms, visibility_ms = now_ms(), round(visibility * 1000)
                taken = self._files.take_named(self._index, config, entries, at_ms, visibility_ms)
        except OSError as exc:
            raise storage_error(exc, f"leasing messages of queue {self.name!r}") from exc
        if names and not taken:
            self.reload_config()  # every name gone: QueueNotFound if the queue is
        return taken, at_ms + visibility_ms

    def read_leases(self, leases: Iterable[str]) -> Iterator[Message]:
        """The messages behind lease names (from `lease_named`), one at a time: a consumer
        holds what it has not passed on yet, nothing more. One whose lease file has moved since
        (a heartbeat extended it, or it expired) is found by `read_ids` and comes after the
        others of its chunk of `READ_CHUNK`; it has a receipt only while it is still under this
        lease. One that is gone (acknowledged by id) or damaged (set aside in @corrupt) is
        left out."""
        chunk: list[tuple[str, layout.Entry, int]] = []
        for lease in leases:
            entry = parse_entry(lease)
            if entry is None or entry.at_ms is None:
                raise InvalidArgument(f"not a lease name: {str(lease)[:80]!r}")
            chunk.append((lease, entry, entry.at_ms))
            if len(chunk) == READ_CHUNK:
                yield from self._read_lease_chunk(chunk)
                chunk = []
        yield from self._read_lease_chunk(chunk)

    def _read_lease_chunk(self, chunk: list[tuple[str, layout.Entry, int]]) -> Iterator[Message]:
        moved: dict[str, layout.Entry] = {}
        for lease, entry, deadline_ms in chunk:
            try:
                message = self._files.open_lease(lease, entry.message_id, entry.count, deadline_ms)
            except FileNotFoundError:
                moved[entry.message_id] = entry
                continue
            except OSError as exc:
                raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
            if message is not None:  # None: damaged, set aside
                yield message
        for found in self.read_ids(moved):
            entry = moved[found.id]
            if found.state == "leased" and found.receive_count == entry.count:
                found = replace(found, receipt=entry.receipt)  # noqa: PLW2901 (still our lease)
            yield found

    def read_ids(self, message_ids: Collection[str]) -> Iterator[Message]:
        """Read messages by id wherever they are now (ready, leased, delayed, dead), without
        leasing them, from one listing of the state directories rather than the index: for a
        consumer that recorded what it received and must find it again, on any filesystem
        (a polling index can be seconds behind), without building an index of the whole
        queue. Ids not found are left out. A message that moves between the listing and its
        read is looked for again (three listings at most)."""
        wanted = set(message_ids)
        for _attempt in range(3):
            if not wanted:
                return
            located = self._files.locate_listed(wanted)
            for message_id, (directory, name) in located.items():
                message = self._files.read(directory, name)
                if message is not None:
                    wanted.discard(message_id)
                    yield message
                elif not os.path.lexists(self._files.path(directory, name)):
                    continue  # it moved on: the next listing finds it
                else:
                    wanted.discard(message_id)  # damaged: never delivered
            wanted.intersection_update(located)  # the ones never listed are gone

    def ack_leases(self, leases: Iterable[str]) -> list[str]:
        """Acknowledge leased messages by their lease names (from `claim_named`), without the
        index; returns the names that are no longer there (extended, expired or acknowledged
        since): settle those by receipt (`ack_many`). The queue's lock is not held for the
        renames and unlinks, so several threads acknowledging in parallel overlap them."""
        entries = []
        for lease in leases:
            entry = parse_entry(lease)
            if entry is None or entry.at_ms is None:
                raise InvalidArgument(f"not a lease name: {str(lease)[:80]!r}")
            entries.append((lease, entry.message_id))
        missing = []
        done = []
        try:
            tokens = self._files.slots.any_held()
            for lease, message_id in entries:
                if self._files.retire_lease(lease, message_id, tokens):
                    done.append((message_id, lease))
                else:
                    missing.append(lease)
        except OSError as exc:
            raise storage_error(exc, f"ack on queue {self.name!r}") from exc
        finally:
            with self._lock:
                if self._index is not None:
                    for message_id, lease in done:
                        self._index.leased.discard(message_id, lease)
        return missing

    def next_due_s(self) -> float | None:
        """Seconds until the earliest lease expires or delayed message falls due (as this process
        knows them), or None: when a waiter should look again even if nothing is published."""
        with self._lock:
            index = self._synced_index()
            at_ms = now_ms()
            times = [t[0] for t in (index.leased.earliest(), index.delayed.earliest()) if t]
            return max(0.0, (min(times) - at_ms) / 1000) if times else None

    def get_one(self, *, visibility_s: float | None = None, wait_s: float = 0.0) -> Message | None:
        got = self.get(1, visibility_s=visibility_s, wait_s=wait_s)
        return got[0] if got else None

    # -- settling leases --------------------------------------------------------------------------
    def ack(self, receipt: str) -> None:
        """Delete the leased message behind `receipt`. StaleReceipt if that lease is gone."""
        self._settle(receipt, "ack")

    def nack(self, receipt: str, delay_s: float = 0.0) -> None:
        """Give the message back: ready again at once (in its FIFO place), or after `delay_s`.
        Past the queue's max receives it is dead-lettered instead."""
        _check_seconds("delay_s", delay_s)
        self._settle(receipt, "nack", delay_s)

    def extend(self, receipt: str, visibility_s: float) -> None:
        """Heartbeat: the lease now ends `visibility_s` from now. The receipt stays valid."""
        _check_seconds("visibility_s", visibility_s)
        self._settle(receipt, "extend", visibility_s)

    def dead_letter(self, receipt: str) -> None:
        """Move the leased message to the dead-letter queue (or this queue's @dead)."""
        self._settle(receipt, "dead_letter")

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """Ack several receipts; returns the failures by receipt (empty when all succeeded).
        A `StorageError` is raised instead, once every receipt has been tried.

        The index is brought up to date once per chunk, not once per receipt: our own acks
        update it as they go, and a lease that changed elsewhere meanwhile is looked up again
        after a fresh sync before it is called stale."""
        failures = self.ack_each(receipts)
        for failure in failures.values():
            if isinstance(failure, StorageError):
                raise failure
        return failures

    def ack_each(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """`ack_many` that returns a `StorageError` by receipt too: for a caller that acks for
        several clients at once (the server), so each learns its own outcome (every receipt
        not in the result was acknowledged, even when others failed)."""
        failures: dict[str, Exception] = {}
        pending = list(receipts)
        for start in range(0, len(pending), _ACK_CHUNK):
            with self._lock:
                self._synced_index()
                for receipt in pending[start : start + _ACK_CHUNK]:
                    try:
                        self._settle(receipt, "ack", index_fresh=True)
                    except (StaleReceipt, InvalidArgument, StorageError) as exc:
                        failures[receipt] = exc
        return failures

    def _settle(
        self, receipt: str, action: str, delay_s: float = 0.0, index_fresh: bool = False
    ) -> None:
        """Apply `action` to the lease behind `receipt`, retrying once if it moved meanwhile
        (another process extended it between our lookup and our rename). `index_fresh`: the
        caller synced the index under the lock it holds, so the first lookup may skip that."""
        assert action in _SETTLE_ACTIONS
        sync = not index_fresh
        try:
            for _attempt in range(3 if index_fresh else 2):
                with self._lock:
                    try:
                        lease = self._lease_name(receipt, sync)
                    except StaleReceipt:
                        if sync:
                            raise
                        sync = True  # unknown to our index as it was: look again, up to date
                        continue
                    assert self._index is not None  # synced by us or by the caller
                    try:
                        self._files.settle(self._index, self.config, action, lease, delay_s)
                        return
                    except FileNotFoundError:
                        sync = True
                        continue
            raise StaleReceipt(f"receipt {receipt} of queue {self.name!r} is stale")
        except OSError as exc:
            if isinstance(exc, StaleReceipt | QueueNotFound):
                raise
            raise storage_error(exc, f"{action} on queue {self.name!r}") from exc

    def _lease_name(self, receipt: str, sync: bool = True) -> str:
        """The leased file name of the live lease behind `receipt`, or StaleReceipt. `sync`
        False: trust the index as it is (the caller synced it under the lock it holds)."""
        parsed = parse_receipt(receipt)
        if parsed is None:
            raise InvalidArgument(f"not a dirmq receipt: {str(receipt)[:80]!r}")
        message_id, count = parsed
        index = self._synced_index() if sync or self._index is None else self._index
        name = index.leased.names.get(message_id)
        if name is None and self._polling():
            # Polling mode: another host's extend may not have been seen yet.
            index.rescan_leased(self.path)
            name = index.leased.names.get(message_id)
        entry = parse_entry(name) if name else None
        if name is None or entry is None or entry.count != count:
            raise StaleReceipt(
                f"receipt {receipt} of queue {self.name!r} is stale: the lease expired and the "
                "message was delivered again, or it was already acknowledged"
            )
        return name

    # -- by id -------------------------------------------------------------------------------------
    def delete(self, message_id: str) -> bool:
        """Delete a message by id, whatever its state and whoever leased it (MQ semantics).
        Returns False if no such message is in the queue."""
        _check_id(message_id)
        with self._lock:
            for _attempt in range(2):
                found = self._locate(message_id)
                if found is None:
                    return False
                if self._files.remove(self._index, found[0], found[1], message_id):
                    return True
        return False

    def peek(self, message_id: str) -> Message:
        """Read a message by id without leasing it; MessageNotFound if absent, CorruptMessage
        if its file does not decode (it stays where it is: a get sets it aside)."""
        _check_id(message_id)
        with self._lock:
            for _attempt in range(3):
                found = self._locate(message_id)
                if found is None:
                    break
                message = self._files.read(*found, corrupt_ok=False)
                if message is not None:
                    return message
        raise MessageNotFound(f"no message {message_id} in queue {self.name!r}")

    @property
    def corrupt_quarantined(self) -> int:
        """Corrupt files this object's gets and reads set aside in @corrupt (a counter)."""
        return self._files.quarantined

    def _locate(self, message_id: str) -> tuple[str, str] | None:
        index = self._synced_index()
        found = index.locate(message_id)
        if found is None and self._polling():
            # Polling mode: another host may have published it since our last poll.
            index.rescan(self.path)
            found = index.locate(message_id)
        if found is None and (dead := self._files.dead_names(message_id)):
            return layout.DEAD, dead[0]
        return found

    def browse(self, limit: int | None = None) -> Iterator[Message]:
        """Ready messages in FIFO order, without leasing them (a snapshot; others may take them)."""
        with self._lock:
            index = self._synced_index()
            names = [index.ready[i] for i in index.ready_ids_in_order()]
        yielded = 0
        for name in names:
            if limit is not None and yielded >= limit:
                return
            message = self._files.read(layout.READY, name)
            if message is not None:
                yielded += 1
                yield message

    # -- whole queue -------------------------------------------------------------------------------
    def stats(self) -> QueueStats:
        """Counts by state. Expired leases and due delays count as ready (they are, to any get)."""
        with self._lock:
            index = self._synced_index()
            at_ms = now_ms()
            expired = [i for i, n in index.leased.names.items() if _at(n) <= at_ms]
            due = sum(1 for n in index.delayed.names.values() if _at(n) <= at_ms)
            oldest = min([*expired, *index.ready], default=None)
            age = None if oldest is None else max(0.0, time.time() - id_time_us(oldest) / 1e6)
            try:
                dead = len(os.listdir(self._files.dir[layout.DEAD]))
            except FileNotFoundError:
                dead = 0
            except OSError as exc:
                raise storage_error(exc, f"listing @dead of queue {self.name!r}") from exc
            return QueueStats(
                ready=len(index.ready) + len(expired) + due,
                in_flight=len(index.leased.names) - len(expired),
                delayed=len(index.delayed.names) - due,
                dead=dead,
                oldest_ready_age_s=age,
            )

    def purge(self, progress: ProgressFn | None = None) -> int:
        """Delete every message (ready, in flight, delayed); returns how many were removed."""
        removed = 0
        with self._lock:
            index = self._synced_index()
            for directory in (layout.READY, layout.LEASED, layout.DELAYED):
                try:
                    names = os.listdir(self._files.dir[directory])
                except FileNotFoundError:
                    raise QueueNotFound(f"queue {self.name!r} does not exist") from None
                for name in names:
                    entry = parse_entry(name)
                    if entry is not None and self._files.remove(
                        index, directory, name, entry.message_id
                    ):
                        removed += 1
                    if progress:
                        progress(1)
        return removed

    def sweep(self) -> SweepReport:
        """Recovery: remove orphaned temp files, requeue expired leases, deliver due delays,
        drop messages past retention, free capacity tokens whose message is gone, return the
        recycled-file pools of dead processes to the shared pool and trim it. Includes what
        opening the queue recovered."""
        with self._lock:
            config = self.config
            index = self._synced_index()
            index.rescan(self.path)
            at_ms = now_ms()
            promoted = self._files.promote(index, config, at_ms)
            orphans = remove_orphans(self._files.dir[layout.TMP])
            orphans += smallfiles.remove_stale_temps(self.path)  # of @queue.json writes
            expired = sum(
                self._files.remove(index, layout.READY, name, message_id)
                for message_id, name in list(index.ready.items())
                if expired_by_retention(message_id, config, at_ms)
            )
            released = self._files.slots.release_leaked(index)
            pools = reclaim_pools(self._files.dir[layout.FREE])
            self._files.pool.trim(keep=DEFAULT_POOL_FILES)
            self._files.dedup.expire(config.dedup_window_s)
            on_open, self._recovered_on_open = self._recovered_on_open, SweepReport()
        return SweepReport(
            orphans_removed=orphans + on_open.orphans_removed,
            leases_requeued=promoted.leases_requeued + on_open.leases_requeued,
            delayed_delivered=promoted.delayed_delivered + on_open.delayed_delivered,
            dead_lettered=promoted.dead_lettered + on_open.dead_lettered,
            expired_removed=expired,
            slots_released=released,
            pools_reclaimed=pools + on_open.pools_reclaimed,
        )

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` (from whichever thread notices) when this queue may have changed:
        any process published, acked or requeued, or the queue was closed or deleted. Returns
        the function that unsubscribes. For event loops: pass something thread-safe, such as
        `lambda: loop.call_soon_threadsafe(event.set)`; the Store's shared inotify descriptor
        (`Store.watch_fileno`) must be pumped for changes to be noticed without a blocked get."""
        with self._lock:
            self._synced_index()
            self._listeners.append(listener)
            self._attach_listeners()

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    def _attach_listeners(self) -> None:
        if self._watcher is not None:
            self._watcher.listeners = self._listeners

    def close(self) -> None:
        with self._lock:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = None
            self._index = None
            listeners = list(self._listeners)
        for listener in listeners:  # let waiters look again: they will find out why
            listener()

    def __repr__(self) -> str:
        return f"<dirmq.Queue {self.name!r} at {self.path!r}>"


def _ready_entries(names: list[str]) -> list[tuple[str, layout.Entry]]:
    """`names` parsed, all of them ready messages outside groups (else InvalidArgument)."""
    entries = []
    for name in names:
        entry = parse_entry(name)
        if entry is None or entry.at_ms is not None or entry.group is not None:
            raise InvalidArgument(f"not the name of a ready message outside groups: {name!r}")
        entries.append((name, entry))
    return entries


def _check_id(message_id: str) -> None:
    if not is_id(message_id):
        raise InvalidArgument(f"not a dirmq message id: {str(message_id)[:80]!r}")


def _next_due_s(index: QueueIndex, at_ms: int) -> float:
    """Seconds until the earliest lease or delay in the index falls due (60 if none)."""
    times = [t[0] for t in (index.leased.earliest(), index.delayed.earliest()) if t]
    return max(0.001, (min(times) - at_ms) / 1000) if times else 60.0


def _at(name: str) -> int:
    entry = parse_entry(name)
    return entry.at_ms if entry and entry.at_ms is not None else 0
