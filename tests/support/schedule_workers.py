"""A schedule runner that SIGKILLs itself at a chosen instant: `python -m
tests.support.schedule_workers ROOT EVENT` runs the root's schedules and, at its first EVENT
("claimed": a tick claimed, not published; "published": published, `.done` not recorded),
prints the tick and kills itself (tests/test_schedules.py)."""

from __future__ import annotations

import os
import signal
import sys
import threading

from dirmq.schedules import runner
from dirmq.store import Store


def main(root: str, event: str) -> None:
    def die(seen: str, name: str, tick: int) -> None:
        if seen == event:
            print(f"{name} {tick}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    runner.hook = die
    with Store(root) as store, runner.Scheduler(store):
        threading.Event().wait(60)  # killed long before


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
