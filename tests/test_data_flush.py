"""How a writethrough batch's data is flushed on a local disk (store/dataflush.py): one `syncfs`
or each file's fsync on several threads, whichever has cost less lately; either way every file
durable before any is visible, all or nothing on a failed flush, and nothing partial after a
SIGKILL. The group commit's, with the commit journal off (its own: tests/test_journal.py)."""

from __future__ import annotations

import errno
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.store import codec, fsio, layout
from dirmq.store.dataflush import (
    EACH,
    EXPLORE_EVERY,
    MAX_EXPLORE_EVERY,
    SYNCFS,
    DataFlush,
    size_class,
)
from dirmq.store.fsck import fsck
from dirmq.store.layout import parse_entry

from .support.flush_workers import each_first
from .support.procs import kill, spawn


@pytest.fixture
def store(root: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(root, journal=False) as s:
        yield s


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_size_class_takes_syncfs_until_the_other_way_is_tried() -> None:
    chooser = DataFlush(FakeClock())
    assert chooser.choose(32) == SYNCFS  # nothing known yet: the way before the choice existed
    chooser.record(32, SYNCFS, 0.004)
    ways = [chooser.choose(32) for _ in range(2, EXPLORE_EVERY + 1)]
    assert ways == [SYNCFS] * (EXPLORE_EVERY - 2) + [EACH]
    assert size_class(32) == size_class(63) != size_class(64)
    assert chooser.choose(64) == SYNCFS  # another class keeps its own record


def test_the_cheaper_way_wins_and_the_other_is_tried_now_and_then() -> None:
    chooser = DataFlush(FakeClock())
    chooser.record(8, SYNCFS, 0.009)
    chooser.record(8, EACH, 0.003)
    ways = Counter(chooser.choose(8) for _ in range(EXPLORE_EVERY * 3))
    assert ways == Counter({EACH: EXPLORE_EVERY * 3 - 3, SYNCFS: 3})
    chooser.record(8, SYNCFS, 0.001)  # a neighbour stopped writing: syncfs got cheap
    chooser.record(8, EACH, 0.0015)  # ...and each file a little dearer
    assert Counter(chooser.choose(8) for _ in range(EXPLORE_EVERY)) == Counter(
        {SYNCFS: EXPLORE_EVERY - 1, EACH: 1}
    )


def test_a_way_far_dearer_is_tried_less_and_less_often() -> None:
    chooser = DataFlush(FakeClock())
    chooser.record(32, SYNCFS, 0.010)
    tries = []
    for n in range(1, 4 * MAX_EXPLORE_EVERY + 1):
        if chooser.choose(32) == EACH:
            tries.append(n)
            chooser.record(32, EACH, 0.100)  # ten times dearer, every time it is tried
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps[:5] == [32, 64, 128, 256, 512] and set(gaps[5:]) == {MAX_EXPLORE_EVERY}
    chooser.record(32, EACH, 0.001)  # then it wins: tried and taken at once, every 32 again
    assert chooser.choose(32) == EACH


class ThreadCpu:
    """A fake CPU clock per thread (`DataFlush`'s `cpu_clock`), advanced by `spend`."""

    def __init__(self) -> None:
        self._local = threading.local()

    def __call__(self) -> float:
        return float(getattr(self._local, "seconds", 0.0))

    def spend(self, seconds: float) -> None:
        self._local.seconds = self() + seconds


class Flushes:
    """The store's flushes, really made: counted, timed on a fake clock (a `syncfs` as dear as
    `syncfs_s`, an fsync `fsync_s`, and `fsync_cpu_s` of its thread's fake CPU time), the
    inode of each file fsynced noted once its fsync has returned, and the n-th fsync failing
    with `fail` when set."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.cpu = ThreadCpu()
        self.counts: Counter[str] = Counter()
        self.flushed: set[int] = set()
        self.syncfs_s, self.fsync_s, self.fsync_cpu_s = 0.010, 0.0001, 0.0
        self.fail: tuple[int, int] | None = None  # (n-th fsync, errno)
        self.lock = threading.Lock()

    def syncfs(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def flush(fd: int) -> None:
            real(fd)
            with self.lock:
                self.counts["syncfs"] += 1
                self.clock.now += self.syncfs_s

        return flush

    def fsync(self, real: Callable[[int], None]) -> Callable[[int], None]:
        def flush(fd: int) -> None:
            with self.lock:
                self.counts["fsync"] += 1
                failing = self.fail is not None and self.counts["fsync"] == self.fail[0]
            if failing:
                assert self.fail is not None
                raise OSError(self.fail[1], os.strerror(self.fail[1]))
            real(fd)
            inode = os.fstat(fd).st_ino
            self.cpu.spend(self.fsync_cpu_s)
            with self.lock:
                self.flushed.add(inode)
                self.clock.now += self.fsync_s

        return flush


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch, clock: FakeClock) -> Flushes:
    seen = Flushes(clock)
    monkeypatch.setattr(fsio.os, "fsync", seen.fsync(os.fsync))
    monkeypatch.setattr(fsio, "syncfs", seen.syncfs(fsio.syncfs))
    return seen


def _names(q: dirmq.Queue, directory: str) -> list[str]:
    return sorted(os.listdir(os.path.join(q.path, directory)))


def test_batches_turn_to_flushing_each_file_while_syncfs_is_dear(
    store: dirmq.Store, flushes: Flushes, clock: FakeClock
) -> None:
    store.group_commit.flush_data = DataFlush(clock, flushes.cpu).flush
    q = store.create_queue("q")
    for _ in range(EXPLORE_EVERY):  # the last one tries each file's fsync: 10x cheaper here
        q.put_many([b"m"] * 8)
    assert flushes.counts["syncfs"] == EXPLORE_EVERY - 1
    flushes.counts.clear()
    ids = q.put_many([b"n%d" % i for i in range(8)])
    assert flushes.counts == Counter({"fsync": 8 + 1})  # each file, then @ready
    assert set(ids) <= {_id_of(n) for n in _names(q, layout.READY)}
    flushes.syncfs_s = flushes.fsync_s / 10  # the neighbour stopped: syncfs wins again
    for _ in range(EXPLORE_EVERY * 2):
        q.put_many([b"m"] * 8)
    flushes.counts.clear()
    q.put_many([b"m"] * 8)
    assert flushes.counts == Counter({"syncfs": 1, "fsync": 1})
    assert q.stats().ready == 8 * (EXPLORE_EVERY * 3 + 2)


def test_flushing_each_file_loses_when_its_cpu_outweighs_the_time_it_saves(
    store: dirmq.Store, flushes: Flushes, clock: FakeClock
) -> None:
    """Each file's fsync quicker than a syncfs (8 x 0.1 ms against 10 ms), but 2 ms of CPU
    each on its thread: the batch's cost is its time and its CPU, so syncfs stays."""
    chooser = DataFlush(clock, flushes.cpu)
    store.group_commit.flush_data = chooser.flush
    flushes.fsync_cpu_s = 0.002
    q = store.create_queue("q")
    for _ in range(EXPLORE_EVERY * 2):  # each file's fsync tried once in 32
        q.put_many([b"m"] * 8)
    costs = chooser.costs()
    assert costs[size_class(8), EACH] == pytest.approx(8 * (0.0001 + 0.002))
    assert costs[size_class(8), SYNCFS] == pytest.approx(0.010)
    flushes.counts.clear()
    for _ in range(EXPLORE_EVERY - 1):
        q.put_many([b"m"] * 8)
    assert flushes.counts["syncfs"] >= EXPLORE_EVERY - 2  # at most one more try of the other
    flushes.fsync_cpu_s = 0.0  # then its CPU is no more than the time it saves: it wins
    for _ in range(EXPLORE_EVERY * 2):
        q.put_many([b"m"] * 8)
    flushes.counts.clear()
    q.put_many([b"m"] * 8)
    assert flushes.counts == Counter({"fsync": 8 + 1})  # each file, then @ready


@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_a_failed_fsync_of_one_file_stores_none_of_the_batch(
    store: dirmq.Store, flushes: Flushes, error: int
) -> None:
    store.group_commit.flush_data = each_first().flush
    q = store.create_queue("q")
    flushes.fail = (7, error)
    expected = dirmq.DiskFull if error == errno.ENOSPC else dirmq.StorageError
    with pytest.raises(expected):
        q.put_many([b"m%d" % i for i in range(32)])
    assert _names(q, layout.READY) == []
    assert _names(q, layout.TMP) == []
    flushes.fail = None
    q.put_many([b"after"] * 3)  # the store goes on
    assert q.stats().ready == 3


def test_no_file_is_visible_before_its_data_is_flushed(
    store: dirmq.Store, flushes: Flushes
) -> None:
    """Publishers on 4 threads, batches flushed both ways (mostly each file's fsync,
    overlapped), while a reader lists @ready over and over: every file it sees was flushed
    before it was visible, and is whole."""
    chooser = each_first()

    def flush_data(files: list[fsio.PendingFile]) -> None:
        chooser.flush(files)  # each file's fsync, or (one batch in EXPLORE_EVERY) a syncfs
        inodes = {os.fstat(f.fd).st_ino for f in files}  # a batch under 256 files: all open
        with flushes.lock:
            flushes.flushed |= inodes

    store.group_commit.flush_data = flush_data
    q = store.create_queue("q")
    ready = os.path.join(q.path, layout.READY)
    stored: list[str] = []
    errors: list[BaseException] = []
    done = threading.Event()
    seen: set[str] = set()

    def publish(n: int) -> None:
        try:
            for i in range(25):
                bodies = [b"%d-%d-%d" % (n, i, k) * 50 for k in range(2 + (n + i) % 30)]
                ids = q.put_many(bodies)
                with flushes.lock:
                    stored.extend(ids)
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            while not done.is_set():
                for name in os.listdir(ready):
                    if name in seen:
                        continue
                    path = os.path.join(ready, name)
                    inode = os.stat(path).st_ino
                    with flushes.lock:
                        assert inode in flushes.flushed, f"{name} visible before its flush"
                    with open(path, "rb") as f:
                        codec.decode(f.read(), _id_of(name))
                    seen.add(name)
        except BaseException as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    publishers = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
    for t in publishers:
        t.start()
    for t in publishers:
        t.join()
    done.set()
    reader.join()
    assert not errors, errors[0]
    assert len(set(stored)) == len(stored) == q.stats().ready
    assert seen, "the reader never saw a file: it checked nothing"


def test_killed_mid_batch_flushing_each_file_leaves_whole_messages_only(root: Path) -> None:
    with dirmq.Store(root) as setup:
        setup.create_queue("q")
    confirmed: list[str] = []
    size = 16 * 1024
    for delay_s in (0.05, 0.11, 0.2):
        writer = spawn("batches", root, "q", size, module="tests.support.flush_workers")
        assert writer.stdout is not None
        first = writer.stdout.readline()
        assert first, "the writer ended before storing a batch"
        confirmed.extend(first.split())
        time.sleep(delay_s)  # then SIGKILL it mid-stream, wherever it is
        confirmed.extend(kill(writer).split())
    with dirmq.Store(root) as store:
        q = store.queue("q")
        q.sweep()
        assert [n for n in _names(q, layout.TMP) if not parse_entry(n)] == []
        seen = set()
        while batch := q.get(100):
            for message in batch:
                assert len(message.body) == size, "a partial message was delivered"
                seen.add(message.id)
            q.ack_many([m.receipt or "" for m in batch])
        missing = set(confirmed) - seen
        assert not missing, f"put_many returned but the message is gone: {sorted(missing)[:5]}"
        assert _names(q, layout.CORRUPT) == []
    report = fsck(root, repair=False)
    assert not report.problems, report.problems


def _id_of(name: str) -> str:
    entry = parse_entry(name)
    assert entry is not None, f"{name!r} is no message's name"
    return entry.message_id
