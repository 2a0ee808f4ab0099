"""Every transition under every injected filesystem error leaves nothing stuck.

For each transition (put, get, ack, nack, extend, delay promotion, dead-letter, purge), each
call the store makes to change the filesystem (`faultfs.CALLS`; the reads are failed in
tests/test_fault_reads.py) fails with ENOSPC, EROFS, EIO or EMFILE while the transition runs.
The transition either succeeds (it did not need that call, or it had a way around it) or raises
a `StorageError`, never anything else. Then the filesystem recovers and the same process must
deliver every message exactly once, in FIFO order, with its view of the queue equal to a fresh
process's, and `fsck` clean.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import dirmq
from dirmq.server.broker import Broker
from dirmq.store import fsio, layout, ownpool
from dirmq.store.fsck import fsck

from .support.faultfs import CALLS, ERRORS, FaultyFS

BODIES = [f"m{i}".encode() for i in range(5)]


def _drain(q: dirmq.Queue) -> list[bytes]:
    """Receive and acknowledge everything ready, one at a time, in order."""
    bodies: list[bytes] = []
    for _ in range(100):
        message = q.get_one()
        if message is None:
            return bodies
        q.ack(message.receipt or "")
        bodies.append(message.body)
    raise AssertionError("the queue never ran dry")


def _check_view(store: dirmq.Store, q: dirmq.Queue) -> None:
    """This process's view of the queue is what a fresh process sees on disk."""
    with dirmq.Store(store.root) as fresh:
        mine, theirs = q.stats(), fresh.queue(q.name).stats()
    assert (mine.ready, mine.in_flight, mine.delayed, mine.dead) == (
        theirs.ready,
        theirs.in_flight,
        theirs.delayed,
        theirs.dead,
    )


def _attempt(action: Callable[[], object]) -> bool:
    """Run `action` under the fault: True if it worked, False if it raised StorageError."""
    try:
        action()
    except dirmq.StorageError:
        return False
    return True


@pytest.mark.parametrize("error", list(ERRORS))
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(
    "transition",
    ["put", "get", "ack", "nack", "extend", "promote", "sweep", "dead_letter", "delete", "purge"],
)
def test_a_failed_transition_leaves_nothing_stuck(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, transition: str, call: str, error: str
) -> None:
    _fail_and_recover(fast_root, monkeypatch, transition, call, error)


class _Everything:
    def __contains__(self, _item: object) -> bool:
        return True

    def add(self, _item: object) -> None:
        pass


@pytest.mark.parametrize("error", list(ERRORS))
@pytest.mark.parametrize("call", CALLS)
def test_a_failed_put_with_named_temp_files_leaves_nothing_stuck(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, call: str, error: str
) -> None:
    """The same for a put without O_TMPFILE (e.g. on NFS): named files in @tmp, renamed."""
    monkeypatch.setattr(fsio, "_tmpfile_unsupported", _Everything())
    _fail_and_recover(fast_root, monkeypatch, "put", call, error)
    assert os.listdir(fast_root / "q" / layout.TMP) == []


def _fail_and_recover(
    root: Path, monkeypatch: pytest.MonkeyPatch, transition: str, call: str, error: str
) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q", dirmq.QueueConfig(visibility_timeout_s=60))
    ids = q.put_many(BODIES, durability="memory")  # no syncfs: setup only
    expected = list(BODIES)
    fs = FaultyFS(monkeypatch, root)
    settle: Callable[[], object] | None = None  # what a client does again after a failure
    if transition in ("ack", "nack", "extend", "dead_letter"):
        first = q.get_one()
        assert first is not None and first.receipt is not None
        receipt = first.receipt
        settle = {
            "ack": lambda: q.ack(receipt),
            "nack": lambda: q.nack(receipt),
            "extend": lambda: q.extend(receipt, 30),
            "dead_letter": lambda: q.dead_letter(receipt),
        }[transition]
        if transition in ("ack", "dead_letter"):
            expected.remove(first.body)
        if transition == "extend":
            expected.remove(first.body)  # acknowledged below, under the extended lease
    if transition == "delete":
        settle = lambda: q.delete(ids[2])  # noqa: E731
        expected.remove(BODIES[2])
    if transition == "promote":
        q.put(b"late", delay_s=0.05)
        expected.append(b"late")
        time.sleep(0.1)  # due now: the next get promotes it
    if transition == "sweep":
        assert q.get_one(visibility_s=0.05) is not None
        time.sleep(0.1)  # expired now: the sweep requeues it, in its FIFO place
    got: list[dirmq.Message] = []

    fs.fail(call, ERRORS[error])
    if transition == "put":
        if _attempt(lambda: q.put_many([b"new1", b"new2"])):
            expected += [b"new1", b"new2"]
        if _attempt(lambda: q.put(b"new3")):
            expected.append(b"new3")
    elif transition in ("get", "promote"):
        _attempt(lambda: got.extend(q.get(3)))
    elif transition in ("purge", "sweep"):
        _attempt(q.purge if transition == "purge" else q.sweep)
    else:
        assert settle is not None
        if _attempt(settle):
            settle = None
    fs.clear()

    for message in got:  # a get that worked (in part): its messages are ours, in order
        assert message.body == expected.pop(0)
        q.ack(message.receipt or "")
    if settle is not None:
        settle()
    if transition == "extend":
        q.ack(receipt)
    _check_view(store, q)
    if transition == "purge":
        q.purge()
        expected = []
    assert _drain(q) == expected
    report = fsck(root, repair=False)
    assert report.ok, report.problems
    assert not report.expired_leases and not report.due_delayed
    _check_view(store, q)
    store.close()


