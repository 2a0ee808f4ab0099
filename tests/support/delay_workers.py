"""Worker roles for tests/test_delays_review.py, run as real processes (`spawn(module=...)`)."""

from __future__ import annotations

import sys
import time

import dirmq


def promote(root: str, queue: str) -> None:
    """Open a queue and deliver its due delays into @ready (a sweep: no lease taken); say
    "promoting" first, then wait to be killed."""
    q = dirmq.Store(root).queue(queue)
    print("promoting", flush=True)
    q.sweep()
    print("promoted", flush=True)
    time.sleep(600)


ROLES = {"promote": lambda a: promote(a[0], a[1])}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
