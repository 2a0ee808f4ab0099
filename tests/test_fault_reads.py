"""Every read the store makes, failed, leaves nothing lost or stuck.

tests/test_fault_transitions.py fails the calls that change the filesystem; this fails the ones
that only look at it (`faultfs.READ_CALLS`: reading a message file, listing a state directory,
the stat family, reading a capacity or dedup symlink) with EIO, and with EMFILE or ENOMEM where
its man page lists them (`faultfs.READ_ERRORS`), while a reading operation runs: get (with the
index built, and the first get of a process, which builds it), peek, browse, stats, read_ids,
sweep, and a put that looks up its dedup id. The operation either works (it did not need that
call, or had a way around it) or raises a `StorageError`, never anything else. Then the
filesystem recovers and the same process must see the queue as a fresh process does and
deliver every message exactly once, in FIFO order; a read that failed never sends an intact
message to @corrupt, and `fsck` is clean.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import dirmq
from dirmq.store import layout
from dirmq.store import root as root_module
from dirmq.store.fsck import fsck
from dirmq.store.ids import new_ids
from dirmq.store.poolreclaim import ORPHAN_POOL_GRACE_S
from dirmq.store.recovery import ORPHAN_GRACE_S

from .support.faultfs import READ_ERRORS, FaultyFS
from .test_fault_transitions import _attempt, _check_view, _drain

# Two of the messages are larger than the store's first read of a file (64 KiB): those are read
# on with fstat + pread, so every read call is on some message's path, and a get of several
# can fail after its first message.
LARGE = 100 * 1024
BODIES = [b"m0", b"m1" * (LARGE // 2), b"m2", b"m3" * (LARGE // 2), b"m4"]
DEAD = b"dead"

OPERATIONS = ["get", "first_get", "peek", "browse", "stats", "read_ids", "sweep", "put_dedup"]
# Calls each operation is known to make, so the fault is known to have been met (the store's
# calls drifting away from these would leave a case testing nothing). Not listed where an
# operation makes the call only sometimes (the configuration's stat, every 0.5 s).
MAKES: dict[str, set[str]] = {
    "get": {"read", "pread", "fstat"},
    "first_get": {"stat", "listdir", "scandir", "read", "pread", "fstat"},
    "peek": {"read", "pread", "fstat", "listdir"},
    "browse": {"read", "pread", "fstat"},
    "stats": {"listdir"},
    "read_ids": {"listdir", "read", "pread", "fstat"},
    "sweep": {"listdir", "scandir", "readlink", "lstat"},
    "put_dedup": {"readlink", "lstat"},
}
FAULTS = [(call, error) for call, errors in READ_ERRORS.items() for error in errors]


def _populate(root: Path) -> tuple[list[str], str]:
    """A queue with capacity tokens (@slots), dedup records (@dedup) and a dead message besides
    `BODIES`, written by another process: (ids of `BODIES`, id of the dead one)."""
    with dirmq.Store(root, watch_mode="poll") as setup:  # no inotify instance: closed at once
        config = dirmq.QueueConfig(visibility_timeout_s=60, capacity=100)
        q = setup.create_queue("q", config)
        dead_id = q.put(DEAD)
        dead = q.get_one()
        assert dead is not None and dead.receipt is not None
        q.dead_letter(dead.receipt)
        outgoing = [dirmq.OutgoingMessage(b, dedup_id=f"d{i}") for i, b in enumerate(BODIES)]
        ids = q.put_many(outgoing, durability="memory")  # no syncfs: setup only
    return ids, dead_id


def _check_recovered(root: Path, store: dirmq.Store, q: dirmq.Queue, expected: list[bytes]) -> None:
    """After the fault: this process sees what a fresh one sees, delivers `expected` in order,
    set nothing aside, and the dead message is still there."""
    _check_view(store, q)
    assert _drain(q) == expected
    assert os.listdir(root / "q" / layout.CORRUPT) == []
    assert q.corrupt_quarantined == 0
    assert q.stats().dead == 1
    report = fsck(root, repair=False)
    assert report.ok, report.problems
    _check_view(store, q)


@pytest.mark.parametrize(("call", "error"), FAULTS)
@pytest.mark.parametrize("operation", OPERATIONS)
def test_a_failed_read_leaves_nothing_stuck(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, operation: str, call: str, error: str
) -> None:
    ids, dead_id = _populate(fast_root)
    store = dirmq.Store(fast_root)
    q = store.queue("q")
    if operation != "first_get":
        q.stats()  # the index is built: the steady state of a process
    expected = list(BODIES)
    got: list[dirmq.Message] = []
    fs = FaultyFS(monkeypatch, fast_root)

    fs.fail(call, getattr(errno, error))
    if operation in ("get", "first_get"):
        _attempt(lambda: got.extend(q.get(3)))
    elif operation in ("peek", "browse", "read_ids"):
        seen: list[dirmq.Message] = []  # read without a lease: nothing to settle afterwards
        read: dict[str, Callable[[], object]] = {
            "peek": lambda: seen.extend(q.peek(i) for i in [*ids, dead_id]),  # dead: a listing
            "browse": lambda: seen.extend(q.browse()),
            "read_ids": lambda: seen.extend(q.read_ids([*ids, dead_id])),
        }
        if _attempt(read[operation]):
            wanted = BODIES if operation == "browse" else [*BODIES, DEAD]
            assert sorted(m.body for m in seen) == sorted(wanted)
    elif operation == "put_dedup":
        original: list[str] = []
        if _attempt(lambda: original.append(q.put(b"m0 again", dedup_id="d0"))):
            assert original == ids[:1]  # a duplicate: not stored
        if _attempt(lambda: q.put(b"new", dedup_id="new")):
            expected.append(b"new")
    else:
        action: Callable[[], object] = q.stats if operation == "stats" else q.sweep
        _attempt(action)
    fs.clear()

    if call in MAKES[operation]:
        assert fs.raised[call], f"{operation} no longer calls os.{call}: this case tests nothing"
    for message in got:  # a get that worked (in part): its messages are ours, in order
        assert message.body == expected.pop(0)
        q.ack(message.receipt or "")
    if operation == "put_dedup":
        assert q.put(b"m0 again", dedup_id="d0") == ids[0]  # still a duplicate: not stored
    _check_recovered(fast_root, store, q, expected)
    store.close()


@pytest.mark.parametrize("fails", [layout.READY, layout.LEASED, layout.DELAYED, layout.SLOTS])
@pytest.mark.parametrize("how", ["sweep", "poll"])
def test_a_failed_rescan_keeps_the_index(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, fails: str, how: str
) -> None:
    """A rescan (sweep; every poll on NFS; an inotify overflow) lists @ready, @leased, @delayed
    and @slots. When one of those listings fails, the index stays as it was: emptied, or
    half-filled, the process would deliver nothing more until its next rescan (with inotify,
    never), though a fresh process delivers everything."""
    _populate(fast_root)
    poll_s = 0.1  # long enough that the check below comes before the next poll's rescan
    watch_mode = "poll" if how == "poll" else "auto"
    store = dirmq.Store(fast_root, watch_mode=watch_mode, poll_interval_s=poll_s)
    q = store.queue("q")
    leased = q.get_one()  # one in flight (and, with tokens held, @slots is not empty)
    assert leased is not None and leased.receipt is not None
    q.put(b"later", delay_s=3600)
    before = q.stats()
    fs = FaultyFS(monkeypatch, fast_root)
    order = [layout.READY, layout.LEASED, layout.DELAYED, layout.SLOTS]  # QueueIndex.rescan's
    fs.fail("listdir", errno.EIO, after=order.index(fails), times=1)
    if how == "poll":
        time.sleep(poll_s)  # the next call polls
    with pytest.raises(dirmq.StorageError):
        q.sweep() if how == "sweep" else q.get_one()
    fs.clear()
    assert fs.raised["listdir"] == 1
    mine = q.stats()
    assert (mine.ready, mine.in_flight, mine.delayed) == (before.ready, 1, 1)
    q.ack(leased.receipt)
    _check_recovered(fast_root, store, q, BODIES[1:])
    store.close()


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_failed_first_listing_leaks_no_watcher(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first get of a process opens the queue's watcher, then lists the queue. A listing
    that fails must close that watcher: each retry would otherwise leave one more subscribed
    for good (a descriptor, and every later event of the queue kept in memory), which at
    EMFILE is the very thing the process is short of."""
    _populate(fast_root)
    with dirmq.Store(fast_root) as store:
        store.create_queue("other").stats()  # the Store's shared inotify instance is open
        q = store.queue("q")
        descriptors = _open_descriptors()
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail("listdir", errno.EMFILE)
        for _ in range(10):
            with pytest.raises(dirmq.StorageError):
                q.get_one()
        fs.clear()
        assert _open_descriptors() == descriptors
        q.stats()
        assert _open_descriptors() == descriptors + 1  # the one watcher of q
        assert _drain(q) == BODIES


