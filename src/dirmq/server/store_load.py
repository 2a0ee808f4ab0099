"""How busy this process's stores are: the share of recent wall time that publish commits
(the publish lines' `put_many`, the direct path's creates) spent storing, wherever they ran.

A quiet line stores its publish on the event loop (publish_line.py, direct.py): no hop to a pool
thread and back. The hop is not only the hand-off: while a pool thread commits, the event loop
and it take turns at the GIL at every system call either makes (each a futex wake-up and often a
context switch: about 90% of a worker's futex calls at 1,000 msg/s, issue 37). Whether a line is
quiet is its gap: the previous publish longer ago than twice a store. At 500 publishes a second
a worker, with stores of 0.5 to 1 ms, most gaps are shorter than that, so most stores hop,
though the stores take only a quarter to a half of the time. So the loop may also wait out a
store while stores fill less than `MAX_LOAD` of the time: off for now, as it cut CPU but
doubled the latency's median. (Not the load alone: a pool store's time includes its waits for
the GIL, so on a slow disk the load of pool stores stayed high and kept more of them on the
pool than the gap did.) Under load (64 concurrent publishers) a pool thread is storing all the
time, the line is never idle, the load is near 1 or more, and every store stays on the pool,
where the next batch gathers while one flushes.
"""

from __future__ import annotations

import math
import time

# Of the last ~WINDOW_S of wall time, the share stores may fill for a quiet line's store to run
# on the event loop even when publishes come closer than twice a store; 0: never (the gap
# decides alone). Off, as measured (issue 37, docs/benchmarks.md): at 0.5, the latency workload
# at 1,000 msg/s cost up to a quarter less server CPU a message, but its p50 went from 2.0-2.9
# ms to 3.6-8 ms (requests wait while the loop waits out an fsync). Worth trying again with
# cheaper commits. Above ~0.5 long polls fall behind (1.75 ms stores at 1,000 msg/s: p50 2 s).
MAX_LOAD = 0.0
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

STORE_TIME_WEIGHT = 0.125  # of the newest store in the running mean of a store's time
# Of the quiet stores a mean over the limit keeps on the pool, every PROBE_EVERY-th runs on the
# event loop all the same, to measure the disk again (a mean measured on the loop only comes
# from stores on the loop).
PROBE_EVERY = 32


class StoreTimes:
    """Where one line's stores run (publish_line.py's PublishLine, direct.py's DirectPath): the
    running mean of a store's time, and the test of a quiet line.

    The mean is measured on the event loop: a pool thread's store takes about twice as long
    (1.2-1.8 ms for one message on the loop against 2.6-3.8 ms on the pool, in the same run of
    issue 37's latency workload on a busy disk: the pool thread waits for the GIL after each
    syscall while the loop is busy), so a mean that pool stores fed stayed over the limit and
    kept every store on the pool. A pool store's time counts only until the loop has stored
    once (the first store of a line goes to the pool and measures the disk)."""

    __slots__ = ("_here", "_mean", "_slow")

    def __init__(self) -> None:
        self._mean: float | None = None  # None until the first store
        self._here = False  # the mean includes a store on the event loop
        self._slow = 0  # quiet stores kept on the pool by a slow mean since the last probe

    @property
    def mean(self) -> float | None:
        return self._mean

    def timed(self, took_s: float, ended: float, here: bool) -> None:
        """A store (`here`: on the event loop) ended at `ended`, taking `took_s`."""
        STORES.stored(took_s, ended)
        if here or not self._here:
            mean = self._mean
            self._mean = took_s if mean is None else mean + (took_s - mean) * STORE_TIME_WEIGHT
            self._here = self._here or here

    def on_loop(self, gap_s: float, now: float, below_s: float) -> bool:
        """Whether a store of a line found idle runs on the event loop: stores quicker than
        `below_s` (0: never), and the line quiet (the previous publish over twice a store ago,
        or the store load light); now and then one of a slow mean, to measure again."""
        mean = self._mean
        if mean is None or below_s <= 0 or not (gap_s > 2 * mean or STORES.light(now)):
            return False
        if mean < below_s:
            return True
        self._slow += 1
        if self._slow < PROBE_EVERY:
            return False
        self._slow = 0
        return True
