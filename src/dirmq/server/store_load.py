"""How busy this process's stores are: the share of recent wall time that publish commits
(the publish lines' `put_many`, the direct path's creates) spent storing, wherever they ran.

A quiet line stores its publish on the event loop (publish_line.py, direct.py): no hop to a pool
thread and back. The hop is not only the hand-off: while a pool thread commits, the event loop
and it take turns at the GIL at every system call either makes (each a futex wake-up and often a
context switch: about 90% of a worker's futex calls at 1,000 msg/s, issue 37). Whether a line is
quiet was once its gap alone: the previous publish longer ago than twice a store. At 500
publishes a second a worker, with stores of 0.5 to 1 ms, most gaps are shorter than that, so
most stores hopped, though the stores took only a quarter to a half of the time. So the loop
may also wait out a store while stores fill less than `MAX_LOAD` of the time. Not the load
alone: a pool store's time includes its waits for the GIL, so on a slow disk the load of pool
stores stayed high and kept more of them on the pool than the gap did. Under load (64
concurrent publishers) a pool thread is storing all the time, the line is never idle, the load
is near 1 or more, and every store stays on the pool, where the next batch gathers while one
flushes.
"""

from __future__ import annotations

import math
import time

# Of the last ~WINDOW_S of wall time, the share stores may fill for a quiet line's store to run
# on the event loop. Above it, the loop would spend much of its time waiting out fsyncs: long
# polls then fall behind (with 1.75 ms stores at 1,000 msg/s, a p50 of 2 s instead of 7 ms).
MAX_LOAD = 0.5
WINDOW_S = 0.05  # the time constant of the load's decay: a burst is forgotten within ~0.2 s


class StoreLoad:
    """The stores' share of recent wall time, decaying exponentially (time constant
    `WINDOW_S`). Stores end on any thread; an update lost to a race between two threads (a
    store's time not counted) only makes the next test a little more lenient once."""

    __slots__ = ("_at", "_level")

    def __init__(self) -> None:
        self._level = 0.0  # seconds of store time, decayed to `_at`
        self._at = time.monotonic()

    def load(self, now: float) -> float:
        """The share of the last ~WINDOW_S that stores filled (more than 1 if they overlap)."""
        return self._decayed(now) / WINDOW_S

    def light(self, now: float) -> bool:
        """Whether a store may run on the event loop now, as far as the load goes."""
        return self.load(now) < MAX_LOAD

    def stored(self, took_s: float, now: float) -> None:
        """A store that ended at `now` took `took_s`."""
        self._level = self._decayed(now) + took_s
        self._at = max(now, self._at)

    def _decayed(self, now: float) -> float:
        # Another thread's store may have ended a moment after `now` was read: no decay then.
        return self._level * math.exp(min(self._at - now, 0.0) / WINDOW_S)


# One per process: one event loop a process, and its stores share the disk and the loop.
STORES = StoreLoad()
