"""An ack is one rename into this process's own pool; the pool's reaper thread blanks, hands on
or unlinks the file later (pool.py). Real files, real processes, real SIGKILLs, and the
syscalls counted with strace where it exists."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

import dirmq
from dirmq.store import layout, ownpool, pool, recycled
from dirmq.store.fsck import Kind, fsck

from .support.faultfs import FaultyFS
from .support.pool_workers import kill_reading_all, spawn_worker
from .support.procs import REPO
from .support.waiting import wait_until

SECRET = b"acked-secret"


def own_pool(q: dirmq.Queue) -> Path:
    (own,) = [p for p in Path(q.path, layout.FREE).iterdir() if p.is_dir()]
    return own


def shared_files(q: dirmq.Queue) -> list[Path]:
    return [p for p in Path(q.path, layout.FREE).iterdir() if p.is_file()]


def files_holding(root: Path, token: bytes) -> list[str]:
    """The files under `root` holding `token`, but the commit journals: what they hold is gone
    with their checkpoint, a second after the publish (test_a_journals_copy_goes_with_its_
    checkpoint), not with the ack's blanking, which is what these tests look at."""
    found = []
    for directory, dirs, names in os.walk(root):
        if directory == str(root):
            dirs[:] = [d for d in dirs if d != layout.JOURNAL_DIR]
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isfile(path) and token in Path(path).read_bytes():
                found.append(os.path.relpath(path, root))
    return found


# -- the ack path --------------------------------------------------------------------------------
def test_an_ack_leaves_the_file_in_the_own_pool_and_the_reaper_blanks_it(
    store: dirmq.Store,
) -> None:
    q = store.create_queue("q")
    q.put_many([SECRET + b" %d" % i for i in range(3)])
    got = q.get(3)
    ownpool.reaper.stop(timeout_s=5)  # this process's reaper waits: the ack's own work, alone
    try:
        for m in got:
            q.ack(m.receipt or "")  # one ack at a time: the reaper thread blanks
        own = own_pool(q)
        assert sorted(os.listdir(own)) == sorted(m.id for m in got)
        assert all(SECRET in (own / m.id).read_bytes() for m in got), "not blanked on the ack"
        assert q._files.pool.own_files() == 0
        assert len(ownpool.own_pool(q._files.pool.dir).unreaped) == 3
        assert q.put(b"new") not in {m.id for m in got}
        assert sorted(os.listdir(own)) == sorted(m.id for m in got), "a put took an unblanked file"
    finally:
        ownpool.reaper = ownpool.Reaper()  # what a fresh process would have
    started = time.monotonic()
    assert ownpool.wait_reaped(2.0), "the reaper did not blank within 2 s"
    assert time.monotonic() - started < 2.0
    assert all(recycled.is_blank(str(own / m.id), os.stat(own / m.id).st_size) for m in got)
    assert files_holding(Path(store.root), SECRET) == []
    assert q._files.pool.own_files() == 3


def test_a_journals_copy_goes_with_its_checkpoint(store: dirmq.Store) -> None:
    """The commit journal holds a published body (its record) only until the checkpoint that
    follows: a second or so after the publish no file of the root holds an acknowledged body,
    the journal's included."""
    q = store.create_queue("q")
    q.put_many([SECRET + b" %d" % i for i in range(3)])
    journals = Path(store.root) / layout.JOURNAL_DIR
    assert any(SECRET in p.read_bytes() for p in journals.iterdir()), "no journal: nothing tested"
    for m in q.get(3):
        q.ack(m.receipt or "")
    assert ownpool.wait_reaped(5.0)

    def journals_clean() -> bool:
        try:
            return not any(SECRET in p.read_bytes() for p in journals.iterdir())
        except FileNotFoundError:  # a journal removed between the listing and the read
            return False

    wait_until(timeout_s=10.0, what="the journal's checkpoint", check=journals_clean)
    assert files_holding(Path(store.root), SECRET) == []


