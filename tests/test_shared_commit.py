"""Group commit in the shared-filesystem mode (issue 19), on the local disk with
`Store(shared=True)`: each file of a batch fsynced (`syncfs` is no flush on FUSE), the batch's
creates, fsyncs and renames overlapped on several threads, and still all or nothing."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.store import fsio
from dirmq.store.config import Durability
from dirmq.store.publishing import OPEN_FILES_PER_BATCH

from .support.threads import run_together


@pytest.fixture
def shared_store(root: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(root, shared=True) as s:
        yield s


class Flushes:
    """Counts the store's fsync/syncfs calls and the threads that made them (still flushing);
    `fail_at` makes the n-th fsync of a message file fail with EIO, as a dying disk would."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.threads: set[str] = set()
        self.fail_at: int | None = None
        self._lock = threading.Lock()

    def wrap(self, name: str, real: Callable[[int], None]) -> Callable[[int], None]:
        def flush(fd: int) -> None:
            with self._lock:
                self.counts[name] += 1
                self.threads.add(threading.current_thread().name)
                failing = self.fail_at is not None and self.counts[name] == self.fail_at
            if failing:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(fd)

        return flush


@pytest.fixture
def flushes(monkeypatch: pytest.MonkeyPatch) -> Flushes:
    seen = Flushes()
    monkeypatch.setattr(fsio.os, "fsync", seen.wrap("fsync", os.fsync))
    monkeypatch.setattr(fsio, "syncfs", seen.wrap("syncfs", fsio.syncfs))
    return seen


def _names(root: Path, queue: str, directory: str) -> list[str]:
    return sorted(os.listdir(root / queue / directory))


def test_a_shared_batch_fsyncs_each_file_on_several_threads(
    shared_store: dirmq.Store, root: Path, flushes: Flushes
) -> None:
    q = shared_store.create_queue("q")
    flushes.counts.clear()
    flushes.threads.clear()
    ids = q.put_many([b"m%d" % i for i in range(64)])
    # 64 files, then the one @ready directory; never a syncfs (it flushes nothing on FUSE).
    assert flushes.counts == Counter({"fsync": 65})
    assert len({t for t in flushes.threads if t.startswith("dirmq-overlap")}) > 1, flushes.threads
    assert _names(root, "q", "@ready") == sorted(ids)
    assert _names(root, "q", "@tmp") == []
    got = q.get(max_count=64)
    assert sorted(m.body for m in got) == sorted(b"m%d" % i for i in range(64))


def test_a_shared_batch_larger_than_its_open_files_flushes_the_closed_ones_too(
    shared_store: dirmq.Store, root: Path, flushes: Flushes
) -> None:
    q = shared_store.create_queue("q")
    count = OPEN_FILES_PER_BATCH + 44
    flushes.counts.clear()
    ids = q.put_many([b"x%d" % i for i in range(count)])
    assert flushes.counts == Counter({"fsync": count + 1})
    assert _names(root, "q", "@ready") == sorted(ids)
    assert _names(root, "q", "@tmp") == []


def test_a_failed_flush_in_a_shared_batch_stores_none_of_it(
    shared_store: dirmq.Store, root: Path, flushes: Flushes
) -> None:
    q = shared_store.create_queue("q")
    flushes.counts.clear()
    flushes.fail_at = 7
    with pytest.raises(dirmq.StorageError):
        q.put_many([b"m%d" % i for i in range(32)])
    assert _names(root, "q", "@ready") == []
    assert _names(root, "q", "@tmp") == []
    flushes.fail_at = None
    q.put_many([b"after"] * 3)  # the store goes on
    assert q.stats().ready == 3


def test_a_shared_batch_with_delays_and_groups_lands_where_each_message_says(
    shared_store: dirmq.Store, root: Path
) -> None:
    q = shared_store.create_queue("q")
    q.put_many(
        [
            dirmq.OutgoingMessage(b"now", group="g1"),
            dirmq.OutgoingMessage(b"later", delay_s=60),
            dirmq.OutgoingMessage(b"plain"),
        ]
    )
    assert len(_names(root, "q", "@ready")) == 2
    assert len(_names(root, "q", "@delayed")) == 1
    assert sorted(m.body for m in q.get(max_count=5, max_per_group=None)) == [b"now", b"plain"]


