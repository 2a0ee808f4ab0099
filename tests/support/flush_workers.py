"""Worker processes for the data flush tests: `python -m tests.support.flush_workers ROLE ...`.

Each role prints one line per event to stdout (flushed), so the parent can follow it and kill
the process at a precise moment.
"""

from __future__ import annotations

import sys

import dirmq
from dirmq.store.dataflush import EACH, SYNCFS, DataFlush


def each_first() -> DataFlush:
    """A chooser whose record says a flush of each file is the cheaper way for every batch
    size: batches take it, and every EXPLORE_EVERY-th one `syncfs` (both ways run)."""
    chooser = DataFlush()
    for files in (2, 4, 8, 16, 32, 64, 128, 256):
        chooser.record(files, SYNCFS, 1.0)
        chooser.record(files, EACH, 0.0)
    return chooser


def write_batches(root: str, queue: str, size: int) -> None:
    """Publish batches of 2 to 40 messages of `size` bytes until killed, flushing each file
    (`each_first`), printing each batch's ids once `put_many` has returned."""
    store = dirmq.Store(root, journal=False)  # the group commit's flush, not the journal's
    store.group_commit.flush_data = each_first().flush
    q = store.queue(queue)
    for n in range(100_000):
        batch = 2 + n % 39
        print(*q.put_many([n.to_bytes(4, "big") * (size // 4)] * batch), flush=True)


ROLES = {"batches": lambda a: write_batches(a[0], a[1], int(a[2]))}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
