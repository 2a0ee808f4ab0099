"""Recycled message files: this process's own pool, the shared pool, and what happens to the
pool of a process that dies (real SIGKILLs) or exits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import dirmq
from dirmq.store import layout, ownpool, pool, poolreclaim
from dirmq.store.filemodes import Access
from dirmq.store.fsck import Kind, fsck
from dirmq.store.processes import current

from .support.pool_workers import kill_reading_all, well_formed
from .support.pool_workers import spawn_worker as spawn
from .support.procs import dead_pid


def free_dir(q: dirmq.Queue) -> Path:
    return Path(q.path, layout.FREE)


def pool_dirs(q: dirmq.Queue) -> list[Path]:
    return sorted(p for p in free_dir(q).iterdir() if p.is_dir())


def loose_files(q: dirmq.Queue) -> list[str]:
    return sorted(p.name for p in free_dir(q).iterdir() if p.is_file())


def inode_of(q: dirmq.Queue, directory: str, name: str) -> int:
    return os.stat(os.path.join(q.path, directory, name)).st_ino


def test_own_pool_recycles_without_a_claim_rename(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("own")
    q.put_many([b"a" * 50, b"b" * 10])
    got = q.get(2)
    inodes = {inode_of(q, layout.LEASED, n) for n in os.listdir(Path(q.path, layout.LEASED))}
    for message in got:
        q.ack(message.receipt or "")
    assert ownpool.wait_reaped(5)  # blanked by the reaper: only now may a put reuse them
    (own,) = pool_dirs(q)
    host, _pid_ns, pid, _rest = own.name.split(".")
    assert (host, pid) == (layout.HOST_TAG, str(os.getpid()))
    assert sorted(os.listdir(own)) == sorted(m.id for m in got)
    assert loose_files(q) == []

    renames: list[tuple[str, str]] = []
    real_rename = os.rename

    def counting_rename(src: str, dst: str, **dir_fds: int | None) -> None:
        renames.append((src, dst))
        real_rename(src, dst, **dir_fds)

    monkeypatch.setattr(os, "rename", counting_rename)
    ids = q.put_many([b"shorter", b"a longer body than either file held before" * 2])
    monkeypatch.setattr(os, "rename", real_rename)
    assert [os.path.dirname(d) for _, d in renames] == [os.path.join(q.path, layout.READY)] * 2
    assert os.listdir(own) == []
    assert {inode_of(q, layout.READY, i) for i in ids} == inodes
    assert [m.body for m in q.get(2)] == [
        b"shorter",
        b"a longer body than either file held before" * 2,
    ]


def test_own_pool_is_bounded_then_the_shared_pool_takes_over(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ownpool, "OWN_POOL_FILES", 3)
    monkeypatch.setattr(pool, "DRAIN_KEEP_FILES", 0)  # a drain keeps no more than that
    q = store.create_queue("bounded")
    q.put_many([b"%d" % i for i in range(5)])
    for message in q.get(5):
        q.ack(message.receipt or "")
    assert ownpool.wait_reaped(5)
    (own,) = pool_dirs(q)
    assert len(os.listdir(own)) == 3 and len(loose_files(q)) == 2
    q.put_many([b"x"] * 5)  # own files first, then shared ones (claimed through @tmp)
    assert os.listdir(own) == [] and loose_files(q) == []
    assert os.listdir(Path(q.path, layout.TMP)) == []


def test_removed_own_pool_directory_is_not_an_error(store: dirmq.Store) -> None:
    q = store.create_queue("gone")
    q.put_many([b"1", b"2"])
    for message in q.get(2):
        q.ack(message.receipt or "")
    for directory in pool_dirs(q):  # e.g. someone emptied @free by hand
        for name in os.listdir(directory):
            os.unlink(directory / name)
        directory.rmdir()
    q.put(b"3")  # the pool's files are gone: a new file
    message = q.get_one()
    assert message is not None and message.body == b"3"
    q.ack(message.receipt or "")  # the pool directory is made again
    assert len(pool_dirs(q)) == 1
    q.put(b"4")
    assert [m.body for m in q.get(2)] == [b"4"]


def test_a_forked_child_never_writes_into_its_parents_pool(store: dirmq.Store) -> None:
    q = store.create_queue("fork")
    q.put(b"parent's")
    message = q.get_one()
    assert message is not None
    q.ack(message.receipt or "")
    assert ownpool.wait_reaped(5)
    (own,) = pool_dirs(q)
    (recycled,) = os.listdir(own)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            child_id = q.put(b"child's")
            os.write(write_end, child_id.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        child_id = reader.read().decode()
    assert os.waitpid(pid, 0)[1] == 0
    assert os.listdir(own) == [recycled], "the child took a file of its parent's pool"
    assert inode_of(q, layout.READY, child_id) != os.stat(own / recycled).st_ino
    mine = q.put(b"parent's again")
    assert not os.path.exists(own / recycled)
    assert {m.id: m.body for m in q.get(5)} == {child_id: b"child's", mine: b"parent's again"}


def test_pool_of_a_killed_process_is_reclaimed_and_reused(root: Path) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("k")
    q.put_many([b"%d" % i for i in range(20)])
    worker = spawn("ack_some", root, "k", 20, "hang")
    assert worker.stdout is not None
    assert worker.stdout.readline().strip() == "acked"
    kill_reading_all(worker)
    (dead,) = pool_dirs(q)
    assert dead.name.split(".")[2] == str(worker.pid)
    retired = {os.stat(p).st_ino for p in dead.iterdir()}
    assert len(retired) == 20

    report = fsck(root, repair=False)
    found = [p for p in report.problems if p.kind is Kind.ORPHAN_POOL]
    assert [p.path for p in found] == [str(dead)] and report.ok  # a notice: not damage

    reopened = dirmq.Store(root).queue("k")
    assert reopened.stats().total == 0  # opening the queue reclaims the dead pool
    assert pool_dirs(reopened) == [] and len(loose_files(reopened)) == 20
    assert reopened.sweep().pools_reclaimed == 1
    ids = reopened.put_many([b"again"] * 20)
    assert {inode_of(reopened, layout.READY, i) for i in ids} == retired
    assert loose_files(reopened) == []


def test_fsck_repair_reclaims_a_dead_pool(root: Path) -> None:
    q = dirmq.Store(root).create_queue("f")
    q.put_many([b"x", b"y"])
    worker = spawn("ack_some", root, "f", 2, "hang")
    assert worker.stdout is not None
    worker.stdout.readline()
    kill_reading_all(worker)
    report = fsck(root, repair=True)
    assert [(p.kind, p.repaired) for p in report.problems] == [(Kind.ORPHAN_POOL, True)]
    assert pool_dirs(q) == [] and len(loose_files(q)) == 2
    assert fsck(root, repair=False).problems == ()


def test_a_process_that_exits_hands_its_pool_back(root: Path) -> None:
    q = dirmq.Store(root).create_queue("e")
    q.put_many([b"1", b"2", b"3"])
    worker = spawn("ack_some", root, "e", 3, "exit")
    assert worker.stdout is not None and worker.stdout.read().strip() == "acked"
    assert worker.wait(timeout=30) == 0
    worker.stdout.close()
    assert pool_dirs(q) == [] and len(loose_files(q)) == 3


def test_a_live_process_keeps_its_pool(root: Path) -> None:
    q = dirmq.Store(root).create_queue("live")
    q.put_many([b"1", b"2"])
    worker = spawn("ack_some", root, "live", 2, "hang")
    try:
        assert worker.stdout is not None
        worker.stdout.readline()
        (theirs,) = pool_dirs(q)
        assert dirmq.Store(root).queue("live").sweep().pools_reclaimed == 0
        report = fsck(root, repair=True)
        assert report.problems == ()
        assert len(os.listdir(theirs)) == 2
        q.put(b"3")  # never from another live process's pool
        assert len(os.listdir(theirs)) == 2
    finally:
        kill_reading_all(worker)


def test_fsck_unlinks_a_recycled_file_that_is_also_a_message(store: dirmq.Store) -> None:
    # What a machine crash can leave on a filesystem without ordered metadata: a retirement
    # or a publish whose source entry came back next to its target.
    q = store.create_queue("linked")
    message_id = q.put(b"keep me")
    os.link(Path(q.path, layout.READY, message_id), free_dir(q) / message_id)
    report = fsck(store.root, repair=True)
    assert [(p.kind, p.repaired) for p in report.problems] == [(Kind.LINKED_FREE, True)]
    assert loose_files(q) == []
    message = q.get_one()
    assert message is not None and message.body == b"keep me"


def test_reclaiming_never_reuses_a_file_with_another_name_nor_one_not_blanked(root: Path) -> None:
    q = dirmq.Store(root).create_queue("r")
    message_id = q.put(b"published")
    dead = free_dir(q) / f"{layout.HOST_TAG}.{current().pid_ns}.{dead_pid()}.1-0badc0de"
    dead.mkdir()
    os.link(Path(q.path, layout.READY, message_id), dead / "x")
    (dead / "y").write_bytes(bytes(7))  # blanked when it was retired
    (dead / "z").write_bytes(b"an acked body")  # its owner died before blanking it
    assert poolreclaim.reclaim_pools(str(free_dir(q))) == 1
    assert not dead.exists() and loose_files(q) == ["y"]
    assert os.stat(Path(q.path, layout.READY, message_id)).st_nlink == 1


def test_killed_churning_process_loses_nothing_and_exposes_nothing_partial(root: Path) -> None:
    q = dirmq.Store(root).create_queue("churn", dirmq.QueueConfig(visibility_timeout_s=1.0))
    confirmed: set[str] = set()
    acked: set[str] = set()
    kills = (0.05, 0.11, 0.23, 0.31, 0.47)
    for delay_s in kills:
        worker = spawn("churn", root, "churn")
        # Its first batch stored says it churns (a slow start under load must not let the kill
        # land before anything was put): then kill it `delay_s` later, mid-churn.
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert first.startswith("put "), f"the worker ended before a put: {first!r}"
        time.sleep(delay_s)
        for line in [first, *kill_reading_all(worker).splitlines()]:
            kind, *ids = line.split()
            assert kind != "malformed", f"delivered a damaged message: {line}"
            (confirmed if kind == "put" else acked).update(ids)
    assert acked, "the worker never got to recycle a file"
    time.sleep(1.1)  # the leases the workers held when killed expire
    reopened = dirmq.Store(root).queue("churn")
    reopened.sweep()
    assert pool_dirs(reopened) == [], "a dead process's pool was left behind"
    assert os.listdir(Path(q.path, layout.TMP)) == []
    seen: set[str] = set()
    while (message := reopened.get_one()) is not None:
        assert well_formed(message.body), "a partial or foreign body was delivered"
        seen.add(message.id)
        reopened.ack(message.receipt or "")
    assert not seen & acked, "an acknowledged message came back"
    # A message acked by a killed worker just before it could print so is neither: at most
    # one per kill (the worker acks one message at a time).
    lost = confirmed - acked - seen
    assert len(lost) <= len(kills), f"put returned but the message is gone: {sorted(lost)[:5]}"
    assert os.listdir(Path(q.path, layout.CORRUPT)) == []


def test_a_consumer_hands_files_on_again_once_publishers_took_the_shared_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that only consumes counts the files it hands to the shared pool and never
    takes one out: once another process's puts took them, its count must be checked against
    the pool, not trusted for good (it then unlinked every file it retired, while the
    publishers created new ones)."""
    monkeypatch.setattr(pool, "RELIST_INTERVAL_S", 0.0)
    monkeypatch.setattr(pool, "FULL_RECHECK_S", 0.0)
    free, tmp = tmp_path / layout.FREE, tmp_path / layout.TMP
    free.mkdir()
    tmp.mkdir()
    private = Access.named("private")
    consumer = pool.FilePool(str(free), private, capacity=3)  # two processes' views of it
    publisher = pool.FilePool(str(free), private, capacity=3)
    for i in range(3):
        (free / f"handed-{i}").write_bytes(bytes(8))
        consumer.known_more(f"handed-{i}")
    assert consumer.full()
    for i in range(2):
        assert publisher.claim(str(tmp / f"put-{i}"))
    assert not consumer.full()  # one left: room for two more
    assert consumer.room() == 2
    assert publisher.claim(str(tmp / "put-2"))
    assert not publisher.claim(str(tmp / "put-3"))  # empty now, as both views agree
    assert not consumer.full()
