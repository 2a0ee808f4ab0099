"""The in-memory index one process keeps of a queue, so no per-message operation lists a directory.

Built by one scan when first needed, then kept current by watcher events (every process's
publishes, claims, acks and requeues show up as names appearing and disappearing). The index may be
stale by a few microseconds: a claim of a name another process took a moment ago fails with ENOENT
and the caller moves on. Heaps use lazy deletion and are rebuilt when mostly stale.

Why it is long: every structure here is on the per-message path and kept in step by the same
events (`apply`): the ready heaps (one per priority level), the timed sets of @leased and
@delayed, the group runs; split, each event would be dispatched twice.
"""

from __future__ import annotations

import heapq
import os
import random
import re
from collections import Counter

from dirmq.errors import storage_error
from dirmq.store import layout
from dirmq.store.backlog import is_epoch, is_level_dir, level_dir_level
from dirmq.store.bounds import AT_MS_DIGITS, COUNT_DIGITS
from dirmq.store.ids import ID_PATTERN
from dirmq.store.layout import Entry, level_of, parse_entry
from dirmq.store.watch import Event

_ID_LENGTH = 29  # see ids.py: 16 digits, a dash, 12 hex digits


class _TimedSet:
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
        while (first := self.earliest()) is not None and first[0] <= now_ms:
            _at_ms, message_id, name = heapq.heappop(self._heap)
            self._forget(message_id)
            out.append(name)
        return out

    def clear(self) -> None:
        self.names.clear()
        self.groups.clear()
        self._heap.clear()


class GroupRuns:
    """The groups one get has leased messages of, so it may lease their next ones too.

    A group is leased by one get at a time: every process sees its @leased names (they end in
    the group's tag) and holds the group back until none is left. The get that leased them is
    the exception, up to `limit` messages of the group (None: no limit); a group whose message
    it lost to another process's rename is closed to it (its index was behind: someone else
    has the group now).
    """

    __slots__ = ("limit", "lost", "missed", "taken")

    def __init__(self, limit: int | None = 1) -> None:
        self.limit = limit
        self.taken: Counter[str] = Counter()
        self.lost: set[str] = set()
        self.missed = 0  # claims this get lost to another process (its index was behind)

    def allows(self, tag: str, busy: Counter[str]) -> bool:
        if tag in self.lost:
            return False
        taken = self.taken[tag]
        if taken:
            return self.limit is None or taken < self.limit
        return tag not in busy


