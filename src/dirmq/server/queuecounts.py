"""Per-queue message counts of one worker, cumulative since it started: what the console's
samples turn into rates (`dirmq.console.samples`).

The metrics count messages without a queue label (their series must stay bounded). These are
kept in the worker's memory instead, one row of `KINDS` per queue: the broker adds to them where
it tells the metrics (`Broker.moved`, once per batch), the Store's events add dead letters,
expired leases and redrives (`events`). A sampler writes them to a file of the worker's own
now and then; a file stays when its worker dies, so sums over every worker's file never go
backwards (as prometheus-client's multiprocess files).
"""

from __future__ import annotations

import threading
from dataclasses import replace

from dirmq.store.events import StoreEvents

# The order of a queue's row (and of every file and sample that carries one).
KINDS = ("published", "delivered", "acked", "nacked", "dead_lettered", "expired", "redriven")
PUBLISHED, DELIVERED, ACKED, NACKED, DEAD_LETTERED, EXPIRED, REDRIVEN = range(len(KINDS))
KIND_INDEX = {kind: index for index, kind in enumerate(KINDS)}


class QueueCounts:
    """Thread-safe (the broker counts on the event loop, the Store's events on any thread)."""

    def __init__(self) -> None:
        self._rows: dict[str, list[int]] = {}
        self._lock = threading.Lock()
        self.changes = 0  # bumped by every `add`: a writer skips an unchanged snapshot

    def add(self, queue: str, kind: int, count: int) -> None:
        with self._lock:
            row = self._rows.get(queue)
            if row is None:
                row = self._rows[queue] = [0] * len(KINDS)
            row[kind] += count
            self.changes += 1

    def snapshot(self) -> tuple[int, dict[str, list[int]]]:
        """(`changes` as of the copy, a copy of every row)."""
        with self._lock:
            return self.changes, {queue: list(row) for queue, row in self._rows.items()}

    def events(self, inner: StoreEvents) -> StoreEvents:
        """`inner` (the metrics' hooks), each failure hook also counted here by queue."""

        def dead_lettered(queue: str, reason: str) -> None:
            self.add(queue, DEAD_LETTERED, 1)
            if inner.dead_lettered is not None:
                inner.dead_lettered(queue, reason)

        def leases_expired(queue: str, count: int) -> None:
            self.add(queue, EXPIRED, count)
            if inner.leases_expired is not None:
                inner.leases_expired(queue, count)

        def redriven(queue: str, count: int) -> None:
            self.add(queue, REDRIVEN, count)
            if inner.redriven is not None:
                inner.redriven(queue, count)

        return replace(
            inner, dead_lettered=dead_lettered, leases_expired=leases_expired, redriven=redriven
        )
