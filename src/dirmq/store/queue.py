"""One queue: publish, lease, acknowledge, requeue, dead-letter, from any number of processes.

Theory of operation. A message is one immutable file; its state is the directory it sits in and
its name (see `layout`). Every transition is one `rename` (or the final `unlink`), so whichever
process performs it first wins and the others see ENOENT and move on: no locks, which is what makes
the queue safe on NFS too. Each process keeps a `QueueIndex` fed by watcher events, so a get is a
heap pop plus one rename whatever the backlog. Processes that wait (blocking `get`, a put at
capacity) sleep on the watcher, so another process's publish, ack or requeue wakes them at once,
and they also wake when the earliest lease or delay in the index falls due, and promote it
themselves. Expired leases return to `@ready` under their original id, i.e. their FIFO place.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from dirmq.errors import (
    CorruptMessage,
    InvalidArgument,
    MessageNotFound,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    StaleReceipt,
    storage_error,
)
from dirmq.store import codec, layout
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.fsio import PendingFile, create_pending, overwrite_pending
from dirmq.store.ids import id_time_us, is_id, new_id
from dirmq.store.index import QueueIndex
from dirmq.store.layout import parse_entry, parse_receipt
from dirmq.store.message import Message, OutgoingMessage, QueueStats, SweepReport
from dirmq.store.pool import DEFAULT_POOL_FILES, FilePool
from dirmq.store.watch import RESCAN, Watcher, open_watcher

if TYPE_CHECKING:
    from dirmq.store.root import Store

CONFIG_RECHECK_S = 0.5
ORPHAN_GRACE_S = 3600.0  # temp files of processes we cannot check (other hosts) are kept this long
SLOT_GRACE_S = 60.0
_WATCHED = (layout.READY, layout.LEASED, layout.DELAYED, layout.SLOTS)
ProgressFn = Callable[[int], None]  # called with how many items were just processed


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_seconds(name: str, value: float | None) -> None:
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
        self._dir = {d: os.path.join(path, d) for d in layout.STATE_DIRS}
        self._config = config
        self._config_stamp: tuple[int, int] | None = None
        self._config_checked = time.monotonic()
        self._index: QueueIndex | None = None
        self._watcher: Watcher | None = None
        self._pool = FilePool(self._dir[layout.FREE])
        self._recovered_on_open = SweepReport()

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
                    self._config = QueueConfig.loads(f.read())
                self._config_stamp = stamp
        except FileNotFoundError:
            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
        self._config_checked = time.monotonic()

    # -- the index -------------------------------------------------------------------------------
    def _synced_index(self) -> QueueIndex:
        """The index, brought up to date with every change any process made (call under lock)."""
        if self._index is None or self._watcher is None:
            self._open_index()
            assert self._index is not None
            return self._index
        result = self._watcher.drain()
        if getattr(self._watcher, "lost", False):
            self._watcher.close()
            self._watcher = None
            self._open_index()
        elif result == RESCAN:
            self._index.rescan(self.path)
        elif isinstance(result, list) and result:
            self._index.apply(result)
        return self._index

    def _open_index(self) -> None:
        self.reload_config()
        directories = {d: self._dir[d] for d in _WATCHED}
        try:
            # The watcher starts before the scan, so nothing that happens in between is missed.
            self._watcher = open_watcher(
                directories, self._store.watch_mode, self._store.poll_interval_s
            )
        except FileNotFoundError:
            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
        index = QueueIndex()
        index.rescan(self.path)
        self._index = index
        # Recovery on open: what crashed processes left behind is cleaned up now, not later;
        # the next sweep() reports it.
        orphans = self._remove_orphans()
        promoted = self._promote(index, self._config, _now_ms())
        self._recovered_on_open = replace(promoted, orphans_removed=orphans)

    def fileno(self) -> int | None:
        """A file descriptor that becomes readable when the queue changes (None when polling)."""
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
    ) -> str:
        """Publish one message and return its id.

        Returns only once the message is stored at the queue's durability level (`writethrough`:
        on stable storage). At capacity, blocks up to `timeout_s` (None: indefinitely) then
        raises `QueueFull`. Raises `StorageError` (nothing stored, nothing partial visible) if the
        filesystem fails.
        """
        message = OutgoingMessage(body, headers or {}, delay_s)
        return self.put_many([message], timeout_s=timeout_s, durability=durability)[0]

    def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        *,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
    ) -> list[str]:
        """Publish several messages with one group commit; all are stored or none is."""
        _check_seconds("timeout_s", timeout_s)
        config = self.config
        level = Durability(durability) if durability is not None else config.durability
        outgoing = [m if isinstance(m, OutgoingMessage) else OutgoingMessage(m) for m in messages]
        for message in outgoing:
            self._check_outgoing(message, config)
        ids = [new_id() for _ in outgoing]
        slots: list[str | None] = [None] * len(ids)
        if config.capacity is not None:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            slots = list(self._acquire_slots(ids, config.capacity, deadline))
        pending: list[PendingFile] = []
        try:
            now_ms = _now_ms()
            for message_id, message, slot in zip(ids, outgoing, slots, strict=True):
                data = codec.encode(message.body, message.headers, {"Slot": slot} if slot else None)
                pending.append(self._write_tmp(message_id, data, message, config, now_ms))
            self._commit(pending, level, config)
        except BaseException:
            for f in pending:
                f.discard()
            for message_id, slot in zip(ids, slots, strict=True):
                if slot is not None:
                    self._release_slot(slot, message_id)
            raise
        with self._lock:
            if self._index is not None:
                for f in pending:
                    self._index.add(
                        os.path.basename(os.path.dirname(f.final_path)),
                        os.path.basename(f.final_path),
                    )
        return ids

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

    def _write_tmp(
        self,
        message_id: str,
        data: bytes,
        message: OutgoingMessage,
        config: QueueConfig,
        now_ms: int,
    ) -> PendingFile:
        delay_s = config.delay_s if message.delay_s is None else message.delay_s
        if delay_s > 0:
            due_ms = now_ms + round(delay_s * 1000)
            final = os.path.join(
                self._dir[layout.DELAYED], layout.timed_name(message_id, 0, due_ms)
            )
        else:
            final = os.path.join(self._dir[layout.READY], message_id)
        tmp_name = layout.tmp_name(message_id)
        try:
            recycled = os.path.join(self._dir[layout.TMP], tmp_name)
            if self._pool.claim(recycled):
                return overwrite_pending(recycled, final, data)
            return create_pending(self._dir[layout.TMP], tmp_name, final, data)
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
    ) -> Iterator[str]:
        """One capacity token (symlink @slots/<n> -> id) per message, waiting while full."""
        taken: list[tuple[str, str]] = []
        try:
            for message_id in ids:
                slot = self._acquire_slot(message_id, capacity, deadline)
                taken.append((slot, message_id))
        except BaseException:
            for slot, message_id in taken:
                self._release_slot(slot, message_id)
            raise
        return iter(slot for slot, _ in taken)

    def _acquire_slot(self, message_id: str, capacity: int, deadline: float | None) -> str:
        slots_dir = self._dir[layout.SLOTS]
        while True:
            with self._lock:
                index = self._synced_index()
                used = index.slots
                # Tokens make the limit exact across processes; the index total also counts
                # messages published before the queue had a capacity (they hold no token).
                if max(len(used), index.total()) < capacity:
                    start = random.randrange(capacity)
                    for offset in range(capacity):
                        slot = str((start + offset) % capacity)
                        if slot in used:
                            continue
                        try:
                            os.symlink(message_id, os.path.join(slots_dir, slot))
                        except FileExistsError:
                            used.add(slot)
                            continue
                        except FileNotFoundError:
                            raise QueueNotFound(f"queue {self.name!r} does not exist") from None
                        except OSError as exc:
                            raise storage_error(exc, "reserving capacity") from exc
                        used.add(slot)
                        return slot
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise QueueFull(f"queue {self.name!r} is at its capacity of {capacity} messages")
            self._wait(1.0 if remaining is None else min(remaining, 1.0))

    def _release_slot(self, slot: str, message_id: str) -> None:
        path = os.path.join(self._dir[layout.SLOTS], slot)
        try:
            if os.readlink(path) == message_id:
                os.unlink(path)
                if self._index is not None:
                    self._index.slots.discard(slot)
        except OSError:
            pass

    def _release_slot_of(self, path: str, message_id: str) -> None:
        """Free the capacity token of the message file at `path` (read before it goes away)."""
        if self._index is not None and not self._index.slots and self._config.capacity is None:
            return
        slot = _read_slot(path)
        if slot is not None:
            self._release_slot(slot, message_id)

    # -- receiving --------------------------------------------------------------------------------
    def get(
        self, max_count: int = 1, *, visibility_s: float | None = None, wait_s: float = 0.0
    ) -> list[Message]:
        """Lease up to `max_count` messages, oldest first.

        Waits up to `wait_s` for the first message (returns [] if none came). Each message stays
        invisible to others for `visibility_s` (default: the queue's visibility timeout); ack it
        with its receipt before then, or it returns to its FIFO place.
        """
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise InvalidArgument(f"max_count must be a positive integer, got {max_count!r}")
        _check_seconds("visibility_s", visibility_s)
        _check_seconds("wait_s", wait_s)
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                config = self.config
                index = self._synced_index()
                now_ms = _now_ms()
                self._promote(index, config, now_ms)
                visibility = config.visibility_timeout_s if visibility_s is None else visibility_s
                got: list[Message] = []
                while len(got) < max_count:
                    message = self._claim(index, config, now_ms, round(visibility * 1000))
                    if message is None:
                        break
                    got.append(message)
                remaining = deadline - time.monotonic()
                if got or remaining <= 0:
                    return got
                timeout = min(remaining, self._next_due_s(index, now_ms))
            self._wait(timeout)

    def get_one(self, *, visibility_s: float | None = None, wait_s: float = 0.0) -> Message | None:
        got = self.get(1, visibility_s=visibility_s, wait_s=wait_s)
        return got[0] if got else None

    def _next_due_s(self, index: QueueIndex, now_ms: int) -> float:
        times = [t[0] for t in (index.leased.earliest(), index.delayed.earliest()) if t]
        return max(0.001, (min(times) - now_ms) / 1000) if times else 60.0

    def _claim(
        self, index: QueueIndex, config: QueueConfig, now_ms: int, visibility_ms: int
    ) -> Message | None:
        ready_dir, leased_dir = self._dir[layout.READY], self._dir[layout.LEASED]
        while (name := index.pop_ready(config.peers)) is not None:
            entry = parse_entry(name)
            assert entry is not None
            source = os.path.join(ready_dir, name)
            if self._expired_by_retention(entry.message_id, config, now_ms):
                self._remove_file(layout.READY, name, entry.message_id)
                continue
            count = entry.count + 1
            lease = layout.timed_name(entry.message_id, count, now_ms + visibility_ms)
            target = os.path.join(leased_dir, lease)
            try:
                os.rename(source, target)
            except FileNotFoundError:
                continue  # another process claimed or deleted it first
            except OSError as exc:
                raise storage_error(exc, f"leasing a message of queue {self.name!r}") from exc
            index.add(layout.LEASED, lease)
            try:
                decoded = _read_message(target)
            except FileNotFoundError:
                continue  # deleted by id a moment after our claim
            except CorruptMessage:
                self._quarantine(target, lease)
                continue
            return Message(
                id=entry.message_id,
                body=decoded.body,
                headers=decoded.headers,
                receive_count=count,
                published_at_s=id_time_us(entry.message_id) / 1e6,
                receipt=f"{entry.message_id}.{count}",
                lease_deadline_s=(now_ms + visibility_ms) / 1000,
                state="leased",
            )
        return None

    def _expired_by_retention(self, message_id: str, config: QueueConfig, now_ms: int) -> bool:
        if config.retention_s is None:
            return False
        return id_time_us(message_id) / 1000 + config.retention_s * 1000 < now_ms

    def _promote(self, index: QueueIndex, config: QueueConfig, now_ms: int) -> SweepReport:
        """Deliver due delayed messages and requeue (or dead-letter) expired leases."""
        delivered = requeued = dead = 0
        for name in index.delayed.pop_due(now_ms):
            entry = parse_entry(name)
            assert entry is not None
            target = layout.ready_name(entry.message_id, entry.count)
            if self._move(layout.DELAYED, name, layout.READY, target):
                index.add(layout.READY, target)
                delivered += 1
        for name in index.leased.pop_due(now_ms):
            entry = parse_entry(name)
            assert entry is not None
            if config.max_receives is not None and entry.count >= config.max_receives:
                dead += self._dead_letter_file(layout.LEASED, name, config)
                continue
            target = layout.ready_name(entry.message_id, entry.count)
            if self._move(layout.LEASED, name, layout.READY, target):
                index.add(layout.READY, target)
                requeued += 1
        return SweepReport(
            leases_requeued=requeued, delayed_delivered=delivered, dead_lettered=dead
        )

    def _move(self, src_dir: str, src: str, dst_dir: str, dst: str) -> bool:
        """One state transition; False if another process got there first."""
        try:
            os.rename(os.path.join(self._dir[src_dir], src), os.path.join(self._dir[dst_dir], dst))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, f"moving a message of queue {self.name!r}") from exc
        return True

    def _dead_letter_file(self, src_dir: str, name: str, config: QueueConfig) -> int:
        entry = parse_entry(name)
        assert entry is not None
        source = os.path.join(self._dir[src_dir], name)
        self._release_slot_of(source, entry.message_id)
        target_dir = self._store.dead_letter_dir(config.dead_letter_queue)
        if target_dir is not None:
            target = os.path.join(target_dir, entry.message_id)
        else:
            target = os.path.join(
                self._dir[layout.DEAD], layout.dead_name(entry.message_id, entry.count)
            )
        try:
            os.rename(source, target)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise storage_error(exc, f"dead-lettering a message of queue {self.name!r}") from exc
        return 1

    def _quarantine(self, path: str, name: str) -> None:
        try:
            os.rename(path, os.path.join(self._dir[layout.CORRUPT], name))
        except OSError:
            pass

    def _remove_file(self, directory: str, name: str, message_id: str) -> bool:
        """Unlink a message for good (and free its capacity token); False if already gone."""
        path = os.path.join(self._dir[directory], name)
        self._release_slot_of(path, message_id)
        try:
            self._pool.retire(path, message_id)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, f"removing a message of queue {self.name!r}") from exc
        finally:
            if self._index is not None:
                self._index.discard(directory, name)
        return True

    # -- settling leases --------------------------------------------------------------------------
    def _lease_name(self, receipt: str) -> tuple[str, str, int]:
        """(leased file name, id, count) of the live lease behind `receipt`, or StaleReceipt."""
        parsed = parse_receipt(receipt)
        if parsed is None:
            raise InvalidArgument(f"not a dirmq receipt: {str(receipt)[:80]!r}")
        message_id, count = parsed
        index = self._synced_index()
        name = index.leased.names.get(message_id)
        if name is None and self._watcher is not None and self._watcher.fileno() is None:
            # Polling mode: another host's extend may not have been seen yet.
            index.rescan_leased(self.path)
            name = index.leased.names.get(message_id)
        entry = parse_entry(name) if name else None
        if name is None or entry is None or entry.count != count:
            raise StaleReceipt(
                f"receipt {receipt} of queue {self.name!r} is stale: the lease expired and the "
                "message was delivered again, or it was already acknowledged"
            )
        return name, message_id, count

    def _settle(self, receipt: str, action: str, delay_s: float = 0.0) -> str | None:
        """Apply `action` to the lease behind `receipt`, retrying once if it moved meanwhile."""
        for attempt in range(2):
            with self._lock:
                name, message_id, count = self._lease_name(receipt)
                path = os.path.join(self._dir[layout.LEASED], name)
                index = self._index
                assert index is not None  # _lease_name synced it
                try:
                    return self._apply(action, path, name, message_id, count, delay_s, index)
                except FileNotFoundError:
                    if attempt:
                        raise StaleReceipt(f"receipt {receipt} is stale") from None
        return None

    def _apply(
        self,
        action: str,
        path: str,
        name: str,
        message_id: str,
        count: int,
        delay_s: float,
        index: QueueIndex,
    ) -> str | None:
        config = self.config
        if action == "ack":
            self._release_slot_of(path, message_id)
            self._pool.retire(path, message_id)
            index.leased.discard(message_id, name)
            return None
        if action == "extend":
            new = layout.timed_name(message_id, count, _now_ms() + round(delay_s * 1000))
            os.rename(path, os.path.join(self._dir[layout.LEASED], new))
            index.add(layout.LEASED, new)
            return new
        if action == "dead_letter" or (
            config.max_receives is not None and count >= config.max_receives
        ):
            if not os.path.exists(path):
                raise FileNotFoundError(path)
            self._dead_letter_file(layout.LEASED, name, config)
            index.leased.discard(message_id, name)
            return None
        if delay_s > 0:
            new = layout.timed_name(message_id, count, _now_ms() + round(delay_s * 1000))
            os.rename(path, os.path.join(self._dir[layout.DELAYED], new))
            index.add(layout.DELAYED, new)
        else:
            new = layout.ready_name(message_id, count)
            os.rename(path, os.path.join(self._dir[layout.READY], new))
            index.add(layout.READY, new)
        index.leased.discard(message_id, name)
        return None

    def ack(self, receipt: str) -> None:
        """Delete the leased message behind `receipt`. StaleReceipt if that lease is gone."""
        self._settle_mapped(receipt, "ack")

    def nack(self, receipt: str, delay_s: float = 0.0) -> None:
        """Give the message back: ready again at once (in its FIFO place), or after `delay_s`.
        Past the queue's max receives it is dead-lettered instead."""
        _check_seconds("delay_s", delay_s)
        self._settle_mapped(receipt, "nack", delay_s)

    def extend(self, receipt: str, visibility_s: float) -> None:
        """Heartbeat: the lease now ends `visibility_s` from now. The receipt stays valid."""
        _check_seconds("visibility_s", visibility_s)
        self._settle_mapped(receipt, "extend", visibility_s)

    def dead_letter(self, receipt: str) -> None:
        """Move the leased message to the dead-letter queue (or this queue's @dead)."""
        self._settle_mapped(receipt, "dead_letter")

    def _settle_mapped(self, receipt: str, action: str, delay_s: float = 0.0) -> None:
        try:
            self._settle(receipt, action, delay_s)
        except OSError as exc:
            if isinstance(exc, StaleReceipt | QueueNotFound):
                raise
            raise storage_error(exc, f"{action} on queue {self.name!r}") from exc

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """Ack several receipts; returns the failures by receipt (empty when all succeeded)."""
        failures: dict[str, Exception] = {}
        for receipt in receipts:
            try:
                self.ack(receipt)
            except (StaleReceipt, InvalidArgument) as exc:
                failures[receipt] = exc
        return failures

    # -- by id -------------------------------------------------------------------------------------
    def delete(self, message_id: str) -> bool:
        """Delete a message by id, whatever its state and whoever leased it (MQ semantics).
        Returns False if no such message is in the queue."""
        if not is_id(message_id):
            raise InvalidArgument(f"not a dirmq message id: {str(message_id)[:80]!r}")
        with self._lock:
            for _attempt in range(2):
                found = self._locate(message_id)
                if found is None:
                    return False
                directory, name = found
                if self._remove_file(directory, name, message_id):
                    return True
        return False

    def _locate(self, message_id: str) -> tuple[str, str] | None:
        index = self._synced_index()
        found = index.locate(message_id)
        if found is None and self._watcher is not None and self._watcher.fileno() is None:
            # Polling mode: another host may have published it since our last poll.
            index.rescan(self.path)
            found = index.locate(message_id)
        if found is None:
            dead = self._dead_names(message_id)
            if dead:
                return layout.DEAD, dead[0]
        return found

    def _dead_names(self, message_id: str) -> list[str]:
        try:
            return [n for n in os.listdir(self._dir[layout.DEAD]) if n.startswith(message_id)]
        except FileNotFoundError:
            return []

    def peek(self, message_id: str) -> Message:
        """Read a message by id without leasing it; MessageNotFound if absent."""
        if not is_id(message_id):
            raise InvalidArgument(f"not a dirmq message id: {str(message_id)[:80]!r}")
        with self._lock:
            for _attempt in range(3):
                found = self._locate(message_id)
                if found is None:
                    break
                message = self._read_at(*found)
                if message is not None:
                    return message
        raise MessageNotFound(f"no message {message_id} in queue {self.name!r}")

    def browse(self, limit: int | None = None) -> Iterator[Message]:
        """Ready messages in FIFO order, without leasing them (a snapshot; others may take them)."""
        with self._lock:
            ids = self._synced_index().ready_ids_in_order()
            names = [self._index.ready.get(i) for i in ids] if self._index else []
        yielded = 0
        for name in names:
            if limit is not None and yielded >= limit:
                return
            if name is None:
                continue
            message = self._read_at(layout.READY, name)
            if message is not None:
                yielded += 1
                yield message

    def _read_at(self, directory: str, name: str) -> Message | None:
        entry = parse_entry(name)
        if entry is None:
            return None
        try:
            decoded = _read_message(os.path.join(self._dir[directory], name))
        except (FileNotFoundError, CorruptMessage):
            return None
        deadline = entry.at_ms / 1000 if directory == layout.LEASED and entry.at_ms else None
        return Message(
            id=entry.message_id,
            body=decoded.body,
            headers=decoded.headers,
            receive_count=entry.count,
            published_at_s=id_time_us(entry.message_id) / 1e6,
            lease_deadline_s=deadline,
            state=directory.lstrip("@"),
        )

    # -- whole queue -------------------------------------------------------------------------------
    def stats(self) -> QueueStats:
        with self._lock:
            index = self._synced_index()
            now_ms = _now_ms()
            expired = sum(1 for n in index.leased.names.values() if _at(n) <= now_ms)
            due = sum(1 for n in index.delayed.names.values() if _at(n) <= now_ms)
            oldest = min(index.ready, default=None)
            if index.leased.names:
                expired_ids = [i for i, n in index.leased.names.items() if _at(n) <= now_ms]
                oldest = min([*expired_ids, *([oldest] if oldest else [])], default=None)
            age = None if oldest is None else max(0.0, time.time() - id_time_us(oldest) / 1e6)
            try:
                dead = len(os.listdir(self._dir[layout.DEAD]))
            except FileNotFoundError:
                dead = 0
            return QueueStats(
                ready=len(index.ready) + expired + due,
                in_flight=len(index.leased.names) - expired,
                delayed=len(index.delayed.names) - due,
                dead=dead,
                oldest_ready_age_s=age,
            )

    def purge(self, progress: ProgressFn | None = None) -> int:
        """Delete every message (ready, in flight, delayed); returns how many were removed."""
        removed = 0
        with self._lock:
            for directory in (layout.READY, layout.LEASED, layout.DELAYED):
                try:
                    names = os.listdir(self._dir[directory])
                except FileNotFoundError:
                    raise QueueNotFound(f"queue {self.name!r} does not exist") from None
                for name in names:
                    entry = parse_entry(name)
                    if entry is not None and self._remove_file(directory, name, entry.message_id):
                        removed += 1
                    if progress:
                        progress(1)
            self._synced_index()
        return removed

    def sweep(self) -> SweepReport:
        """Recovery: remove orphaned temp files, requeue expired leases, deliver due delays,
        drop messages past retention, free capacity tokens whose message is gone."""
        with self._lock:
            config = self.config
            index = self._synced_index()
            index.rescan(self.path)
            promoted = self._promote(index, config, _now_ms())
            orphans = self._remove_orphans()
            expired = 0
            if config.retention_s is not None:
                now_ms = _now_ms()
                for message_id, name in list(index.ready.items()):
                    if self._expired_by_retention(message_id, config, now_ms) and self._remove_file(
                        layout.READY, name, message_id
                    ):
                        expired += 1
            released = self._release_leaked_slots(index)
            self._pool.trim(keep=DEFAULT_POOL_FILES)
            self._synced_index()
            on_open, self._recovered_on_open = self._recovered_on_open, SweepReport()
        return SweepReport(
            orphans_removed=orphans + on_open.orphans_removed,
            leases_requeued=promoted.leases_requeued + on_open.leases_requeued,
            delayed_delivered=promoted.delayed_delivered + on_open.delayed_delivered,
            dead_lettered=promoted.dead_lettered + on_open.dead_lettered,
            expired_removed=expired,
            slots_released=released,
        )

    def _remove_orphans(self) -> int:
        removed = 0
        tmp_dir = self._dir[layout.TMP]
        try:
            names = os.listdir(tmp_dir)
        except FileNotFoundError:
            return 0
        for name in names:
            path = os.path.join(tmp_dir, name)
            if _is_orphan(path, name):
                try:
                    os.unlink(path)
                    removed += 1
                except FileNotFoundError:
                    pass
        return removed

    def _release_leaked_slots(self, index: QueueIndex) -> int:
        released = 0
        slots_dir = self._dir[layout.SLOTS]
        for slot in list(index.slots):
            path = os.path.join(slots_dir, slot)
            try:
                target = os.readlink(path)
                age_s = time.time() - os.lstat(path).st_mtime
            except OSError:
                continue
            if index.locate(target) is None and age_s > SLOT_GRACE_S:
                try:
                    os.unlink(path)
                    released += 1
                except FileNotFoundError:
                    pass
        return released

    def close(self) -> None:
        with self._lock:
            if self._watcher is not None:
                self._watcher.close()
            self._watcher = None
            self._index = None

    def __repr__(self) -> str:
        return f"<dirmq.Queue {self.name!r} at {self.path!r}>"


def _at(name: str) -> int:
    entry = parse_entry(name)
    return entry.at_ms if entry and entry.at_ms is not None else 0


def _read_message(path: str) -> codec.Decoded:
    with open(path, "rb") as f:
        return codec.decode(f.read())


def _read_slot(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    marker = head.find(b"\nDirmq-Slot: ")
    if marker < 0:
        return None
    end = head.find(b"\n", marker + 1)
    return head[marker + len(b"\nDirmq-Slot: ") : end].decode("ascii", "replace") or None


def _is_orphan(path: str, name: str) -> bool:
    """A temp file no live writer will ever rename: its process died, or it is very old."""
    parsed = layout.parse_tmp(name)
    if parsed is not None and parsed[1] == layout.HOST_TAG:
        try:
            os.kill(parsed[2], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        else:
            if parsed[2] != os.getpid():
                return _older_than(path, ORPHAN_GRACE_S)
            return False
    return _older_than(path, ORPHAN_GRACE_S)


def _older_than(path: str, age_s: float) -> bool:
    try:
        return time.time() - os.lstat(path).st_mtime > age_s
    except FileNotFoundError:
        return False


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
