"""Worker processes for the commit journal's tests: `python -m tests.support.journal_workers
ROLE ...`. Each role prints one line per event to stdout (flushed)."""

from __future__ import annotations

import sys

import dirmq
from dirmq.store.filemodes import root_access
from dirmq.store.journal_replay import recover_journals


def publish(root: str, queue: str) -> None:
    """Publish single messages and batches until killed, printing each publish's ids once it
    has returned (acknowledged)."""
    store = dirmq.Store(root)
    q = store.queue(queue)
    for n in range(1_000_000):
        if n % 2:
            print(q.put(b"single %d" % n), flush=True)
        else:
            print(*q.put_many([b"batch %d.%d" % (n, i) for i in range(5)]), flush=True)


def recover(root: str) -> None:
    """Wait for a line on stdin (so that two start together), recover the root's journals,
    print how many messages this process wrote back."""
    access = root_access(root)  # not a Store: its open would recover before the line came
    sys.stdin.readline()
    print(recover_journals(root, access), flush=True)


ROLES = {"publish": lambda a: publish(a[0], a[1]), "recover": lambda a: recover(a[0])}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
