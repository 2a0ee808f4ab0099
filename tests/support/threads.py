"""Threads started together, for the tests of what concurrent callers in one process share."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_together(threads: int, work: Callable[[], None]) -> None:
    """Run `work` on `threads` threads released at one instant (a barrier); wait for all."""
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        work()

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
