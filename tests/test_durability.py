"""Durability levels and group commit, observed through the flush calls the store makes: the
group commit of format 5, with the commit journal off (tests/test_journal.py tests it on)."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.store import fsio

from .support.threads import run_together


@pytest.fixture
def store(root: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(root, journal=False) as s:
        yield s


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Counts fsync/syncfs calls made by the store (still performing them)."""
    counts: Counter[str] = Counter()
    real_fsync, real_syncfs = os.fsync, fsio.syncfs

    def fsync(fd: int) -> None:
        counts["fsync"] += 1
        real_fsync(fd)

    def syncfs(fd: int) -> None:
        counts["syncfs"] += 1
        real_syncfs(fd)

    monkeypatch.setattr(fsio.os, "fsync", fsync)
    monkeypatch.setattr(fsio, "syncfs", syncfs)
    return counts


def test_writethrough_put_flushes_file_and_directory(
    store: dirmq.Store, flushes: Counter[str]
) -> None:
    q = store.create_queue("q")
    flushes.clear()
    q.put(b"x")
    assert flushes == Counter({"fsync": 2})  # the file's data, then the directory entry


def test_put_many_shares_one_group_commit(store: dirmq.Store, flushes: Counter[str]) -> None:
    q = store.create_queue("q")
    flushes.clear()
    q.put_many([b"m%d" % i for i in range(100)])
    assert flushes == Counter({"syncfs": 1, "fsync": 1})
    assert q.stats().ready == 100


def test_publishers_that_arrive_during_a_directory_flush_share_the_next(
    store: dirmq.Store, flushes: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit, made deterministic: the first directory flush is held until every other
    publisher's message is in place (each then only waits to flush the directory), so one
    more flush must serve all of them. (Counting flushes of free-running threads instead
    depends on the disk's timing: after a mass unlink this disk's creates slow tenfold.)"""
    q = store.create_queue("q")
    ready = os.path.join(q.path, "@ready")
    threads = 8
    real_fsync_dir = fsio.fsync_dir
    flushed_dirs: list[str] = []

    def fsync_dir(path: str) -> None:
        if not flushed_dirs:  # the first flush: hold it until the others are waiting for it
            deadline = time.monotonic() + 10
            while len(os.listdir(ready)) < threads and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.2)  # from its rename to its wait a publisher runs a few lines
        flushed_dirs.append(path)
        real_fsync_dir(path)

    monkeypatch.setattr(fsio, "fsync_dir", fsync_dir)
    flushes.clear()
    run_together(threads, lambda: q.put(b"x"))
    assert q.stats().ready == threads
    assert flushed_dirs == [ready, ready], "the first publisher's flush, then one for the rest"
    assert flushes["fsync"] == threads + 2  # each file, and the directory twice


def test_writeback_is_visible_at_once_and_flushed_within_its_delay(
    store: dirmq.Store, flushes: Counter[str]
) -> None:
    config = dirmq.QueueConfig(durability=dirmq.Durability.WRITEBACK, writeback_delay_s=0.2)
    q = store.create_queue("q", config)
    flushes.clear()
    q.put(b"x")
    assert q.get_one() is not None, "writeback messages are visible before any flush"
    assert flushes["syncfs"] == 0
    deadline = time.monotonic() + 3
    while flushes["syncfs"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert flushes["syncfs"] >= 1


def test_memory_durability_never_flushes(store: dirmq.Store, flushes: Counter[str]) -> None:
    q = store.create_queue("q", dirmq.QueueConfig(durability=dirmq.Durability.MEMORY))
    flushes.clear()
    q.put_many([b"a", b"b"])
    q.put(b"c")
    time.sleep(0.1)
    assert flushes == Counter()
    assert q.stats().ready == 3


def test_durability_can_be_chosen_per_put(store: dirmq.Store, flushes: Counter[str]) -> None:
    q = store.create_queue("q", dirmq.QueueConfig(durability=dirmq.Durability.MEMORY))
    flushes.clear()
    q.put(b"important", durability="writethrough")
    assert flushes["fsync"] == 2


def test_hot_path_never_lists_a_directory(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")
    q.put_many([b"%d" % i for i in range(50)])
    assert q.get_one() is not None  # builds the index (one scan)

    def forbidden(*_args: object) -> None:
        raise AssertionError("a per-message operation listed a directory")

    monkeypatch.setattr(os, "listdir", forbidden)
    monkeypatch.setattr(os, "scandir", forbidden)
    monkeypatch.setattr("dirmq.store.index.os.listdir", forbidden)
    for _ in range(20):
        q.put(b"more")
        message = q.get_one()
        assert message is not None
        q.extend(message.receipt or "", 10)
        q.ack(message.receipt or "")
    message = q.get_one()
    assert message is not None
    q.nack(message.receipt or "", delay_s=0.01)
    assert q.delete(q.put(b"by id"))