@pytest.mark.parametrize("transition", ["ack", "dead_letter", "delete", "purge"])
def test_a_failed_removal_keeps_its_capacity_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transition: str
) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        q = store.create_queue("q", dirmq.QueueConfig(capacity=3))
        q.put_many([b"a", b"b", b"c"])
        first = q.get_one()
        assert first is not None and first.receipt is not None
        # The leased file cannot go; the token in @slots could.
        fs = FaultyFS(monkeypatch, root / "q" / layout.LEASED)
        fs.fail("rename", errno.EROFS)
        fs.fail("unlink", errno.EROFS)
        removals: dict[str, Callable[[], object]] = {
            "ack": lambda: q.ack(first.receipt or ""),
            "dead_letter": lambda: q.dead_letter(first.receipt or ""),
            "delete": lambda: q.delete(first.id),
            "purge": q.purge,
        }
        remove = removals[transition]
        with pytest.raises(dirmq.StorageError):
            remove()
        fs.clear()
        # Every message still there (the leased one included) still holds its token.
        assert len(os.listdir(root / "q" / layout.SLOTS)) == q.stats().total
        assert q.peek(first.id).body == b"a"
        remove()
        assert len(os.listdir(root / "q" / layout.SLOTS)) == q.stats().total
        assert fsck(root, repair=False).ok


