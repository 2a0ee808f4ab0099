"""The publish path of one queue: check, deduplicate, take capacity tokens, write, commit.

Theory of operation. A batch of messages is checked (once: a message `validate` passed is not
checked again), given ids in publish order, and, on a queue with a capacity, one capacity token
each (all or none, waiting while the queue is full). Each message's file is then written under
no visible name (a recycled file of this process's pool in @free, one claimed from the shared
pool, or a new O_TMPFILE inode; on a shared filesystem the batch's files are written overlapped, as
fsio.py explains) and the whole batch is made visible at once by one group commit
(`writethrough`), or renamed into place and flushed later (`writeback`, `memory`). Anything that
fails before the commit discards every file of the batch and gives back its tokens: all are
stored or none is. Dedup records are written after the message (see dedup.py).

Why it is long: the steps above are one transaction (a failure at any of them undoes the
earlier ones), and where each file goes, @ready or its level's backlog bucket (`_spills`), is
decided per batch with it; split, the undoing would cross modules.
"""

from __future__ import annotations

import errno
import functools
import os
import time
from collections import Counter
from collections.abc import Iterable

from dirmq.errors import (
    DiskFull,
    InvalidArgument,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
    storage_error,
)
from dirmq.store import codec, layout
from dirmq.store.backlog import tree_key
from dirmq.store.bounds import check_optional_seconds, check_seconds, check_timeout
from dirmq.store.clock import due_after_ms, now_ns
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.context import QueueContext
from dirmq.store.expiry import EXPIRES, deadline_ms
from dirmq.store.fsio import PendingFile, create_pending, overlap
from dirmq.store.ids import new_ids
from dirmq.store.message import OutgoingMessage
from dirmq.store.priorities import check_priority
from dirmq.store.view import QueueView

_MAX_VALIDATED = 4096  # validated messages remembered per queue (a server batch is <= 1024)
OPEN_FILES_PER_BATCH = 256  # a batch's files beyond these are closed once written (EMFILE)


class _BucketGone(Exception):
    """A file's backlog bucket could not be made while the batch was being written: nothing of
    the batch is published yet, so it is written again (a failure once files are published is
    not retried: a consumer may hold one already)."""


