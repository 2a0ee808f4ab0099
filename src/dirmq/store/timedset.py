"""A timed set: the names of @leased (deadlines) or of @delayed's loaded buckets (due times),
by message id, with a heap on the time in each name (lazy deletion, rebuilt when mostly stale);
and the cheap readings of a timed name the index makes per event.
"""

from __future__ import annotations

import heapq
import re
from collections import Counter

from dirmq.store import layout
from dirmq.store.bounds import AT_MS_DIGITS, COUNT_DIGITS
from dirmq.store.ids import ID_PATTERN
from dirmq.store.layout import Entry, parse_entry


class TimedSet:
    """id -> name for @leased or @delayed, with a heap on the time in the name."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.groups: Counter[str] = Counter()  # group tag -> live entries of that group
        self._heap: list[tuple[int, str, str]] = []

    def _forget(self, message_id: str) -> None:
        old = self.names.pop(message_id, None)
        if old is not None and (tag := group_of(old)) is not None:
            self.groups[tag] -= 1
            if not self.groups[tag]:
                del self.groups[tag]

    def add(self, entry: Entry, name: str) -> None:
        self._forget(entry.message_id)
        self.names[entry.message_id] = name
        if entry.group is not None:
            self.groups[entry.group] += 1
        heapq.heappush(self._heap, (entry.at_ms or 0, entry.message_id, name))
        if len(self._heap) > 2 * len(self.names) + 1024:
            self._heap = [(parse_at(n), i, n) for i, n in self.names.items()]
            heapq.heapify(self._heap)

    def add_ungrouped(self, message_id: str, at_ms: int, name: str) -> None:
        """`add` of a name in no group, from the parts that made it (no `Entry`)."""
        if message_id in self.names:
            self._forget(message_id)
        self.names[message_id] = name
        heapq.heappush(self._heap, (at_ms, message_id, name))
        if len(self._heap) > 2 * len(self.names) + 1024:
            self._heap = [(parse_at(n), i, n) for i, n in self.names.items()]
            heapq.heapify(self._heap)

    def discard(self, message_id: str, name: str) -> None:
        if self.names.get(message_id) == name:
            self._forget(message_id)

    def earliest(self) -> tuple[int, str] | None:
        """(time_ms, name) of the earliest live entry, or None."""
        return self._first()

    def _first(self) -> tuple[int, str] | None:
        heap = self._heap
        while heap:
            at_ms, message_id, name = heap[0]
            if self.names.get(message_id) == name:
                return at_ms, name
            heapq.heappop(heap)
        return None

    def pop_due(self, now_ms: int) -> list[str]:
        """Remove and return the names whose time has come, earliest first."""
        out: list[str] = []
        while (first := self._first()) is not None and first[0] <= now_ms:
            _at_ms, message_id, name = heapq.heappop(self._heap)
            self._forget(message_id)
            out.append(name)
        return out

    def clear(self) -> None:
        self.names.clear()
        self.groups.clear()
        self._heap.clear()


def group_of(name: str) -> str | None:
    """The group tag at the end of a state name, if any (cheaper than a full parse)."""
    _head, sep, tag = name.rpartition("~")
    return tag if sep else None


# A timed name in no group, `<id>.<count>.<at_ms>`, maybe with `+<holder>`: what `plain_timed`
# takes without `parse_entry` (one match, not a dozen string calls: every other process's lease
# comes this way, each consumed message once in every process watching the queue).
_PLAIN_TIMED_RE = re.compile(
    rf"{ID_PATTERN}\.[0-9]{{1,{COUNT_DIGITS}}}\.([0-9]{{1,{AT_MS_DIGITS}}})"
    rf"(?:\+[0-9a-f]{{{layout.HOLDER_LENGTH}}})?"
)


def plain_timed(name: str) -> int | None:
    """The time in `name` when it is a timed name in no group, `<id>.<count>.<at_ms>` (maybe
    with `+<holder>`) with an id of the usual shape; else None (then `parse_entry` decides)."""
    match = _PLAIN_TIMED_RE.fullmatch(name)
    return None if match is None else int(match[1])


def parse_at(name: str) -> int:
    entry = parse_entry(name)
    return entry.at_ms or 0 if entry else 0
