"""Capacity tokens: at most N messages in a queue, exactly, across processes and hosts.

A publisher first creates the symlink `@slots/<n> -> <id>` for a free n < N (symlink creation is
atomic and exclusive, so two processes can never hold the same slot), then writes the message
with `Dirmq-Slot: <n>`. Whoever removes the message from the queue removes the slot whose link
still points at that id. A crash between the two steps leaks a slot; `sweep` frees slots whose
message has been gone for over a minute.

A process lists @slots only when it needs every token: its first publish under a capacity and a
sweep (`listed`). Opening a queue reads one entry of it (`QueueIndex.slots_in_use`), so a queue
of a large capacity, holding many tokens, costs its consumers what a small one does to open.
"""

from __future__ import annotations

import os
import random
import time

from dirmq.errors import QueueNotFound, storage_error
from dirmq.store import backlog, delays
from dirmq.store.index import QueueIndex

LEAK_GRACE_S = 60.0
_SLOT_MARKER = b"\nDirmq-Slot: "


class Slots:
    """The `@slots/` directory of one queue. Callers hold the queue's lock, except for
    `release` and `any_held` with no index (plain filesystem calls, safe from any thread)."""

    def __init__(self, queue_name: str, slots_dir: str) -> None:
        self._queue_name = queue_name
        self._dir = slots_dir

    def try_acquire(self, message_id: str, capacity: int, index: QueueIndex) -> str | None:
        """Take a free slot for `message_id`; None if the queue is full right now."""
        used = self.listed(index)
        # Tokens make the limit exact across processes; the index total also counts messages
        # published before the queue had a capacity (they hold no token).
        if max(len(used), index.total()) >= capacity:
            return None
        start = random.randrange(capacity)  # spreads concurrent publishers over the free slots
        for offset in range(capacity):
            slot = str((start + offset) % capacity)
            if slot in used:
                continue
            try:
                os.symlink(message_id, os.path.join(self._dir, slot))
            except FileExistsError:
                used.add(slot)
                continue
            except FileNotFoundError:
                raise QueueNotFound.missing(self._queue_name) from None
            except OSError as exc:
                raise storage_error(exc, "reserving capacity") from exc
            used.add(slot)
            return slot
        return None

    def listed(self, index: QueueIndex) -> set[str]:
        """Every token held (`index.slots`), listing @slots first if this index has not yet:
        after that, the watcher's events keep the set in step."""
        if index.slots_unlisted:
            try:
                names = os.listdir(self._dir)
            except FileNotFoundError:
                raise QueueNotFound.missing(self._queue_name) from None
            except OSError as exc:
                raise storage_error(exc, "listing the capacity tokens") from exc
            # Events drained before this are in the listing; those after it follow as usual.
            index.slots = set(names)
            index.slots_unlisted = False
        return index.slots

    def any_held(self) -> bool:
        """Whether any token exists now (one directory read, for callers without an index)."""
        try:
            with os.scandir(self._dir) as entries:
                return next(entries, None) is not None
        except FileNotFoundError:
            return False

    def release(self, slot: str, message_id: str, index: QueueIndex | None) -> None:
        """Free `slot` if it is still held by `message_id` (it may have been re-used)."""
        path = os.path.join(self._dir, slot)
        try:
            if os.readlink(path) == message_id:
                os.unlink(path)
                if index is not None:
                    index.slots.discard(slot)
        except OSError:
            pass

    @staticmethod
    def slot_of(path: str, index: QueueIndex | None) -> str | None:
        """The slot recorded in the message file at `path`, to release once the file is gone
        (a failed removal must leave the message its token)."""
        if index is not None and not index.slots_in_use():
            return None  # no tokens in use: skip reading the file (the common case, every ack)
        return read_slot(path)

    def release_leaked(self, index: QueueIndex) -> int:
        """Free slots whose message left the queue over a minute ago; returns how many."""
        released = 0
        leaked: dict[str, str] = {}  # slot -> its message, which the index does not know
        for slot in list(self.listed(index)):
            path = os.path.join(self._dir, slot)
            try:
                target = os.readlink(path)
                age_s = time.time() - os.lstat(path).st_mtime
            except OSError:
                continue
            if index.locate(target) is None and age_s > LEAK_GRACE_S:
                leaked[slot] = target
        # The index knows neither the backlog (behind @ready) nor delays of a minute not
        # begun: a slot whose message is there is held, not leaked.
        queue_dir = os.path.dirname(self._dir)
        if leaked:
            behind = backlog.find(queue_dir, set(leaked.values()))
            leaked = {slot: target for slot, target in leaked.items() if target not in behind}
        if leaked and index.delayed.buckets:
            delayed = delays.find(queue_dir, set(leaked.values()))
            leaked = {slot: target for slot, target in leaked.items() if target not in delayed}
        for slot in leaked:
            try:
                os.unlink(os.path.join(self._dir, slot))
                index.slots.discard(slot)
                released += 1
            except FileNotFoundError:
                pass
        return released


def read_slot(path: str) -> str | None:
    """The `Dirmq-Slot` header of a message file, reading only its first block."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    return slot_in(head)


def slot_in(head: bytes) -> str | None:
    """The `Dirmq-Slot` header in the first bytes of a message file."""
    marker = head.find(_SLOT_MARKER, 0, 4096)
    if marker < 0:
        return None
    end = head.find(b"\n", marker + 1)
    return head[marker + len(_SLOT_MARKER) : end].decode("ascii", "replace") or None
