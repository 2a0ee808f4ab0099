"""How a writethrough batch's new files are made durable on a local disk, before any is renamed
into place: one `syncfs`, or an `fsync` of each file, all at once on several threads, whichever
has cost less lately for batches of that size.

Why both, and why chosen at run time: `syncfs` is one call whatever the batch's size, but it
writes back every dirty page of the filesystem, a neighbour's too (another process's big write,
another agent's build), and reports a writeback error met anywhere on it since the file was opened;
per-file flushes write only the batch's files, but on a disk without a journal to merge them
(this project's ext4) each waits for its own device flush. Which costs less changes with the
neighbours: on this machine, shared with other processes, a batch of 32 new 1 KiB files took
9.1 ms by `syncfs` and 6.3 ms by flushes from threads one minute, 5.9 ms and 14.1 ms another,
and 121 ms and 28 ms while a neighbour rewrote a large file (docs/benchmarks.md, "What
was learned"). Both make every file durable before its rename,
so the choice changes no promise and nothing on the disk (docs/FORMAT.md, "Durability").

A batch's cost is its flush's time plus, for flushes from threads, the CPU they took on every
thread: each file is written back and the device flushed from a thread of its own (a wake-up
and a hand-off each), which cost a process publishing batches of 16 on this machine 300-330 µs
of CPU a message against 74-284 by `syncfs` (medians of rounds, the disk shared), CPU that a
server on two cores shared with its load pays in requests not served. A `syncfs`'s own CPU, one
call's, is next to nothing beside its wait and is not counted. So flushes from threads win
only where they save more time than they burn (a neighbour's dirty pages in every `syncfs`:
121 ms against 28).

Each size class (powers of two) keeps the running mean of a batch's cost by the way taken
and the last cost of the other; a batch takes the cheaper, and every EXPLORE_EVERY-th batch of a
class the other, so a neighbour that starts or stops writing is noticed within that many; a try
that cost over twice the cheaper way doubles that interval (up to MAX_EXPLORE_EVERY), so a way
far dearer costs little. The first EXPLORE_EVERY - 1 batches of a class take `syncfs` (the way
before this choice existed).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from dirmq.store import fsio
from dirmq.store.fsio import PendingFile, overlap

SYNCFS = "syncfs"
EACH = "each"  # an fsync of each file, overlapped (fsio.overlap)
EXPLORE_EVERY = 32  # batches of a size class between two tries of the way not taken
# ...doubled after each try that cost over twice the way taken, up to this: a way far dearer (a
# batch's fsyncs once took 139 ms against 17 for its syncfs) costs a try less and less often.
MAX_EXPLORE_EVERY = 1024
WEIGHT = 0.25  # of the newest batch in a way's running mean
_LARGEST_CLASS = 8  # batches of 128 files and more share one record


def size_class(files: int) -> int:
    """The record a batch of `files` is kept in: 2-3 files, 4-7, ... , 128 and more."""
    return min(files.bit_length(), _LARGEST_CLASS)


class DataFlush:
    """Flushes batches of new files (`flush`) by the way that costs less now. Thread-safe: the
    publishing threads of one Store share it (through its GroupCommit)."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._clock = clock
        self._cpu_clock = cpu_clock  # the calling thread's CPU time
        self._lock = threading.Lock()
        self._cost: dict[tuple[int, str], float] = {}  # (size class, way) -> mean seconds
        self._batches: dict[int, int] = {}  # size class -> batches flushed (chosen)
        self._every: dict[int, int] = {}  # size class -> batches between tries, if not 32

    def choose(self, files: int) -> str:
        """The way the next batch of `files` files is flushed (counts it as chosen)."""
        key = size_class(files)
        with self._lock:
            n = self._batches[key] = self._batches.get(key, 0) + 1
            by_syncfs = self._cost.get((key, SYNCFS))
            by_each = self._cost.get((key, EACH))
            explore = n % self._every.get(key, EXPLORE_EVERY) == 0
        if by_syncfs is None or by_each is None:
            return EACH if explore and by_syncfs is not None else SYNCFS
        better, other = (EACH, SYNCFS) if by_each < by_syncfs else (SYNCFS, EACH)
        return other if explore else better

    def record(self, files: int, way: str, seconds: float) -> None:
        """A batch of `files` flushed by `way` at a cost of `seconds` (its time plus its CPU):
        into that way's running mean."""
        cls = size_class(files)
        with self._lock:
            mean = self._cost.get((cls, way))
            other = self._cost.get((cls, EACH if way == SYNCFS else SYNCFS))
            # The way not taken is measured once in EXPLORE_EVERY batches, its mean stale by
            # then: its newest time replaces it (a neighbour that stopped is noticed at once).
            if mean is None or (other is not None and mean > other):
                self._cost[cls, way] = seconds
                if other is not None:  # a try of the way not taken: how soon the next
                    every = self._every.get(cls, EXPLORE_EVERY)
                    far = seconds > 2 * other
                    self._every[cls] = min(2 * every, MAX_EXPLORE_EVERY) if far else EXPLORE_EVERY
            else:
                self._cost[cls, way] = mean + (seconds - mean) * WEIGHT

    def costs(self) -> dict[tuple[int, str], float]:
        """The running means, by (size class, way): what a test or a report reads."""
        with self._lock:
            return dict(self._cost)

    def flush(self, files: list[PendingFile]) -> None:
        """Make the data of `files` (two or more, the first still open) durable; raises the
        first failure (the caller discards the batch: a flush is never retried)."""
        way = self.choose(len(files))
        began = self._clock()
        cpu = 0.0  # a syncfs's: one call's, next to nothing beside its wait
        if way == SYNCFS:
            fsio.syncfs(files[0].fd)  # by the module: what tests that count flushes wrap
        else:
            cpu_clock = self._cpu_clock

            def flush_one(f: PendingFile) -> float:
                """The file flushed; the CPU it took this thread."""
                at = cpu_clock()
                f.flush()
                return cpu_clock() - at

            mine = cpu_clock()
            took, error = overlap(flush_one, files)
            if error is not None:
                raise error
            # This thread's whole share (its file, handing the others out, collecting them),
            # and each other file's on its own thread.
            cpu = cpu_clock() - mine + sum(t for t in took[1:] if t is not None)
        self.record(len(files), way, self._clock() - began + cpu)
