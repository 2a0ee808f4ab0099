"""Where a publish line's stores run: `StoreTimes`, a line's running mean store time as
measured on the event loop (publish_line.py's PublishLine, direct.py's DirectPath).

A quiet line stores its publish on the event loop: no hop to a pool thread and back. The hop is
not only the hand-off: while a pool thread commits, the event loop and it take turns at the GIL
at every system call either makes (each a futex wake-up and often a context switch: about 90% of
a worker's futex calls at 1,000 msg/s, issue 37). Whether a line is quiet is its gap: the
previous publish longer ago than twice a store. (Also storing on the loop while stores filled
under half of the recent time, whatever the gap, was measured: it cut the server's CPU a message
by up to a quarter and doubled the latency's median, as requests waited while the loop waited
out an fsync: docs/benchmarks.md, issue 37. Not kept.) Under load a pool thread is storing all
the time, the line is never idle, and every store stays on the pool, where the next batch
gathers while one flushes.
"""

from __future__ import annotations

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
    once (the first store of a line goes to the pool and measures the disk), and the loop's
    first store replaces what the pool's fed: blended in, it left a mean of pool stores over
    the limit, and the loop's stores were every PROBE_EVERY-th (issue 37: with the commit
    journal a store on the loop took 0.3-0.6 ms, and the direct path still stored 97% of its
    batches on the pool)."""

    __slots__ = ("_here", "_mean", "_slow")

    def __init__(self) -> None:
        self._mean: float | None = None  # None until the first store
        self._here = False  # the mean includes a store on the event loop
        self._slow = 0  # quiet stores kept on the pool by a slow mean since the last probe

    @property
    def mean(self) -> float | None:
        return self._mean

    def timed(self, took_s: float, here: bool) -> None:
        """A store (`here`: on the event loop) took `took_s`."""
        if here and not self._here:  # the first measure on the loop: the pool's are gone
            self._mean, self._here = took_s, True
        elif here or not self._here:
            mean = self._mean
            self._mean = took_s if mean is None else mean + (took_s - mean) * STORE_TIME_WEIGHT

    def on_loop(self, gap_s: float, below_s: float) -> bool:
        """Whether a store of a line found idle runs on the event loop: stores quicker than
        `below_s` (0: never), and the line quiet (the previous publish over twice a store
        ago); now and then one of a slow mean, to measure again; the next one at once, gap or
        not, of a mean the pool's stores alone fed (they wait for the GIL: it says little)."""
        mean = self._mean
        if mean is None or below_s <= 0:
            return False
        if not self._here:  # measured on the pool only (GIL-slowed): measure on the loop now
            return True
        if gap_s <= 2 * mean:
            return False
        if mean < below_s:
            return True
        self._slow += 1
        if self._slow < PROBE_EVERY:
            return False
        self._slow = 0
        return True
