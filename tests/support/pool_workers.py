"""Worker processes for the recycled-file pool tests:
`python -m tests.support.pool_workers ROLE ...`.

Each role prints one line per event to stdout (flushed), so the parent can follow it and kill
the process at a precise moment.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time

import dirmq
from dirmq.store import ownpool

from .procs import spawn


def spawn_worker(*args: object) -> subprocess.Popen[str]:
    """Start `python -m tests.support.pool_workers ARGS` (the parent's side of this module)."""
    return spawn(*args, module="tests.support.pool_workers")


def kill_reading_all(proc: subprocess.Popen[str]) -> str:
    """SIGKILL `proc`; the rest of its output, including lines `readline` already buffered."""
    assert proc.stdout is not None
    proc.kill()
    with proc.stdout:
        rest = proc.stdout.read()
    proc.wait(timeout=30)
    return rest


def body_for(n: int) -> bytes:
    """A body that says how long it must be (sizes vary, so recycled files grow and shrink)."""
    return f"{n}:".encode() + b"x" * (n % 3000)


def well_formed(body: bytes) -> bool:
    head, _, rest = body.partition(b":")
    return head.isdigit() and len(rest) == int(head) % 3000


def ack_some(root: str, queue: str, count: int, then: str) -> None:
    """Lease and ack `count` messages (filling this process's own pool), wait until the reaper
    blanked them, print "acked", then exit normally (`then` = "exit") or hang until SIGKILLed
    ("hang"); with "unreaped", the reaper is stopped first: the acked files stay unblanked in
    the pool, as when a process is killed right after its acks, then it hangs."""
    q = dirmq.Store(root).queue(queue)
    if then == "unreaped":
        ownpool.reaper.stop(timeout_s=5.0)
    for message in q.get(count):  # single acks: with "unreaped" nothing blanks them
        q.ack(message.receipt or "")
    if then != "unreaped":
        assert ownpool.wait_reaped(10)
    print("acked", flush=True)
    if then in ("hang", "unreaped"):
        time.sleep(600)


def churn(root: str, queue: str) -> None:
    """Publish batches and ack about half of what it gets, forever: puts overwrite the files its
    own acks retired. Prints "put <ids>" once put_many returned, "acked <id>" once ack did."""
    q = dirmq.Store(root).queue(queue)
    rng = random.Random()
    while True:
        ids = q.put_many([body_for(rng.randrange(100_000)) for _ in range(rng.randrange(1, 40))])
        print("put", *ids, flush=True)
        for message in q.get(len(ids) // 2 + 1):
            if not well_formed(message.body):
                print("malformed", message.id, flush=True)
            try:
                q.ack(message.receipt or "")
            except dirmq.StaleReceipt:  # a slow patch outlasted the lease: someone else's now
                continue
            print("acked", message.id, flush=True)


def drain(root: str, queue: str) -> None:
    """Lease and ack 20 messages at a time until killed; prints "acked <ids>" once each
    ack_many returned (so every id printed was acknowledged)."""
    q = dirmq.Store(root).queue(queue)
    while True:
        got = q.get(20, wait_s=1.0)
        failures = q.ack_many([m.receipt or "" for m in got])
        print("acked", *(m.id for m in got if (m.receipt or "") not in failures), flush=True)


ROLES = {
    "ack_some": lambda a: ack_some(a[0], a[1], int(a[2]), a[3]),
    "churn": lambda a: churn(a[0], a[1]),
    "drain": lambda a: drain(a[0], a[1]),
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