_ACKS_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import dirmq
    from dirmq.store import ownpool, pool
    root, n, fill = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    pool.DRAIN_KEEP_FILES = int(sys.argv[4])  # 0: a drain keeps no more than OWN_POOL_FILES
    q = dirmq.Store(root).create_queue("q", dirmq.QueueConfig(durability="memory"))
    q.put_many([b"x" * 200] * (fill + n))
    got = q.get(fill + n)
    q.ack_many([m.receipt for m in got[:fill]])  # fills both pools first (a long drain)
    assert ownpool.wait_reaped(30)
    os.path.exists("/dirmq-mark-start")
    for m in got[fill:]:  # single acks: the reaper thread blanks (ack_many does it inline)
        q.ack(m.receipt)
    os.path.exists("/dirmq-mark-end")
    assert ownpool.wait_reaped(30)
    os.path.exists("/dirmq-mark-done")
    """
)
_LINE = re.compile(r"(\d+)\s+(\w+)\(")


def _syscalls_per_thread(
    tmp_path: Path, n: int, fill: int, drain_keep: int
) -> tuple[Counter[str], Counter[str]]:
    """(the acking thread's, every other thread's) syscalls while `n` acks run, and until
    the reaper is done with them."""
    out = tmp_path / "strace.txt"
    script = tmp_path / "acks.py"
    script.write_text(_ACKS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = ["strace", "-f", "-qq", "-o", str(out), sys.executable, str(script)]
    traced = subprocess.run(
        [*command, str(tmp_path / "root"), str(n), str(fill), str(drain_keep)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if traced.returncode != 0 and "ptrace" in traced.stderr:
        pytest.skip(f"strace cannot trace here: {traced.stderr.strip()[:200]}")
    assert traced.returncode == 0, traced.stderr
    caller: Counter[str] = Counter()
    others: Counter[str] = Counter()
    acker, phase = None, None
    for line in out.read_text().splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        tid, call = match.groups()
        marker = call in ("newfstatat", "stat", "statx", "lstat")  # not the script being read
        if marker and "/dirmq-mark-start" in line:
            acker, phase = tid, "acks"
        elif marker and "/dirmq-mark-end" in line:
            phase = "after"
        elif marker and "/dirmq-mark-done" in line:
            break
        elif phase == "acks" and tid == acker:
            caller[call] += 1
        elif phase is not None and tid != acker:
            others[call] += 1
    return caller, others


_FILE_CALLS = ("renameat", "renameat2", "rename", "unlink", "unlinkat", "openat", "pwrite64")


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace")
@pytest.mark.parametrize(
    ("fill", "drain_keep"),
    [(1, pool.DRAIN_KEEP_FILES), (1500, pool.DRAIN_KEEP_FILES), (1500, 0)],
    ids=["pools-with-room", "a-drain-keeps-its-files", "pools-full"],
)
def test_an_ack_makes_one_rename_and_the_reaper_does_the_rest(
    tmp_path: Path, fill: int, drain_keep: int
) -> None:
    n = 200
    caller, others = _syscalls_per_thread(tmp_path, n, fill, drain_keep)
    renames = ("renameat", "renameat2", "rename")
    assert sum(caller[c] for c in renames) == n, caller
    others_on_the_path = {c: caller[c] for c in _FILE_CALLS if c not in renames}
    assert others_on_the_path == dict.fromkeys(others_on_the_path, 0), caller
    if fill > ownpool.OWN_POOL_FILES and not drain_keep:  # both full: unlinked without a look
        assert others["unlinkat"] == n and others["pwrite64"] == 0, others
    else:  # room: each file blanked (then kept, or handed to the shared pool)
        assert others["pwrite64"] == n and others["unlinkat"] == 0, others


def test_ack_many_blanks_its_batch_before_it_returns(store: dirmq.Store) -> None:
    q = store.create_queue("inline")
    q.put_many([SECRET + b" %d" % i for i in range(100)])
    got = q.get(100)
    ownpool.reaper.stop(timeout_s=5)  # no reaper thread: whatever is blank, the ack did it
    try:
        assert q.ack_many([m.receipt or "" for m in got]) == {}
        assert ownpool.unreaped_files() == 0
        assert files_holding(Path(store.root), SECRET) == []
        assert q._files.pool.own_files() == 100  # kept, blank, for the next puts
    finally:
        ownpool.reaper = ownpool.Reaper()


def test_a_batch_of_acks_wakes_no_reaper_thread(store: dirmq.Store) -> None:
    """The batch reaps its own files at its end: waking the reaper thread for them too would
    cost a thread switch and GIL turns for nothing."""
    q = store.create_queue("quiet")
    q.put_many([SECRET + b" %d" % i for i in range(20)])
    got = q.get(10)
    claimed = q.claim_named(q.ready_names(), visibility_s=60)
    ownpool.reaper.stop(timeout_s=5)
    ownpool.reaper = fresh = ownpool.Reaper()  # not started: a poke would start its thread
    try:
        assert q.ack_each([m.receipt or "" for m in got]) == {}
        assert q.ack_leases([lease for lease, _message in claimed]) == []
        assert fresh.thread is None and not fresh.wake.is_set(), "a batch woke the reaper"
        assert ownpool.unreaped_files() == 0
        assert files_holding(Path(store.root), SECRET) == []
    finally:
        fresh.stop(timeout_s=5)
        ownpool.reaper = ownpool.Reaper()


def test_a_batch_past_the_deferral_bound_wakes_the_reaper(store: dirmq.Store) -> None:
    """A batch of thousands (the Spark source's acks) is reaped alongside by the thread, so
    its files are recycled rather than unlinked once MAX_UNREAPED wait."""
    q = store.create_queue("big", dirmq.QueueConfig(durability="memory"))
    n = pool.DEFER_UNREAPED + 50
    q.put_many([b"x" * 100] * n)
    got = q.get(n)
    assert q.ack_many([m.receipt or "" for m in got]) == {}
    assert ownpool.reaper.thread is not None  # woken past the bound
    assert ownpool.wait_reaped(10)
    assert ownpool.unreaped_files() == 0


# -- bounds --------------------------------------------------------------------------------------
def test_a_drain_keeps_its_files_for_later_puts_then_trims_them_when_idle(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("drained", dirmq.QueueConfig(durability="memory"))
    for _ in range(6):
        q.put_many([SECRET] * 500)
    while got := q.get(100):
        assert q.ack_many([m.receipt or "" for m in got]) == {}
    assert ownpool.wait_reaped(10)
    own = os.listdir(own_pool(q))
    assert len(own) == 3000 and shared_files(q) == []  # every freed file kept, blank
    assert files_holding(Path(store.root), SECRET) == []
    q.put_many([b"again"] * 2000)  # overwritten in place: no new inode
    assert len(os.listdir(own_pool(q))) == 1000
    assert sorted(set(own) - set(os.listdir(own_pool(q))))  # taken from the pool
    monkeypatch.setattr(ownpool, "TRIM_IDLE_S", 0.2)
    ownpool.reaper.poke()
    deadline = time.monotonic() + 10
    while len(os.listdir(own_pool(q))) > ownpool.OWN_POOL_FILES and time.monotonic() < deadline:
        time.sleep(0.05)
        ownpool.reaper.poke()
    assert len(os.listdir(own_pool(q))) == ownpool.OWN_POOL_FILES  # idle: the surplus unlinked
    assert q.stats().ready == 2000


def test_a_named_drain_in_chunks_keeps_its_whole_share(store: dirmq.Store) -> None:
    """`claim_named` in chunks smaller than the own pool (as the Spark source leases) keeps
    the whole share it is told (`drain`), and `ack_leases` of a large batch keeps that batch,
    whoever leased it: without either, 256 are kept and the rest go to the shared pool (or,
    that full too, are unlinked: the dearest step of an ack on a disk with `discard`)."""
    q = store.create_queue("named", dirmq.QueueConfig(durability="memory"))
    q.put_many([SECRET] * 600)
    names = q.ready_names()
    for start in range(0, 600, 100):
        got = q.claim_named(names[start : start + 100], visibility_s=60, drain=600)
        assert q.ack_leases([lease for lease, _ in got]) == []
    assert ownpool.wait_reaped(10)
    assert len(os.listdir(own_pool(q))) == 600 and shared_files(q) == []
    assert files_holding(Path(store.root), SECRET) == []
    with pytest.raises(dirmq.InvalidArgument):
        q.claim_named([], drain=-1)

    other = store.create_queue("settled", dirmq.QueueConfig(durability="memory"))
    other.put_many([SECRET] * 600)
    names = other.ready_names()
    leases = [other.lease_named(names[i : i + 100], visibility_s=60) for i in range(0, 600, 100)]
    assert other.ack_leases([lease for chunk in leases for lease in chunk]) == []
    assert ownpool.wait_reaped(10)
    assert len(os.listdir(own_pool(other))) == 600 and shared_files(other) == []

    plain = store.create_queue("plain", dirmq.QueueConfig(durability="memory"))
    plain.put_many([SECRET] * 600)
    names = plain.ready_names()
    for start in range(0, 600, 100):
        got = plain.claim_named(names[start : start + 100], visibility_s=60)
        assert plain.ack_leases([lease for lease, _ in got]) == []
    assert ownpool.wait_reaped(10)
    assert len(os.listdir(own_pool(plain))) == ownpool.OWN_POOL_FILES
    assert len(shared_files(plain)) == 600 - ownpool.OWN_POOL_FILES


def test_the_pools_stay_bounded_through_a_long_drain(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "DRAIN_KEEP_FILES", 0)  # deeper than a drain keeps
    q = store.create_queue("long", dirmq.QueueConfig(durability="memory"))
    for _ in range(10):
        q.put_many([SECRET] * 500)
    largest = 0
    while got := q.get(100):
        assert q.ack_many([m.receipt or "" for m in got]) == {}
        largest = max(largest, len(os.listdir(own_pool(q))))
    assert largest <= ownpool.OWN_POOL_FILES + pool.MAX_UNREAPED  # one thread acks: no more
    assert ownpool.wait_reaped(10)
    assert len(os.listdir(own_pool(q))) == ownpool.OWN_POOL_FILES
    assert len(shared_files(q)) == recycled.DEFAULT_POOL_FILES  # the rest, 3,720, unlinked
    assert files_holding(Path(store.root), SECRET) == []


def test_retirements_unlink_when_the_reaper_is_too_far_behind(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool, "MAX_UNREAPED", 5)
    q = store.create_queue("behind")
    q.put_many([SECRET] * 8)
    got = q.get(8)
    ownpool.reaper.stop(timeout_s=5)
    try:
        assert q.ack_many([m.receipt or "" for m in got]) == {}
        assert len(os.listdir(own_pool(q))) == 5  # the 3 acks beyond were unlinked at once
        assert q.stats().total == 0
    finally:
        ownpool.reaper = ownpool.Reaper()
    assert ownpool.wait_reaped(5) and files_holding(Path(store.root), SECRET) == []


# -- crashes -------------------------------------------------------------------------------------
def test_a_killed_process_leaves_unblanked_files_that_are_never_reused(root: Path) -> None:
    q = dirmq.Store(root).create_queue("k")
    q.put_many([SECRET + b" %d" % i for i in range(10)])
    worker = spawn_worker("ack_some", root, "k", 10, "unreaped")  # killed before its reaper ran
    assert worker.stdout is not None and worker.stdout.readline().strip() == "acked"
    kill_reading_all(worker)
    dead = own_pool(q)
    assert len(files_holding(dead, SECRET)) == 10

    report = fsck(root, repair=False)
    (found,) = report.problems
    assert found.kind is Kind.ORPHAN_POOL and "10 file(s) not blanked" in found.detail
    assert report.ok  # a notice: whoever opens the queue next reclaims it

    reopened = dirmq.Store(root).queue("k")
    assert reopened.stats().total == 0  # opening it reclaimed the dead pool: nothing reused
    assert not dead.exists() and shared_files(reopened) == []
    assert files_holding(root, SECRET) == []
    assert reopened.get_one() is None
    assert fsck(root, repair=False).problems == ()


def test_no_acknowledged_message_comes_back_after_kills_mid_drain(root: Path) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("d", dirmq.QueueConfig(visibility_timeout_s=1.0, durability="memory"))
    published = set(q.put_many([SECRET + b" %d" % i for i in range(3000)]))
    acked: set[str] = set()
    kills = (0.0, 0.03, 0.07)  # after the worker's first batch
    for delay_s in kills:
        worker = spawn_worker("drain", root, "d")
        assert worker.stdout is not None
        first = worker.stdout.readline()
        time.sleep(delay_s)
        for line in [first, *kill_reading_all(worker).splitlines()]:
            kind, *ids = line.split()
            assert kind == "acked"
            acked.update(ids)
    assert len(acked) > 100, "the workers never got going"
    assert published > acked, "the workers drained everything before a kill"

    assert fsck(root, repair=False).ok  # dead pools are notices
    repaired = fsck(root, repair=True)
    assert repaired.ok and all(p.kind is Kind.ORPHAN_POOL for p in repaired.problems)
    for free in Path(q.path, layout.FREE).iterdir():
        assert free.is_file() and recycled.is_blank(str(free), free.stat().st_size)
    time.sleep(1.1)  # the leases the workers held when killed expire
    seen: set[str] = set()
    while got := q.get(100):
        seen.update(m.id for m in got)
        assert q.ack_many([m.receipt or "" for m in got]) == {}
    assert not seen & acked, "an acknowledged message was delivered again"
    # Acked by a worker that was killed before it could say so: at most one batch per kill.
    assert len(published - seen - acked) <= 20 * len(kills)
    assert ownpool.wait_reaped(10)
    assert files_holding(root, SECRET) == []
    assert fsck(root, repair=False).problems == ()
    store.close()


def test_a_forked_child_reaps_with_its_own_reaper(store: dirmq.Store) -> None:
    q = store.create_queue("fork")
    q.put_many([b"parent's", SECRET + b" child's"])
    parent_message, child_message = q.get(2)
    q.ack(parent_message.receipt or "")
    assert ownpool.wait_reaped(5)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        code = 1
        try:
            q.ack(child_message.receipt or "")
            os.write(write_end, b"ok" if ownpool.wait_reaped(5) else b"not reaped")
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        assert reader.read() == b"ok"
    assert os.waitpid(pid, 0)[1] == 0
    assert files_holding(Path(store.root), SECRET) == []


# -- faults --------------------------------------------------------------------------------------
def test_a_blanking_that_finds_the_disk_full_still_acks_and_gives_the_space_back(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("full")
    q.put_many([SECRET] * 6)
    got = q.get(6)
    assert q.ack_many([m.receipt or "" for m in got[:3]]) == {}
    assert ownpool.wait_reaped(5) and q._files.pool.own_files() == 3
    fs = FaultyFS(monkeypatch, store.root)
    fs.fail("pwrite", errno.ENOSPC)
    assert q.ack_many([m.receipt or "" for m in got[3:]]) == {}  # no error for the acks
    assert ownpool.wait_reaped(5)
    assert fs.raised["pwrite"] >= 1
    fs.clear()
    assert q.stats().total == 0
    assert os.listdir(own_pool(q)) == [], "the pools are emptied at ENOSPC"
    assert files_holding(Path(store.root), SECRET) == []


# -- extend_many -----------------------------------------------------------------------------------
def _deadline_ms(q: dirmq.Queue, message_id: str) -> int:
    (name,) = [n for n in os.listdir(Path(q.path, layout.LEASED)) if n.startswith(message_id)]
    entry = layout.parse_entry(name)
    assert entry is not None and entry.at_ms is not None
    return entry.at_ms


def test_extend_many_extends_the_live_leases_and_reports_the_others(
    store: dirmq.Store,
) -> None:
    q = store.create_queue("ext", dirmq.QueueConfig(visibility_timeout_s=30))
    q.put_many([b"%d" % i for i in range(5)])
    live = q.get(3)
    expired = q.get_one(visibility_s=0.01)
    assert expired is not None
    time.sleep(0.05)
    again = q.get(2)  # the expired lease is received again: its first receipt is stale
    assert expired.id in {m.id for m in again}
    q.ack(live[2].receipt or "")
    receipts = [m.receipt or "" for m in live] + [expired.receipt or "", "not-a-receipt"]

    before_ms = time.time_ns() // 1_000_000
    failures = q.extend_many(receipts, 600)
    assert sorted(failures) == sorted([live[2].receipt, expired.receipt, "not-a-receipt"])
    assert isinstance(failures[live[2].receipt or ""], dirmq.StaleReceipt)
    assert isinstance(failures[expired.receipt or ""], dirmq.StaleReceipt)
    assert isinstance(failures["not-a-receipt"], dirmq.InvalidArgument)
    for message in live[:2]:
        assert _deadline_ms(q, message.id) >= before_ms + 600_000
    assert q.ack_many([m.receipt or "" for m in live[:2]]) == {}  # receipts stay valid
    with pytest.raises(dirmq.InvalidArgument):
        q.extend_many([again[0].receipt or ""], -1)


def test_extend_many_raises_a_storage_error_once_all_were_tried_and_extend_each_reports_it(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("extfail", dirmq.QueueConfig(visibility_timeout_s=30))
    q.put_many([b"a", b"b", b"c"])
    receipts = [m.receipt or "" for m in q.get(3)]
    fs = FaultyFS(monkeypatch, store.root)
    fs.fail("rename", errno.EIO, after=1)  # the first extend works, the others fail
    with pytest.raises(dirmq.StorageError):
        q.extend_many(receipts, 600)
    assert fs.raised["rename"] == 2, "every receipt was tried"
    fs.fail("rename", errno.EIO, after=1)
    failures = q.extend_each(receipts, 600)
    fs.clear()
    assert sorted(failures) == sorted(receipts[1:])
    assert all(isinstance(e, dirmq.StorageError) for e in failures.values())
    assert q.ack_many(receipts) == {}