class Publisher:
    """Publishes to one queue (`Queue.put_many`, `Queue.validate`). Thread-safe."""

    def __init__(self, view: QueueView, context: QueueContext) -> None:
        self.name = view.name
        self._view = view
        self._files = view.files
        self._context = context
        # Messages `validate` passed, by id(): (the message, the config it passed against). The
        # reference keeps the id from being reused while the record lives.
        self._validated: dict[int, tuple[OutgoingMessage, QueueConfig]] = {}

    def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        timeout_s: float | None,
        durability: Durability | str | None,
    ) -> list[str]:
        """`Queue.put_many`."""
        check_timeout("timeout_s", timeout_s)
        config = self._view.config
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

    def validate(self, message: OutgoingMessage) -> None:
        """`Queue.validate`."""
        config = self._view.config
        self._check_outgoing(message, config)
        if type(message.body) is bytes:
            validated = self._validated
            if len(validated) >= _MAX_VALIDATED:  # records of messages never stored: forget
                validated.clear()
            validated[id(message)] = (message, config)

    def forget_validated(self, message: OutgoingMessage, config: QueueConfig) -> bool:
        """Whether `validate` passed `message` against `config`, forgetting that it did: the
        direct path (direct_lease.py) stores it without `put_many`."""
        record = self._validated.pop(id(message), None) if self._validated else None
        return record is not None and record[0] is message and record[1] is config

    def _check_outgoing(self, message: OutgoingMessage, config: QueueConfig) -> None:
        if not isinstance(message.body, bytes | bytearray | memoryview):
            raise InvalidArgument(f"message body must be bytes, got {type(message.body).__name__}")
        if len(message.body) > config.max_message_bytes:
            raise MessageTooLarge.for_queue(self.name, len(message.body), config.max_message_bytes)
        check_optional_seconds("delay_s", message.delay_s)
        if message.ttl_s is not None:
            check_seconds("ttl_s", message.ttl_s, minimum=0.001)
        codec.check_headers(message.headers)
        codec.check_label("group", message.group)
        codec.check_label("dedup_id", message.dedup_id)
        if message.priority:
            check_priority(self.name, message.priority, config)

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
        # The state directory, or a backlog bucket, relative to the queue (QueueFiles.path).
        directory = os.path.relpath(os.path.dirname(published.final_path), self._files.queue_dir)
        name = os.path.basename(published.final_path)
        view = self._view
        with view.lock:
            self._files.remove(view.index, directory, name, published.message_id)

    def _publish_files(
        self,
        outgoing: list[OutgoingMessage],
        config: QueueConfig,
        level: Durability,
        timeout_s: float | None,
    ) -> tuple[list[str], list[PendingFile]]:
        """Write and publish `outgoing` (already validated); their ids and published files, in
        order. A batch that lost a backlog bucket to a refill that emptied and removed it
        between its making and the rename (backlog.py) is written once more: nothing of the
        first try is left."""
        for _attempt in range(2):
            try:
                return self._publish_once(outgoing, config, level, timeout_s)
            except _BucketGone:  # nothing of this try was published: all of it again
                if not os.path.exists(os.path.join(self._files.queue_dir, layout.CONFIG_FILE)):
                    raise QueueNotFound.missing(self.name) from None
        try:
            return self._publish_once(outgoing, config, level, timeout_s)
        except _BucketGone:
            raise QueueNotFound.missing(self.name) from None

    def _publish_once(
        self,
        outgoing: list[OutgoingMessage],
        config: QueueConfig,
        level: Durability,
        timeout_s: float | None,
    ) -> tuple[list[str], list[PendingFile]]:
        if not outgoing:
            return [], []
        view = self._view
        ids = new_ids(len(outgoing))
        index = view.index
        backlog = self._files.backlog
        spills = self._spills(outgoing, config)
        slots: list[str | None] = [None] * len(ids)
        if config.capacity is not None:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            slots = list(self._acquire_slots(ids, config.capacity, deadline))
        pending: list[PendingFile] = []
        try:
            at_ns = now_ns()
            if len(ids) > 1 and self._overlapped():
                self._write_overlapped(ids, outgoing, slots, config, at_ns, pending, spills)
            else:
                for i, (message_id, message, slot) in enumerate(
                    zip(ids, outgoing, slots, strict=True)
                ):
                    expires = deadline_ms(message, config, at_ns)
                    data = self._encode(message_id, message, slot, expires)
                    keep_open = len(pending) < OPEN_FILES_PER_BATCH
                    pending.append(
                        self._write_tmp(message_id, data, message, config, keep_open, spills[i])
                    )
            self._commit(pending, level, config)
        except BaseException as exc:
            if isinstance(exc, DiskFull):
                self._files.pool.release_space()  # recycled files are space the disk needs now
            for f in pending:
                f.discard()
            for message_id, slot in zip(ids, slots, strict=True):
                if slot is not None:
                    self._files.slots.release(slot, message_id, view.index)
            raise
        with view.lock:
            # With inotify the index learns of these files from their own events, in order
            # with everything else; adding them here could resurrect one that another thread
            # claimed in between. Polling hears nothing, so there we add them ourselves.
            index = view.index
            if index is not None and view.polling():
                for f in pending:
                    directory, _, name = os.path.relpath(f.final_path, view.path).rpartition("/")
                    index.add(directory, name)
            if index is not None and any(spills):  # trees it may not hear of (backlog.py)
                index.backlog.update(
                    {
                        tree_key(layout.ready_name(message_id, 0, None, message.priority))
                        for message_id, message, spilled in zip(ids, outgoing, spills, strict=True)
                        if spilled
                    }
                )
        if any(spills):  # the last of each level: what the next batch's `room` looks at
            in_backlog = f"{backlog.dir}/"
            for f, message, spilled in zip(pending, outgoing, spills, strict=True):
                if spilled and f.final_path.startswith(in_backlog):  # not a delayed one
                    backlog.spilled(message.priority, f.final_path)
        if not all(spills):
            into_ready = Counter(
                message.priority
                for f, message, spilled in zip(pending, outgoing, spills, strict=True)
                if not spilled and f.final_path.startswith(f"{self._files.dir[layout.READY]}/")
            )
            for priority, count in into_ready.items():
                backlog.published_into_ready(count, priority)
        return ids, pending

    def _spills(self, outgoing: list[OutgoingMessage], config: QueueConfig) -> list[bool]:
        """Which of `outgoing` go to the backlog rather than @ready (backlog.py): each priority
        level by its own room."""
        index, backlog = self._view.index, self._files.backlog
        levels = config.priority_levels
        rooms: dict[int, int] = {}
        spills: list[bool] = []
        for message in outgoing:
            delay_s = config.delay_s if message.delay_s is None else message.delay_s
            if delay_s > 0:  # into @delayed's bucket: no room of @ready taken
                spills.append(False)
                continue
            level = message.priority
            room = rooms.get(level)
            if room is None:
                count = None if index is None else index.ready_count(level)
                room = backlog.room(count, level, levels)
            spills.append(room <= 0)
            rooms[level] = room - 1
        return spills

    @staticmethod
    def _encode(
        message_id: str, message: OutgoingMessage, slot: str | None, expires_ms: int | None
    ) -> bytes:
        if slot is None and message.group is None and expires_ms is None:  # most messages
            return codec.encode(message.body, message.headers, None, message_id=message_id)
        system = {"Slot": slot} if slot else {}
        if message.group is not None:
            system["Group"] = message.group
        if expires_ms is not None:
            system[EXPIRES] = str(expires_ms)
        return codec.encode(message.body, message.headers, system, message_id=message_id)

    def _overlapped(self) -> bool:
        """Whether a batch's files are written overlapped: on a shared filesystem, where each
        create and write is a network round trip (fsio.py)."""
        context = self._context
        return context.shared or context.group_commit.flush_each(self._files.dir[layout.READY])

    def _write_overlapped(
        self,
        ids: list[str],
        outgoing: list[OutgoingMessage],
        slots: list[str | None],
        config: QueueConfig,
        at_ns: int,
        pending: list[PendingFile],
        spills: list[bool],
    ) -> None:
        """Write the batch's files at once (`fsio.overlap`), appending each written file to
        `pending` (for the caller to discard on failure); raises the first failure. The files
        `spills` says which go to the backlog."""

        def write(i: int) -> PendingFile:
            expires = deadline_ms(outgoing[i], config, at_ns)
            data = self._encode(ids[i], outgoing[i], slots[i], expires)
            keep_open = i < OPEN_FILES_PER_BATCH
            return self._write_tmp(ids[i], data, outgoing[i], config, keep_open, spills[i])

        written, error = overlap(write, range(len(ids)))
        pending.extend(f for f in written if f is not None)
        if error is not None:
            raise error

    def _write_tmp(
        self,
        message_id: str,
        data: bytes,
        message: OutgoingMessage,
        config: QueueConfig,
        keep_open: bool = True,
        spill: bool = False,
    ) -> PendingFile:
        """The message's file, written, to be published (open unless `keep_open` is false);
        `spill`: into the backlog's bucket of its id rather than @ready (backlog.py)."""
        delay_s = config.delay_s if message.delay_s is None else message.delay_s
        tag = None if message.group is None else layout.group_tag(message.group)
        level = message.priority
        files = self._files
        try:
            durable = config.durability is not Durability.MEMORY
            if delay_s > 0:  # into the bucket of its due minute (delays.py)
                due_ms = due_after_ms(delay_s)
                name = layout.timed_name(message_id, 0, due_ms, tag, None, level)
                final = f"{files.delay_buckets.prepare(due_ms, durable)}/{name}"
            elif spill:
                name = layout.ready_name(message_id, 0, tag, level)
                final = f"{files.backlog.prepare(name, durable)}/{name}"
            else:
                name = layout.ready_name(message_id, 0, tag, level)
                final = f"{files.dir[layout.READY]}/{name}"
            if self._context.shared:
                return self._write_beside(final, data, keep_open)
            pool = files.pool
            tmp_dir = files.dir[layout.TMP]
            pending = pool.overwrite_own(final, data)
            if pending is None:
                tmp_name = layout.tmp_name(message_id)
                pending = pool.overwrite_shared(f"{tmp_dir}/{tmp_name}", final, data)
                if pending is None:
                    pending = create_pending(tmp_dir, tmp_name, final, data, self._context.access)
            if not keep_open:
                pending.detach(tmp_dir, layout.tmp_name(message_id))
            if delay_s > 0:  # its bucket made again if a consumer removes it first
                pending.make_dir = functools.partial(files.delay_buckets.remake, due_ms, durable)
            elif spill:  # its bucket made again if a refill removes it before the rename
                pending.make_dir = functools.partial(files.backlog.remake, name, durable)
            return pending
        except FileNotFoundError:
            if spill or delay_s > 0:  # its bucket could not be made (removed, or the queue went)
                # Or it was trusted and removed since: looked at on the retry.
                (files.delay_buckets if delay_s > 0 else files.backlog).forget()
                raise _BucketGone from None
            raise QueueNotFound.missing(self.name) from None
        except OSError as exc:
            raise storage_error(exc, f"writing a message to queue {self.name!r}") from exc

    def _write_beside(self, final: str, data: bytes, keep_open: bool) -> PendingFile:
        """The shared-filesystem mode's new file, written beside its final name rather than in
        @tmp (layout.temp_beside): on GlusterFS the publishing rename then stays on one brick.
        Nothing is recycled on a shared filesystem (pool.py)."""
        final_dir, _, final_name = final.rpartition("/")
        temp = layout.temp_beside(final_name)
        pending = create_pending(final_dir, temp, final, data, self._context.access, unnamed=False)
        if not keep_open:
            pending.close()
        return pending

    def _commit(self, pending: list[PendingFile], level: Durability, config: QueueConfig) -> None:
        """Make the written files visible under their final names (the `publish` transition
        of states.py), flushed as `level` says."""
        if level is Durability.WRITETHROUGH:
            # `each`: the files of a backlog bucket (a new directory each second) are on
            # @ready's filesystem, asked once, not of each bucket.
            context = self._context
            each = self._overlapped()
            journal = context.journal
            # One append and fdatasync of the journal for the group, on a local disk (journal.py).
            if journal is not None and not each and journal.commit(pending):
                return
            context.group_commit.commit(pending, shared=context.shared, each=each)
            return
        # Writeback on a shared filesystem: each file is flushed by a descriptor of its own,
        # taken before the rename (WritebackFlusher.hold).
        held = (
            self._descriptors(pending)
            if level is Durability.WRITEBACK and self._context.shared
            else []
        )
        for i, f in enumerate(pending):
            try:
                f.publish()
            except OSError as exc:
                for g in pending[i:]:
                    g.discard()
                for fd in held[i:]:
                    os.close(fd)
                if held[:i]:  # published before the failure: flushed as promised
                    self._context.writeback.hold(
                        held[:i], config.writeback_delay_s, time.monotonic()
                    )
                if exc.errno == errno.ENOENT:
                    raise QueueNotFound(f"queue {self.name!r} was deleted", self.name) from exc
                raise storage_error(exc, f"publishing to queue {self.name!r}") from exc
        if held:
            self._context.writeback.hold(held, config.writeback_delay_s, time.monotonic())
        elif level is Durability.WRITEBACK:
            self._context.writeback.mark_dirty(config.writeback_delay_s, time.monotonic())

    def _descriptors(self, pending: list[PendingFile]) -> list[int]:
        """A descriptor of each file (`own_descriptor`); on failure none, and nothing stored."""
        fds: list[int] = []
        try:
            for f in pending:
                fds.append(f.own_descriptor())
        except OSError as exc:
            for fd in fds:
                os.close(fd)
            for f in pending:
                f.discard()
            raise storage_error(exc, f"publishing to queue {self.name!r}") from exc
        return fds

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
                    self._files.slots.release(slot, message_id, self._view.index)
            raise
        return taken

    def _acquire_slot(self, message_id: str, capacity: int, deadline: float | None) -> str:
        view = self._view
        while True:
            with view.lock:
                slot = self._files.slots.try_acquire(message_id, capacity, view.synced())
            if slot is not None:
                return slot
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise QueueFull(f"queue {self.name!r} is at its capacity of {capacity} messages")
            # A consumer's ack anywhere frees a slot and wakes us through the watcher.
            view.wait(1.0 if remaining is None else min(remaining, 1.0))