def _list(directory: str) -> list[str]:
    """The names in a state directory ([] if it is gone: the queue's deletion is noticed
    elsewhere); StorageError if it cannot be read."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise storage_error(exc, f"listing {directory}") from exc


def _occupied(directory: str) -> bool:
    """Whether `directory` has an entry (its first, if any, is all that is read; False if it
    is gone); StorageError if it cannot be read."""
    try:
        with os.scandir(directory) as entries:
            for _entry in entries:
                return True
        return False
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(exc, f"listing {directory}") from exc


def group_of(name: str) -> str | None:
    """The group tag at the end of a state name, if any (cheaper than a full parse)."""
    _head, sep, tag = name.rpartition("~")
    return tag if sep else None


# A timed name in no group, `<id>.<count>.<at_ms>`, maybe with `+<holder>`: what `_plain_timed`
# takes without `parse_entry` (one match, not a dozen string calls: every other process's lease
# comes this way, each consumed message once in every process watching the queue).
_PLAIN_TIMED_RE = re.compile(
    rf"{ID_PATTERN}\.[0-9]{{1,{COUNT_DIGITS}}}\.([0-9]{{1,{AT_MS_DIGITS}}})"
    rf"(?:\+[0-9a-f]{{{layout.HOLDER_LENGTH}}})?"
)


def _plain_timed(name: str) -> int | None:
    """The time in `name` when it is a timed name in no group, `<id>.<count>.<at_ms>` (maybe
    with `+<holder>`) with an id of the usual shape; else None (then `parse_entry` decides)."""
    match = _PLAIN_TIMED_RE.fullmatch(name)
    return None if match is None else int(match[1])


def parse_at(name: str) -> int:
    entry = parse_entry(name)
    return entry.at_ms or 0 if entry else 0


class QueueIndex:
    def __init__(self) -> None:
        self.ready: dict[str, str] = {}  # id -> name in @ready
        self._ready_heap: list[str] = []  # ids of level 0 (the only level of most queues)
        # Priority levels above 0 (FORMAT.md "Priorities"): a heap of ids per level, and how
        # many of `ready` are of each; `_levels` those levels, highest first. All empty in a
        # queue of one level: its gets take the same path as before levels existed.
        self._level_heaps: dict[int, list[str]] = {}
        self._level_counts: Counter[int] = Counter()
        self._levels: list[int] = []
        self.leased = _TimedSet()
        self.delayed = _TimedSet()
        # Capacity tokens (@slots): listed only when a publish needs them (capacity.py,
        # `Slots.listed`), not on open, so an open costs the same whatever the capacity; until
        # then `slots` holds those seen come since, and `slots_unlisted` says the open found some.
        self.slots: set[str] = set()
        self.slots_unlisted = False
        # The backlog's epoch directories (backlog.py): while there is one, a get that finds
        # @ready short refills it, and a waiting get looks again every BACKLOG_RECHECK_S.
        self.backlog: set[str] = set()

    # -- building and updating -------------------------------------------------------------
    def rescan(self, queue_dir: str) -> None:
        """Replace the index with what the directories hold now. Every directory is listed
        before anything is replaced: a listing that fails (StorageError) leaves the index as
        it was, not emptied, so the messages it knew are still delivered."""
        listed = {
            directory: _list(os.path.join(queue_dir, directory))
            for directory in (layout.READY, layout.LEASED, layout.DELAYED, layout.BACKLOG)
        }
        slots_held = _occupied(os.path.join(queue_dir, layout.SLOTS))
        self.ready.clear()
        self.leased.clear()
        self.delayed.clear()
        self.slots.clear()
        self.backlog.clear()
        self.slots_unlisted = slots_held
        self._scan_ready(listed.pop(layout.READY))
        for directory, names in listed.items():
            for name in names:
                self.add(directory, name)
        # A listing on a shared filesystem may show a file another host is renaming under
        # both names (docs/FORMAT.md, "Filesystems"): an id leased is not also ready (a claim
        # of the other name would only fail, but counts would take it twice).
        for message_id in self.leased.names:
            self.ready.pop(message_id, None)
        self._rebuild_heaps()

    def _rebuild_heaps(self) -> None:
        """Every ready heap afresh from `ready` (no stale entries), with the levels' counts."""
        self._level_heaps.clear()
        self._level_counts.clear()
        plain: list[str] = []
        for message_id, name in self.ready.items():
            if "^" in name and (level := level_of(name)):
                self._level_heaps.setdefault(level, []).append(message_id)
                self._level_counts[level] += 1
            else:
                plain.append(message_id)
        self._ready_heap = plain
        heapq.heapify(plain)
        for heap in self._level_heaps.values():
            heapq.heapify(heap)
        self._levels = sorted(self._level_heaps, reverse=True)

    def _push_ready(self, message_id: str, name: str) -> None:
        """A new ready id onto the heap of its level (once `ready` holds it)."""
        if "^" in name and (level := level_of(name)):
            heap = self._level_heaps.get(level)
            if heap is None:
                heap = self._level_heaps[level] = []
                self._levels = sorted(self._level_heaps, reverse=True)
            heapq.heappush(heap, message_id)
            self._level_counts[level] += 1
            if len(heap) > 2 * self._level_counts[level] + 1024:
                self._rebuild_heaps()
            return
        heapq.heappush(self._ready_heap, message_id)
        if len(self._ready_heap) > 2 * len(self.ready) + 1024:
            self._ready_heap = [i for i, n in self.ready.items() if "^" not in n]
            heapq.heapify(self._ready_heap)

    def _dropped(self, name: str) -> None:
        """Count a ready name of a level leaving `ready` (level 0 is counted by difference)."""
        if "^" in name and (level := level_of(name)):
            self._level_counts[level] -= 1

    def slots_in_use(self) -> bool:
        """Whether any capacity token may be held (then a message's removal frees its own)."""
        return self.slots_unlisted or bool(self.slots)

    def ready_count(self, level: int = 0) -> int:
        """How many ready messages of `level` are in @ready."""
        if not self._level_heaps:
            return len(self.ready) if level == 0 else 0
        if level:
            return self._level_counts[level]
        return len(self.ready) - sum(self._level_counts.values())

    def backlog_levels(self) -> set[int]:
        """The levels whose backlog tree holds something, as far as this index knows."""
        return {level_dir_level(n) if is_level_dir(n) else 0 for n in self.backlog}

    def _scan_ready(self, names: list[str]) -> None:
        # The bulk of a backlog is never-received messages named by their bare id: take those
        # without a regex or an Entry each (this is most of the index build time at 1M).
        ready = self.ready
        for name in names:
            if len(name) == _ID_LENGTH and name[16] == "-" and name[:16].isdigit():
                ready[name] = name
            elif (entry := parse_entry(name)) is not None and entry.at_ms is None:
                ready[entry.message_id] = name

    def rescan_leased(self, queue_dir: str) -> None:
        """Re-read @leased only (a receipt we have not heard of, in polling mode)."""
        names = _list(os.path.join(queue_dir, layout.LEASED))  # before clearing: see rescan
        self.leased.clear()
        for name in names:
            self.add(layout.LEASED, name)

    def apply(self, events: list[Event]) -> None:
        # `add` and `discard`, with the events every consumed message makes in every process
        # (a claim's two, an ack's one) handled in line: each a dict lookup or two.
        add, discard, ready, leased = self.add, self.discard, self.ready, self.leased
        leased_names, id_length = leased.names, layout.ID_LENGTH
        for directory, name, added in events:
            if added:
                if directory == layout.LEASED and leased_names.get(name[:id_length]) == name:
                    continue  # known: most often the echo of this process's own claim
                add(directory, name)
            elif directory == layout.READY:
                if ready.get(message_id := name[:id_length]) == name:
                    del ready[message_id]
                    if self._level_heaps:
                        self._dropped(name)
            elif directory == layout.LEASED:
                leased.discard(name[:id_length], name)
            else:
                discard(directory, name)

    def add(self, directory: str, name: str) -> None:
        if directory == layout.SLOTS:
            self.slots.add(name)
            return
        if directory == layout.BACKLOG:
            if is_epoch(name) or is_level_dir(name):
                self.backlog.add(name)
            return
        if directory == layout.READY:
            if self.ready.get(name[: layout.ID_LENGTH]) == name:
                return  # known: most often the echo of this process's own rename
            # Most names here are bare ids: the check, without an Entry (see _scan_ready).
            if layout.is_bare_id(name):
                message_id = name
            elif (entry := parse_entry(name)) is not None:
                message_id = entry.message_id
            else:
                return
            known = message_id in self.ready
            self.ready[message_id] = name
            if not known:
                self._push_ready(message_id, name)
            return
        if directory == layout.LEASED and self.leased.names.get(name[: layout.ID_LENGTH]) == name:
            return  # known: most often the echo of this process's own claim
        if (timed := _plain_timed(name)) is not None:
            # Another process's lease (or a delay) in no group, the usual name: no regex, no
            # `Entry`, and no entry in parse_entry's cache (each such name is seen once).
            if directory == layout.LEASED:
                self.leased.add_ungrouped(name[: layout.ID_LENGTH], timed, name)
            elif directory == layout.DELAYED:
                self.delayed.add_ungrouped(name[: layout.ID_LENGTH], timed, name)
            return
        entry = parse_entry(name)
        if entry is None or entry.at_ms is None:
            return
        if directory == layout.LEASED:
            self.leased.add(entry, name)
        elif directory == layout.DELAYED:
            self.delayed.add(entry, name)

    def discard(self, directory: str, name: str) -> None:
        # No parse: only names that parsed are in the index, each under its id, which is the
        # name's first ID_LENGTH characters; any other name matches none of them.
        if directory == layout.SLOTS:
            self.slots.discard(name)
            return
        if directory == layout.BACKLOG:
            self.backlog.discard(name)
            return
        message_id = name[: layout.ID_LENGTH]
        if directory == layout.READY:
            if self.ready.get(message_id) == name:
                del self.ready[message_id]
                self._dropped(name)
        elif directory == layout.LEASED:
            self.leased.discard(message_id, name)
        elif directory == layout.DELAYED:
            self.delayed.discard(message_id, name)

    # -- queries -----------------------------------------------------------------------------
    def pop_ready(self, peers: int = 0, runs: GroupRuns | None = None) -> str | None:
        """Take the name of the oldest ready message out of the index (or, with `peers`, one of
        the oldest `peers + 1`, chosen at random to spread many consumers over the head).

        A message of a group is taken only if it is its group's oldest ready one, and only
        while no message of its group is leased, except by the get that `runs` tracks (which
        may go on taking its group's next messages, within its limit per group).
        """
        if not peers and (name := self.pop_plain_head()) is not None:
            return name  # the usual case, without the lists below
        if not self._level_heaps:
            return self._pop_from(self._ready_heap, peers, runs)
        # Highest level first: a lower level is reached only when every higher one has nothing
        # this get may take (empty, or only groups held by other gets).
        for level in self._levels:
            if (name := self._pop_from(self._level_heaps[level], peers, runs)) is not None:
                self._level_counts[level] -= 1
                return name
        return self._pop_from(self._ready_heap, peers, runs)

    def _pop_from(self, heap: list[str], peers: int, runs: GroupRuns | None) -> str | None:
        """`pop_ready` within the ready ids of one level (`heap`)."""
        ready = self.ready
        candidates: list[str] = []
        passed: list[str] = []  # ready, but their group is busy: they stay where they are
        groups_seen: set[str] = set()
        busy = self.leased.groups
        while heap and len(candidates) <= peers:
            message_id = heapq.heappop(heap)
            name = ready.get(message_id)
            if name is None or message_id in candidates or message_id in passed:
                continue
            tag = group_of(name)
            if tag is not None:
                free = tag not in busy if runs is None else runs.allows(tag, busy)
                if not free or tag in groups_seen:
                    passed.append(message_id)
                    continue
                groups_seen.add(tag)
            candidates.append(message_id)
        for message_id in passed:
            heapq.heappush(heap, message_id)
        if not candidates:
            return None
        chosen = candidates.pop(random.randrange(len(candidates))) if peers else candidates.pop()
        for message_id in candidates:
            heapq.heappush(heap, message_id)
        return ready.pop(chosen)

    def pop_plain_head(self) -> str | None:
        """`pop_ready`'s usual case alone: the name of the oldest ready message of the highest
        level that has one, taken out of the index, when it is in no group; None when nothing
        is ready or the head is a group's (whose turn `pop_ready` decides)."""
        for level in self._levels:
            heap = self._level_heaps[level]
            if self._drop_stale(heap):
                if (name := self._take_plain_head(heap)) is not None:
                    self._level_counts[level] -= 1
                return name
        if self._drop_stale(self._ready_heap):
            return self._take_plain_head(self._ready_heap)
        return None

    def _drop_stale(self, heap: list[str]) -> bool:
        """Pop the ids at the top of `heap` that are no longer ready (taken or gone meanwhile:
        stale heap entries); whether a ready id is left on top."""
        ready = self.ready
        while heap:
            if heap[0] in ready:
                return True
            heapq.heappop(heap)
        return False

    def _take_plain_head(self, heap: list[str]) -> str | None:
        """The name of `heap`'s head (ready: `_drop_stale`), taken out of the index; None,
        leaving it, when it is a group's."""
        name = self.ready[heap[0]]
        if "~" in name:
            return None
        del self.ready[heapq.heappop(heap)]
        return name

    def due_by(self, at_ms: int) -> bool:
        """Whether a delay or a lease falls due by `at_ms` (`QueueFiles.promote` has work)."""
        for timed in (self.delayed, self.leased):
            first = timed.earliest()
            if first is not None and first[0] <= at_ms:
                return True
        return False

    def ready_ids_in_order(self) -> list[str]:
        return sorted(self.ready)

    def ready_ids_by_level(self) -> dict[int, list[str]]:
        """The ready ids of each level present, each list oldest first."""
        levels: dict[int, list[str]] = {}
        for message_id, name in self.ready.items():
            levels.setdefault(level_of(name) if "^" in name else 0, []).append(message_id)
        for ids in levels.values():
            ids.sort()
        return levels

    def total(self) -> int:
        """Messages that count towards capacity: ready, leased and delayed."""
        return len(self.ready) + len(self.leased.names) + len(self.delayed.names)

    def locate(self, message_id: str) -> tuple[str, str] | None:
        """(state directory, name) of a message, or None if the index does not know it."""
        if (name := self.ready.get(message_id)) is not None:
            return layout.READY, name
        if (name := self.leased.names.get(message_id)) is not None:
            return layout.LEASED, name
        if (name := self.delayed.names.get(message_id)) is not None:
            return layout.DELAYED, name
        return None
