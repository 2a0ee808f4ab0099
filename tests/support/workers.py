"""Worker processes for the multi-process and crash tests:
`python -m tests.support.workers ROLE ...`.

Each role prints one line per event to stdout (flushed), so the parent can follow it and kill
the process at a precise moment.
"""

from __future__ import annotations

import os
import sys
import time

import dirmq


def produce(root: str, queue: str, first: int, count: int, batch: int) -> None:
    q = dirmq.Store(root).queue(queue)
    for start in range(first, first + count, batch):
        bodies = [str(n).encode() for n in range(start, min(start + batch, first + count))]
        if len(bodies) == 1:
            q.put(bodies[0])
        else:
            q.put_many(bodies)
    print("done", flush=True)


def consume(root: str, queue: str, idle_s: float, announce: bool = False) -> None:
    """Receive and ack until the queue has been empty for `idle_s`; print each body acked
    (`announce`: and "ready" first, once the queue is open, before the first get)."""
    q = dirmq.Store(root).queue(queue)
    out = sys.stdout
    if announce:
        q.stats()
        print("ready", flush=True)
    while True:
        got = q.get(10, wait_s=idle_s)
        if not got:
            break
        for message in got:
            q.ack(message.receipt or "")
            out.write(message.body.decode() + "\n")
    out.flush()


def hold_leases(root: str, queue: str, count: int, visibility_s: float) -> None:
    """Lease `count` messages, report their ids, then hang (the parent SIGKILLs us)."""
    q = dirmq.Store(root).queue(queue)
    for message in q.get(count, visibility_s=visibility_s):
        print(message.id, flush=True)
    print("holding", flush=True)
    time.sleep(600)


def hold_leases_on_go(root: str, queue: str, count: int, visibility_s: float) -> None:
    """`hold_leases`, started ahead: say "ready" once the queue is open, then lease when the
    parent writes a line (what the parent published in between is leased at once, however
    slowly this interpreter started)."""
    q = dirmq.Store(root).queue(queue)
    q.stats()
    print("ready", flush=True)
    sys.stdin.readline()
    hold_leases(root, queue, count, visibility_s)


def write_forever(root: str, queue: str, size: int, shared: bool | None = None) -> None:
    """Publish large messages until killed, reporting each id once `put` has returned; every
    third one delayed and every fifth in a batch of 3 (each path's own temps)."""
    q = dirmq.Store(root, shared=shared).queue(queue)
    body = os.urandom(size)
    for n in range(100_000):
        if n % 5 == 4:
            print(*q.put_many([body] * 3), flush=True)
        else:
            print(q.put(body, delay_s=0.2 if n % 3 == 2 else None), flush=True)


def ack_loop(root: str, queue: str) -> None:
    """Receive and ack, printing each id *after* its ack returned, until killed or empty."""
    q = dirmq.Store(root).queue(queue)
    while (message := q.get_one(wait_s=5)) is not None:
        q.ack(message.receipt or "")
        print(message.id, flush=True)


def open_queue(root: str, queue: str) -> None:
    """Open a queue (which moves the flat delays of an earlier format into their buckets) and
    say so; then wait to be killed."""
    print("opening", flush=True)
    q = dirmq.Store(root).queue(queue)
    q.stats()
    print("opened", flush=True)
    time.sleep(600)


ROLES = {
    "produce": lambda a: produce(a[0], a[1], int(a[2]), int(a[3]), int(a[4])),
    "consume": lambda a: consume(a[0], a[1], float(a[2]), a[3:] == ["announce"]),
    "hold": lambda a: hold_leases(a[0], a[1], int(a[2]), float(a[3])),
    "hold-on-go": lambda a: hold_leases_on_go(a[0], a[1], int(a[2]), float(a[3])),
    "write": lambda a: write_forever(a[0], a[1], int(a[2]), True if a[3:] == ["shared"] else None),
    "ack": lambda a: ack_loop(a[0], a[1]),
    "open": lambda a: open_queue(a[0], a[1]),
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