def test_a_message_that_can_be_neither_read_nor_put_back_comes_back_when_its_lease_ends(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A get leases the head, its read fails, and so does the rename back to @ready: the lease
    stays (in both views), and when it expires the message is the first delivered again."""
    _populate(fast_root)
    with dirmq.Store(fast_root) as store:
        q = store.queue("q")
        q.stats()
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail("read", errno.EIO)
        fs.fail("rename", errno.EIO, after=1)  # the claim works, putting it back does not
        with pytest.raises(dirmq.StorageError):
            q.get_one(visibility_s=0.05)
        fs.clear()
        assert (fs.raised["read"], fs.raised["rename"]) == (1, 1)
        assert len(os.listdir(fast_root / "q" / layout.LEASED)) == 1
        _check_view(store, q)
        time.sleep(0.1)  # the lease ends: the message is back in its FIFO place
        _check_recovered(fast_root, store, q, BODIES)


@pytest.mark.parametrize("call", ["read", "pread"])
def test_a_read_that_fails_once_is_delivered_by_the_next_get(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A transient error: the get that met it fails (read: at the first message) or stops
    short (pread: at the first large one), and the very next get goes on from that message,
    whose receive count the failed attempt left as it was."""
    _populate(fast_root)
    with dirmq.Store(fast_root) as store:
        q = store.queue("q")
        q.stats()
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail(call, errno.EIO, times=1)
        got: list[dirmq.Message] = []
        failed = not _attempt(lambda: got.extend(q.get(5)))
        assert failed == (call == "read")
        got += q.get(5)
        assert fs.raised[call] == 1
        assert [m.body for m in got] == BODIES
        assert [m.receive_count for m in got] == [1] * len(BODIES)
        assert not q.ack_many(m.receipt or "" for m in got)
        _check_recovered(fast_root, store, q, [])


@pytest.mark.parametrize("error", READ_ERRORS["stat"])
def test_a_failed_existence_check_keeps_the_open_queue(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    """`Store.queue` re-checks that an open queue's @queue.json is still there. A stat that
    fails otherwise than ENOENT says nothing about that: the open Queue is returned as it is
    (not closed and replaced, which woke its waiters and dropped its index), and checked again
    on the next call."""
    monkeypatch.setattr(root_module, "EXISTS_RECHECK_S", -1.0)  # every call re-checks
    with dirmq.Store(fast_root) as store:
        q = store.create_queue("q")
        q.put(b"m")
        woken: list[str] = []
        q.subscribe(lambda: woken.append("woken"))
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail("stat", getattr(errno, error))
        assert store.queue("q") is q
        assert fs.raised["stat"]
        fs.clear()
        assert woken == [] and store.queue("q") is q
        assert [m.body for m in q.get(1)] == [b"m"]
        store.delete_queue("q")
        with pytest.raises(dirmq.QueueNotFound):
            store.queue("q")


@pytest.mark.parametrize("error", READ_ERRORS["lstat"])
@pytest.mark.parametrize("operation", ["open", "sweep"])
def test_an_age_that_cannot_be_read_is_not_now(
    fast_root: Path, monkeypatch: pytest.MonkeyPatch, operation: str, error: str
) -> None:
    """Recovery judges a temp file or a recycled-file pool it cannot attribute to a live
    process here (another host's) by its age. An lstat that fails otherwise than ENOENT means
    "not now": opening the queue and sweeping it work, the two are left alone, and the first
    sweep after the disk recovers removes them."""
    with dirmq.Store(fast_root) as setup:
        setup.create_queue("q").put(b"m")
    with dirmq.Store(fast_root) as store:
        q = store.queue("q")
        if operation == "sweep":
            q.stats()  # the index is built: recovery on open is done
        orphan, pool = _plant_unattributable(fast_root / "q")
        fs = FaultyFS(monkeypatch, fast_root)
        fs.fail("lstat", getattr(errno, error))
        if operation == "open":
            assert q.stats().ready == 1  # builds the index: recovery on open
        else:
            q.sweep()
        assert fs.raised["lstat"]
        assert orphan.exists() and pool.exists()
        fs.clear()
        report = q.sweep()
        assert (report.orphans_removed, report.pools_reclaimed) == (1, 1)
        assert not orphan.exists() and not pool.exists()


def _plant_unattributable(queue_dir: Path) -> tuple[Path, Path]:
    """A temp file and a pool directory of another host, both older than their grace."""
    other_host = f"{int(layout.HOST_TAG, 16) ^ 1:08x}"
    orphan = queue_dir / layout.TMP / f"{new_ids(1)[0]}.{other_host}.1.tmp"
    orphan.write_bytes(b"half written")
    pool = queue_dir / layout.FREE / f"{other_host}.0.1.1-0000abcd"
    pool.mkdir()
    then = time.time() - 2 * max(ORPHAN_GRACE_S, ORPHAN_POOL_GRACE_S)
    for path in (orphan, pool):
        os.utime(path, (then, then))
    return orphan, pool