def test_the_local_disk_keeps_one_syncfs_per_batch(root: Path, flushes: Flushes) -> None:
    with dirmq.Store(root, journal=False) as store:  # the group commit's (not the journal's)
        q = store.create_queue("q")
        assert not store.context.shared
        flushes.counts.clear()
        q.put_many([b"m%d" % i for i in range(50)])
        assert flushes.counts == Counter({"syncfs": 1, "fsync": 1})


def test_concurrent_shared_puts_are_each_flushed(
    shared_store: dirmq.Store, flushes: Flushes
) -> None:
    q = shared_store.create_queue("q")
    flushes.counts.clear()
    per_thread, threads = 20, 6

    def produce() -> None:
        for _ in range(per_thread):
            q.put(b"x")

    run_together(threads, produce)
    assert q.stats().ready == per_thread * threads
    assert flushes.counts["syncfs"] == 0
    # Each file once; the directory fsyncs shared by the puts that wait together.
    assert per_thread * threads < flushes.counts["fsync"] <= 2 * per_thread * threads


def test_a_forked_child_overlaps_with_threads_of_its_own(shared_store: dirmq.Store) -> None:
    q = shared_store.create_queue("q")
    q.put_many([b"parent"] * 8)  # the parent's overlap threads exist now
    pid = os.fork()
    if pid == 0:  # the child: exits without running the parent's atexit hooks or pytest
        code = 1
        try:
            code = 0 if len(q.put_many([b"child"] * 8)) == 8 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert q.stats().ready == 16


def _wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _message_fds(queue_dir: Path) -> int:
    """Descriptors this process holds on files of the queue's state directories."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor)
        if target.startswith(f"{queue_dir}/@") and not os.path.isdir(target):
            count += 1
    return count


def test_writeback_on_a_shared_root_fsyncs_each_file_within_its_delay(
    shared_store: dirmq.Store, flushes: Flushes
) -> None:
    """`syncfs` flushes nothing on FUSE: writeback there fsyncs each published file, by a
    descriptor taken before its rename (a consumer moving it meanwhile changes nothing)."""
    config = dirmq.QueueConfig(durability=Durability.WRITEBACK, writeback_delay_s=0.3)
    q = shared_store.create_queue("wb", config)
    queue_dir = Path(shared_store.root) / "wb"
    flushes.counts.clear()
    q.put_many([b"a", b"b", b"c", b"d", b"e"])
    q.put(b"f")
    assert flushes.counts["fsync"] == 0, "writeback flushes later, not on the put's path"
    assert _message_fds(queue_dir) == 6  # one descriptor held per file
    moved = q.get_one()  # leased (renamed) before the flush
    assert moved is not None
    assert _wait_for(lambda: flushes.counts["fsync"] >= 6)
    assert _wait_for(lambda: _message_fds(queue_dir) == 0), "the flush closes what it held"
    assert shared_store.writeback.last_error is None
    assert q.stats().total == 6


def test_writeback_on_a_shared_root_reports_a_failed_flush(
    shared_store: dirmq.Store, flushes: Flushes
) -> None:
    config = dirmq.QueueConfig(durability=Durability.WRITEBACK, writeback_delay_s=0.05)
    q = shared_store.create_queue("wb", config)
    flushes.counts.clear()
    flushes.fail_at = 1
    q.put_many([b"a", b"b"])
    assert _wait_for(lambda: shared_store.writeback.last_error is not None)
    assert isinstance(shared_store.writeback.last_error, OSError)
    assert shared_store.writeback.last_error.errno == errno.EIO


def test_writeback_on_the_local_disk_holds_nothing_and_syncs_the_filesystem(
    store: dirmq.Store, flushes: Flushes
) -> None:
    config = dirmq.QueueConfig(durability=Durability.WRITEBACK, writeback_delay_s=0.05)
    q = store.create_queue("wb", config)
    flushes.counts.clear()
    q.put_many([b"a", b"b", b"c"])
    assert _message_fds(Path(store.root) / "wb") == 0
    assert _wait_for(lambda: flushes.counts["syncfs"] >= 1)
    assert flushes.counts["fsync"] == 0