@pytest.mark.parametrize("how", ["claim_named", "get"])
def test_a_lease_of_several_that_fails_midway_delivers_what_it_took(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The messages leased before the failure go to the caller (not held back until their
    lease expires); the rest stay ready, in order."""
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        q = store.create_queue("q", dirmq.QueueConfig(visibility_timeout_s=3600))
        q.put_many(BODIES)
        fs = FaultyFS(monkeypatch, root)
        fs.fail("rename", errno.EIO, after=2)
        if how == "claim_named":
            got = [m for _lease, m in q.claim_named(q.ready_names())]
        else:
            got = q.get(5)
        fs.clear()
        assert [m.body for m in got] == BODIES[:2]
        assert not q.ack_many(m.receipt or "" for m in got)
        assert _drain(q) == BODIES[2:]


def _pooled_files(queue_dir: Path) -> int:
    return sum(len(files) for _dir, _subdirs, files in os.walk(queue_dir / layout.FREE))


@pytest.mark.parametrize("where", ["put", "ack"])
def test_enospc_gives_the_recycled_files_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Files kept for reuse are space a full disk needs: the first ENOSPC unlinks them."""
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        q.put_many([b"x"] * 20)
        got = q.get(20)
        assert not q.ack_many(m.receipt or "" for m in got[:10])  # 10 files kept for reuse
        assert ownpool.wait_reaped(5)  # blanked and kept (the reaper makes no call under faults)
        assert _pooled_files(root / "q") == 10
        fs = FaultyFS(monkeypatch, root)
        if where == "put":
            fs.fail("write", errno.ENOSPC)
            with pytest.raises(dirmq.DiskFull):
                q.put(b"y")
        else:
            fs.fail("rename", errno.ENOSPC)  # the pool directory cannot take another entry
            q.ack(got[10].receipt or "")  # unlinked instead: no error
        fs.clear()
        assert _pooled_files(root / "q") == 0
        assert not q.ack_many(m.receipt or "" for m in got[11:])
        q.put(b"z")
        assert [m.body for m in q.get(5)] == [b"z"]


def test_the_server_tells_each_ack_of_a_batch_its_own_outcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker applies concurrent acks as one batch: when the disk fails midway, the acks
    that worked are answered as done (a retry would get 409), the others as failed."""
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        q.put_many(BODIES)
        got = q.get(5)
        fs = FaultyFS(monkeypatch, root)
        fs.fail("rename", errno.EIO, after=2)  # recycling fails after two acks...
        fs.fail("unlink", errno.EIO)  # ... and so does the unlink it falls back to

        async def ack_all() -> list[BaseException | None]:
            broker = Broker(store)
            try:
                acks = [broker.ack(q, m.receipt or "") for m in got]
                return await asyncio.gather(*acks, return_exceptions=True)
            finally:
                broker.close()

        outcomes = asyncio.run(ack_all())
        fs.clear()
        assert outcomes[:2] == [None, None]
        assert all(isinstance(o, dirmq.StorageError) for o in outcomes[2:]), outcomes
        for message in got[2:]:  # what failed can be retried, and works now
            q.ack(message.receipt or "")
        assert q.stats().total == 0
        with pytest.raises(dirmq.StaleReceipt):
            q.ack(got[0].receipt or "")


@pytest.mark.parametrize("error", list(ERRORS))
@pytest.mark.parametrize("call", ["write", "ftruncate"])
def test_a_failed_overwrite_of_a_recycled_file_publishes_nothing(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, call: str, error: str
) -> None:
    """A put reuses a file an ack retired: overwritten, then cut to the new length (ftruncate)
    when it was longer. When either fails, nothing is published and the half-overwritten file
    is not kept for reuse."""
    with dirmq.Store(fast_root) as store:
        q = store.create_queue("q")
        q.put_many([b"long" * 100, b"x"])
        first = q.get_one()
        assert first is not None and first.receipt is not None
        q.ack(first.receipt)
        assert ownpool.wait_reaped(5)
        assert _pooled_files(fast_root / "q") == 1
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail(call, ERRORS[error])
        with pytest.raises(dirmq.StorageError):
            q.put(b"short")
        fs.clear()
        assert fs.raised[call] == 1
        assert _pooled_files(fast_root / "q") == 0
        _check_view(store, q)
        q.put(b"short")
        assert _drain(q) == [b"x", b"short"]
        report = fsck(fast_root, repair=False)
        assert report.ok, report.problems


@pytest.mark.parametrize("transition", ["get", "extend", "nack", "dead_letter"])
def test_a_rename_that_needs_space_frees_the_recycled_files_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transition: str
) -> None:
    """A rename into a directory that must grow gets ENOSPC at a full disk: the files kept for
    reuse are unlinked and the rename tried again, so consumers keep working."""
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        q.put_many([b"x"] * 12)
        got = q.get(11)
        assert not q.ack_many(m.receipt or "" for m in got[:10])  # 10 files kept for reuse
        assert ownpool.wait_reaped(5)  # blanked and kept (the reaper makes no call under faults)
        receipt = got[10].receipt or ""
        fs = FaultyFS(monkeypatch, root)
        fs.fail("rename", errno.ENOSPC, times=1)
        if transition == "get":
            assert q.get_one() is not None
        elif transition == "extend":
            q.extend(receipt, 60)
        elif transition == "nack":
            q.nack(receipt)
        else:
            q.dead_letter(receipt)
        assert fs.raised["rename"] == 1
        assert _pooled_files(root / "q") == 0


def _age_dedup_records(q: dirmq.Queue, age_s: float) -> None:
    """Make every dedup record `age_s` old (its symlink's own mtime is when it was written)."""
    dedup_dir = Path(q.path) / layout.DEDUP
    then = time.time() - age_s
    for record in dedup_dir.iterdir():
        os.utime(record, (then, then), follow_symlinks=False)


@pytest.mark.parametrize("error", ["EIO", "ENOSPC", "EROFS"])
@pytest.mark.parametrize("step", ["symlink", "replace_expired", "mkdir"])
def test_a_dedup_record_that_cannot_be_written_is_a_storage_error(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, step: str, error: str
) -> None:
    """Recording a dedup id writes a symlink (first replacing an expired record, or creating a
    @dedup that a queue from before it lacks): each failure is a StorageError (503), not a raw
    OSError (500). The message stored before its record stays (at least once, as after a
    crash); once the disk recovers, the dedup id works as before."""
    with dirmq.Store(fast_root) as store:
        q = store.create_queue("q", dirmq.QueueConfig(dedup_window_s=60))
        call = {"symlink": "symlink", "replace_expired": "unlink", "mkdir": "mkdir"}[step]
        if step == "replace_expired":
            q.put(b"first", dedup_id="d")
            _age_dedup_records(q, 3600)
        elif step == "mkdir":
            shutil.rmtree(Path(q.path) / layout.DEDUP)
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail(call, getattr(errno, error))
        with pytest.raises(dirmq.StorageError):
            q.put(b"again", dedup_id="d")
        assert fs.raised[call]
        fs.clear()
        original = q.put(b"after", dedup_id="d")
        assert q.put(b"after", dedup_id="d") == original


@pytest.mark.parametrize("error", ["EIO", "EROFS"])
def test_a_dedup_record_that_cannot_be_expired_is_a_storage_error(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    """A sweep that cannot remove an expired dedup record raises StorageError; the record is
    removed by the next sweep once the disk recovers."""
    with dirmq.Store(fast_root) as store:
        q = store.create_queue("q", dirmq.QueueConfig(dedup_window_s=60))
        q.put(b"m", dedup_id="d")
        _age_dedup_records(q, 3600)
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail("unlink", getattr(errno, error))
        with pytest.raises(dirmq.StorageError):
            q.sweep()
        assert fs.raised["unlink"]
        fs.clear()
        q.sweep()
        assert list((Path(q.path) / layout.DEDUP).iterdir()) == []
