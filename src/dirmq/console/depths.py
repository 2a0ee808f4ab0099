"""Every queue's depth for the overview, as `store.census` counts it, without listing a deep
queue's @ready at each refresh.

`census` lists four state directories per queue and opens no queue. A refresh every 2 s of a
root holding one queue of 1,000,000 messages would list that @ready each time (~1 s). Here
what a listing of @ready (and @dead) says, its count and oldest id, is kept by the directory's
mtime: a rename in or out changes it, so an unchanged mtime means an unchanged listing. Since
an mtime ticks coarsely (a jiffy), a listing is kept only when the mtime it was taken under
is more than `SETTLED_S` old: a change after the listing then gives a newer mtime. @leased
and @delayed are listed each time (small; what they say depends on the clock). On a shared
filesystem, where another host's renames may not touch our view of an mtime, and an id may
show in two states, every refresh is a plain census.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dirmq.store import layout
from dirmq.store.census import QueueDepth, census, queue_dirs
from dirmq.store.ids import id_time_us
from dirmq.store.layout import ID_LENGTH, parse_entry
from dirmq.store.message import QueueStats

SETTLED_S = 2.0


@dataclass(frozen=True, slots=True)
class _Listed:
    mtime_ns: int
    count: int
    oldest: str


class Depths:
    """The overview's census of one root (thread-safe; one per worker)."""

    def __init__(self, root: str, shared: bool) -> None:
        self.root = os.path.abspath(root)
        self.shared = shared
        self.listings = 0  # directories listed (tests count them)
        self._kept: dict[str, _Listed] = {}
        self._lock = threading.Lock()

    def all(self) -> Iterator[QueueDepth]:
        if self.shared:
            yield from census(self.root, shared=True)
            return
        for name, path in queue_dirs(self.root):
            try:
                yield QueueDepth(name, self._depth(path))
            except FileNotFoundError:
                continue  # deleted while we looked

    def _depth(self, path: str) -> QueueStats:
        now_ms = time.time_ns() // 1_000_000
        ready, oldest = self._summary(f"{path}/{layout.READY}")
        in_flight = delayed = 0
        for name in self._list(f"{path}/{layout.LEASED}"):
            entry = parse_entry(name)
            if entry is None or entry.at_ms is None:
                continue
            if entry.at_ms > now_ms:
                in_flight += 1
            else:  # expired: any get takes it back first
                ready += 1
                if not oldest or entry.message_id < oldest:
                    oldest = entry.message_id
        for name in self._list(f"{path}/{layout.DELAYED}"):
            entry = parse_entry(name)
            if entry is None or entry.at_ms is None:
                continue
            if entry.at_ms > now_ms:
                delayed += 1
            else:
                ready += 1
        dead, _ = self._summary(f"{path}/{layout.DEAD}")
        age = None if not oldest else max(0.0, time.time() - id_time_us(oldest) / 1e6)
        return QueueStats(ready, in_flight, delayed, dead, age)

    def _summary(self, directory: str) -> tuple[int, str]:
        """(messages, least id) of a directory of ready-style names, kept while unchanged."""
        try:
            mtime_ns = os.stat(directory).st_mtime_ns
        except FileNotFoundError:
            return 0, ""
        with self._lock:
            kept = self._kept.get(directory)
        if kept is not None and kept.mtime_ns == mtime_ns:
            return kept.count, kept.oldest
        count, oldest = 0, ""
        for name in self._list(directory):
            if len(name) == ID_LENGTH:
                if name[16] != "-" or not name[:16].isdigit():
                    continue
                message_id = name
            else:
                entry = parse_entry(name)
                if entry is None or entry.at_ms is not None:
                    continue
                message_id = entry.message_id
            count += 1
            if not oldest or message_id < oldest:
                oldest = message_id
        if time.time_ns() - mtime_ns > SETTLED_S * 1e9:
            with self._lock:
                self._kept[directory] = _Listed(mtime_ns, count, oldest)
        return count, oldest

    def _list(self, directory: str) -> list[str]:
        self.listings += 1
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []
