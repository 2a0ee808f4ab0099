"""The driver's list of ready messages to plan from (path mode), listed once, handed out in order.

Listing `@ready` costs about a microsecond per name; following every claim and ack of the read
tasks through the queue's index costs over ten per message. So the driver lists the ready
messages once and hands out the oldest ones batch by batch, listing again when fewer are left
than a batch asks for, or after `STALE_S`. A name another consumer took meanwhile is skipped by
the task that claims it; a message that became ready since (published, given back, due) is seen
at the next listing. When the source polls an empty queue (~80 times a second) the listing is
repeated at most every `RELIST_S` (or 20 times its own duration after a listing that found
nothing to plan: a large queue whose head is a message group), and due messages are promoted at
most every `PROMOTE_S`. While no names are to be had, the source plans batches as counts that
each read task leases with `get` (`stream.py`).
"""

from __future__ import annotations

import time

from dirmq.store import Queue

STALE_S = 10.0
RELIST_S = 0.05
PROMOTE_S = 0.5


class ReadyBacklog:
    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._names: list[str] = []
        self._next = 0  # index of the first name not handed out yet
        self._listed_at = float("-inf")
        self._relist_s = RELIST_S  # the shortest interval between two listings
        self._promoted_at = float("-inf")

    def take(self, count: int, min_count: int = 0) -> list[str]:
        """Up to `count` of the oldest ready names not handed out before ([] if fewer than
        `min_count` are ready)."""
        now = time.monotonic()
        left = len(self._names) - self._next
        if (left < max(count, min_count) and now - self._listed_at >= self._relist_s) or (
            now - self._listed_at >= STALE_S
        ):
            self._relist(now)
            left = len(self._names)
        if left < max(min_count, 1):
            return []
        taken = self._names[self._next : self._next + count]
        self._next += len(taken)
        return taken

    def count_ready(self) -> int:
        """How many messages are ready, groups included, from a fresh listing (which the next
        `take` plans from): cheaper than the queue's index on a large backlog."""
        return len(self._relist(time.monotonic(), groups=True))

    def _relist(self, now: float, groups: bool = False) -> list[str]:
        """List `@ready`; keep the names up to the first group's; return every name listed."""
        promote = now - self._promoted_at >= PROMOTE_S
        listed = self._queue.ready_names(promote=promote, groups=groups)
        grouped = (
            next((i for i, name in enumerate(listed) if "~" in name), None) if groups else None
        )
        self._names = listed if grouped is None else listed[:grouped]
        self._next = 0
        self._listed_at = time.monotonic()
        # A listing that found nothing to plan (an empty queue, or a message group at its head)
        # is not repeated sooner than 20 times its own duration: a large queue held by a group
        # must not be listed on every poll.
        took_s = self._listed_at - now
        self._relist_s = RELIST_S if self._names else max(RELIST_S, 20 * took_s)
        if promote:
            self._promoted_at = now
        return listed
