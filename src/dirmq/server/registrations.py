"""Registrations: the long polls' registrations on queues a worker holds no index of, run on the
event loop when no more polls are coming in.

A poll on such a queue is answered only by a change to come, so its registration (the queue's
watches and a look into each directory: `Queue.watch_if_idle`, or a hand-off to the cold lane)
may wait. Done as each request came, a burst of thousands made every connection behind it wait
the burst's whole registration time, a publish's among them (delivered 0.5-1 s late behind
5,000 polls): the kernel hands the server its connections in arrival order, one loop turn each.
Here they wait while polls keep arriving (a loop turn that added one), so the requests are read
first, and run, at most `PER_TURN` a turn, on the turns that bring none; one that has waited
`MAX_WAIT_S` runs anyway. Nothing is missed by the delay: a registration still watches, then
looks, so what was published before it is found by its look; and a publish this worker handles
meanwhile to a queue whose registration is pending runs that registration at once
(`LongPolls.hurry`), so its poll does not wait for the line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("dirmq.server")
# Registrations a loop turn at most: ~0.05 ms each, so a turn of them is ~1.5 ms, and the
# requests that come meanwhile wait no longer than that.
PER_TURN = 32
# The longest a registration waits for the polls to stop coming: another process's publish to
# its queue reaches the poll this much later at worst (this worker's own: at once). Seconds: a
# burst that outlasts it is back to a registration with each request (at 1 s, a 2-4 s burst of
# 5,000 delivered its publish 0.9-2 s late).
MAX_WAIT_S = 5.0


class Registrations:
    """Steps run in arrival order on the event loop, on turns that added none. A step tells
    its own callers what went wrong (a long poll's, its waiters): one that raises is logged,
    and the steps after it still run."""

    def __init__(self, per_turn: int = PER_TURN, max_wait_s: float = MAX_WAIT_S) -> None:
        self._per_turn = per_turn
        self._max_wait_s = max_wait_s
        self._steps: deque[tuple[float, Callable[[], None]]] = deque()
        self._scheduled = False
        self._added = False  # a step was added since the last turn's look

    def __len__(self) -> int:
        """Steps not yet run (a hurried one included until its turn: it does nothing then)."""
        return len(self._steps)

    def add(self, step: Callable[[], None]) -> None:
        """Run `step()` on a later turn of the running loop (from the loop)."""
        self._steps.append((time.monotonic(), step))
        self._added = True
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        steps = self._steps
        if self._added:  # polls are still coming: only those that waited too long
            self._added = False
            overdue = time.monotonic() - self._max_wait_s
            count = 0
            while count < self._per_turn and count < len(steps) and steps[count][0] <= overdue:
                count += 1
        else:
            count = min(self._per_turn, len(steps))
        for _ in range(count):
            try:
                steps.popleft()[1]()
            except Exception:
                log.exception("a long poll's registration failed")
        if steps:  # the next turn, after the I/O that came meanwhile
            asyncio.get_running_loop().call_soon(self._run)
        else:
            self._scheduled = False
