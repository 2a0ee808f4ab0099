"""Pub/sub worker processes for crash tests: `python -m tests.support.pubsub_workers ROLE ...`.

Each role prints one line per event (flushed), so the parent can kill it at a precise moment.
"""

from __future__ import annotations

import sys
import time

from dirmq.pubsub import PubSub
from dirmq.store import Store


def take(root: str, name: str, count: int) -> None:
    """Accept `count` messages, print their ids, then hold them until killed."""
    sub = PubSub(Store(root)).subscribe(name)
    taken = 0
    while taken < count:
        delivery = sub.receive(wait_s=10)
        if delivery is None:
            break
        print(delivery.id, flush=True)
        taken += 1
    print("holding", flush=True)
    time.sleep(3600)


def publish(root: str, channel: str, count: int, mode: str) -> None:
    hub = PubSub(Store(root))
    for i in range(count):
        published = hub.publish(channel, f"m{i}".encode(), mode=mode)
        print(published.id, flush=True)


ROLES = {
    "take": lambda a: take(a[0], a[1], int(a[2])),
    "publish": lambda a: publish(a[0], a[1], int(a[2]), a[3]),
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
