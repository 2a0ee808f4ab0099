"""The commit journal (store/journal.py, store/journal_replay.py; docs/FORMAT.md, "The commit
journal"): a writethrough group's record made durable before its files are named, its
checkpoints, the recovery of a dead process's journal (this boot: flushed, never replayed) and
of a machine crash's (an earlier boot: what is missing written back, nothing else), its errors,
fsck, the root's format, and the server with the journal on and off."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.errors import ConfigError, StorageError
from dirmq.server import broker as broker_module
from dirmq.server.broker import Broker
from dirmq.store import codec, direct_lease, fsio, journal_replay, layout
from dirmq.store import journal as journal_module
from dirmq.store.config import QueueConfig
from dirmq.store.direct_lease import DirectLease
from dirmq.store.fsck import Kind, fsck
from dirmq.store.journal_format import header, record_pieces
from dirmq.store.journal_judge import Verdict, judge_all
from dirmq.store.journal_replay import read_records
from dirmq.store.marker import BASE_FORMAT, ROOT_FORMAT
from dirmq.store.processes import HOST_TAG, ProcessIdentity, current

from .support.disks import small_tmpfs
from .support.faultfs import FaultyFS
from .support.journal_roots import ANOTHER_BOOT, as_if_rebooted, journals, root_format
from .support.procs import dead_pid, kill, spawn
from .support.servers import start_server
from .support.spies import spy
from .support.waiting import wait_until


def _dead_owner() -> str:
    """The token of a process of this host and namespace that has exited."""
    return ProcessIdentity(HOST_TAG, current().pid_ns, dead_pid(), 1).token()


def _write_journal(
    root: Path, records: list[tuple[str, str, bytes]], *, boot: str, tail: bytes = b""
) -> Path:
    """A journal of a dead process written in `boot` holding `records` (queue, name in the
    queue, bytes), and `tail` after them (a torn record): a journal 1, as the previous
    version wrote (its records name their queue by name alone)."""
    owner = _dead_owner()
    path = root / layout.JOURNAL_DIR / f"{owner}.1"
    path.parent.mkdir(mode=0o700, exist_ok=True)  # the modes of a private root's (as written)
    pieces = [header(boot, owner, version=1)]
    for queue, name, data in records:
        pieces += record_pieces(queue, name, data)
    path.write_bytes(b"".join(pieces) + tail)
    path.chmod(0o600)
    return path


def _file_of(q: dirmq.Queue, message_id: str) -> tuple[str, bytes]:
    """(name in the queue's directory, bytes) of a message's file, in whatever state."""
    for directory in (layout.READY, layout.LEASED, layout.DEAD):
        for name in os.listdir(os.path.join(q.path, directory)):
            if name.startswith(message_id):
                with open(os.path.join(q.path, directory, name), "rb") as f:
                    return f"{directory}/{name}", f.read()
    raise AssertionError(f"{message_id} has no file")


def _copies(q: dirmq.Queue, message_id: str) -> list[str]:
    return [
        f"{directory}/{name}"
        for directory in (layout.READY, layout.LEASED, layout.DEAD, layout.CORRUPT)
        for name in os.listdir(os.path.join(q.path, directory))
        if name.startswith(message_id)
    ]


# -- the writer ---------------------------------------------------------------------------------
def test_a_groups_record_is_flushed_before_its_files_are_named(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q")
    assert root_format(root) == BASE_FORMAT, "no journal yet: the root stays readable by format 5"
    ready_at_flush: list[list[str]] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:  # what is visible when the journal is flushed
        ready_at_flush.append(os.listdir(os.path.join(q.path, layout.READY)))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    ids = q.put_many([b"one", b"two", b"three"])
    monkeypatch.setattr(os, "fdatasync", real_fdatasync)
    assert ready_at_flush[-1] == [], "a file was named before its record was durable"
    assert sorted(os.listdir(os.path.join(q.path, layout.READY))) == sorted(ids)
    assert root_format(root) == ROOT_FORMAT, "the first journal marks the root format 6"
    [journal] = journals(root)
    records = list(read_records(str(root / layout.JOURNAL_DIR / journal)))
    assert [(r.queue, r.name) for r in records] == [("q", f"@ready/{i}") for i in ids]
    assert [r.data for r in records] == [_file_of(q, i)[1] for i in ids]
    store.close()
    assert journals(root) == [], "close checkpoints and removes the journal"


def test_a_group_of_thousands_is_one_journal_append(root: Path) -> None:
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        ids = q.put_many([b"%d" % i for i in range(2000)])  # 6,000 pieces: past IOV_MAX
        [journal] = journals(root)
        records = list(read_records(str(root / layout.JOURNAL_DIR / journal)))
        assert [r.name.rpartition("/")[2] for r in records] == ids
        assert {r.name.split("/")[0] for r in records} == {"@ready", "@backlog"}  # past 1,000


def test_a_checkpoint_removes_the_journal_once_the_files_are_flushed(root: Path) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q")
    q.put(b"x")
    first = journals(root)
    assert len(first) == 1
    wait_until(lambda: first[0] not in journals(root), 10, "a checkpoint")
    q.put(b"y")  # a new journal file, since the last one was dropped
    assert journals(root) and journals(root) != first
    wait_until(lambda: not journals(root), 10, "an idle journal closed")
    assert store.journal.checkpoints >= 2
    assert q.stats().ready == 2
    store.close()


def test_publishing_does_not_wake_the_checkpoint_thread(root: Path) -> None:
    """The checkpoint thread sleeps about a second between checkpoints whatever the publish
    rate: a wake-up a group would cost each message a context switch and a GIL handoff."""

    def switches(thread: threading.Thread) -> int:
        status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
        return sum(int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line)

    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        q.put(b"first")  # the journal's first file starts its checkpoint thread
        thread = store.journal._thread
        assert thread is not None
        before = switches(thread)
        for i in range(300):
            q.put(b"%d" % i)
        woken = switches(thread) - before
        assert thread.is_alive()
    assert woken < 20, f"the checkpoint thread was woken {woken} times by 300 publishes"


def test_publishing_while_and_after_the_store_closes_leaves_no_journal(root: Path) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q")
    acknowledged: list[str] = []
    closed = threading.Event()

    def publish() -> None:  # a server's last requests, racing its store's close
        while not closed.is_set():
            acknowledged.extend(q.put_many([b"a", b"b"]))
        acknowledged.extend(q.put_many([b"after", b"close"]))

    publisher = threading.Thread(target=publish)
    publisher.start()
    wait_until(lambda: len(acknowledged) >= 20, 10, "publishes")
    store.close()
    closed.set()
    publisher.join()
    # A journal made after the close would have no checkpoint to flush and remove it: never
    # removed while the process lives, replayed whole after a machine crash.
    assert journals(root) == []
    ready = os.listdir(os.path.join(q.path, layout.READY))
    assert sorted(ready) == sorted(acknowledged), "every publish stored, once"


def test_a_store_left_unclosed_holds_no_descriptor_once_its_journal_is_idle(root: Path) -> None:
    """A library user that opens a Store for each publish and never closes it: each kept the
    root open for the process's life (EMFILE in the end), where without the journal nothing
    was left."""
    store = dirmq.Store(root)
    store.create_queue("q").put(b"x")
    journal = store.journal
    wait_until(lambda: journal._thread is None, 30, "the checkpoint thread ended (idle)")
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.add(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            pass  # listdir's own
    assert str(root) not in held
    assert journals(root) == []
    store.close()


def test_a_forked_child_never_writes_into_its_parents_journal(root: Path) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q")
    mine = q.put(b"parent")
    [journal] = journals(root)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the parent's Store, used in the child: its own flush
        try:
            os.write(write, q.put(b"child").encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 100).decode()
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0 and child
    records = read_records(str(root / layout.JOURNAL_DIR / journal))
    assert [r.name for r in records] == [f"{layout.READY}/{mine}"]
    assert sorted(os.listdir(os.path.join(q.path, layout.READY))) == sorted([mine, child])
    store.close()
    assert journals(root) == []


def test_a_forked_child_holds_none_of_its_parents_journal_descriptors(root: Path) -> None:
    """A fork copies every descriptor: held by the child, a journal its parent's checkpoint
    removes keeps its blocks for the child's life (and stays open for writing)."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    q.put(b"parent")
    [journal] = journals(root)
    forked, go = os.pipe()
    hold, release = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(go, b".")
            os.read(hold, 1)
        finally:
            os._exit(0)
    try:
        assert os.read(forked, 1) == b"."  # the child runs (its fork handlers are done)
        held = set()
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except FileNotFoundError:
                pass
        assert str(root / layout.JOURNAL_DIR / journal) not in held
        assert str(root) not in held
    finally:
        os.write(release, b".")
        assert os.waitpid(pid, 0)[1] == 0
        for fd in (forked, go, hold, release):
            os.close(fd)
        store.close()
    assert journals(root) == []


def test_the_direct_path_commits_through_the_journal(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q")
    flushed_dirs = spy(monkeypatch, direct_lease, "fsync_dir", lambda path: path)
    message = dirmq.OutgoingMessage(b"straight")
    q.validate(message)
    assert q.direct.admits(message, None)
    [leased] = q.direct.put_leased([DirectLease(message, 30.0, None)])
    assert flushed_dirs == [], "no directory fsync: the journal's record made it durable"
    [journal] = journals(root)
    [record] = read_records(str(root / layout.JOURNAL_DIR / journal))
    assert record.name.startswith(f"{layout.LEASED}/{leased.id}.1.")
    q.ack(leased.receipt or "")
    store.close()


def test_the_journal_off_leaves_the_root_at_format_5(root: Path) -> None:
    with dirmq.Store(root, journal=False) as store:
        store.create_queue("q").put_many([b"a", b"b"])
        assert journals(root) == [] and root_format(root) == BASE_FORMAT


def test_a_queue_on_another_filesystem_is_not_committed_through_the_journal(root: Path) -> None:
    """A checkpoint flushes the root's filesystem only (`syncfs`): the journal of a file on
    another would be removed with the file still in the page cache."""
    with dirmq.Store(root, journal=False):
        pass
    with small_tmpfs(root, "4m") as mount_point, dirmq.Store(root) as store:
        elsewhere = store.create_queue(mount_point.name)
        elsewhere.put_many([b"a", b"b"])
        assert journals(root) == [], "committed by its own flush"
        here = store.create_queue("q").put(b"c")
        [journal] = journals(root)
        [record] = read_records(str(root / layout.JOURNAL_DIR / journal))
        assert record.name == f"{layout.READY}/{here}"
        assert elsewhere.stats().ready == 2


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("call", "error"), [("writev", errno.ENOSPC), ("fdatasync", errno.EIO)])
def test_a_failed_append_or_flush_fails_the_group_and_counts_no_record(
    root: Path, monkeypatch: pytest.MonkeyPatch, call: str, error: int
) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("q")
    kept = q.put(b"before")
    [journal] = journals(root)
    path = root / layout.JOURNAL_DIR / journal
    size = path.stat().st_size
    faults = FaultyFS(monkeypatch, root)
    faults.fail(call, error)
    expected = dirmq.DiskFull if error == errno.ENOSPC else dirmq.StorageError
    with pytest.raises(expected):
        q.put_many([b"lost", b"too"])
    faults.clear()
    assert os.listdir(os.path.join(q.path, layout.READY)) == [kept], "nothing half-visible"
    assert os.listdir(os.path.join(q.path, layout.TMP)) == []
    assert path.stat().st_size == size, "the failed group's records were truncated away"
    later = q.put(b"after")  # the journal goes on (a new file after a failed flush)
    names = [r.name for j in journals(root) for r in read_records(str(root / "@journal" / j))]
    assert f"@ready/{later}" in names and not any("lost" in n for n in names)
    assert sorted(m.body for m in q.get(5)) == [b"after", b"before"]
    store.close()


def test_a_journal_file_that_cannot_be_made_leaves_publishes_to_their_own_flush(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors (or inodes), a checkpoint that could not switch to a new file never
    removed the one it had: a journal growing for as long as that lasts."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    ids = [q.put(b"first")]
    [first] = journals(root)
    faults = FaultyFS(monkeypatch, root / layout.JOURNAL_DIR)
    faults.fail("open", errno.EMFILE)

    def checkpointed() -> bool:
        ids.append(q.put(b"more"))
        return first not in journals(root)

    wait_until(checkpointed, 10, "the journal checkpointed and removed")
    ids.append(q.put(b"after"))  # no journal to be had: flushed itself
    faults.clear()
    assert sorted(os.listdir(os.path.join(q.path, layout.READY))) == sorted(ids)
    store.close()
    assert journals(root) == []


def test_a_failed_checkpoint_keeps_the_journal_until_a_reboot_replays_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint's `syncfs` that fails (EIO): the kernel reports a writeback error once, so a
    retry that succeeds proves nothing of the files the journal covers. The journal is kept as
    `unflushed.<name>` (no checkpoint, close or same-boot opener removes it), the Store's later
    publishes take their own flush, fsck reports it (an error, no repair), and after a reboot
    it is replayed: what the disk lost is written back."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    faults = FaultyFS(monkeypatch, root)
    monkeypatch.setattr(journal_module, "syncfs", fsio.syncfs)  # the faulty one
    faults.fail("syncfs", errno.EIO)
    kept = q.put(b"kept")
    [journal] = journals(root)
    wait_until(lambda: faults.raised["syncfs"] >= 1, 30, "a failed checkpoint")
    faults.clear()
    wait_until(lambda: journals(root) == [f"unflushed.{journal}"], 30, "the journal kept")
    later = q.put(b"later")  # its own flush: no journal
    assert journals(root) == [f"unflushed.{journal}"]
    store.close()
    with dirmq.Store(root):  # a same-boot opener leaves it: the page cache proves nothing
        assert journals(root) == [f"unflushed.{journal}"]
    report = fsck(root, repair=True)
    assert [p.kind for p in report.problems] == [Kind.UNFLUSHED_JOURNAL]
    assert not report.ok and journals(root) == [f"unflushed.{journal}"]
    # The reboot: its header names an earlier boot, and the disk lost the file.
    path = root / layout.JOURNAL_DIR / f"unflushed.{journal}"
    as_if_rebooted(path)
    os.unlink(os.path.join(q.path, layout.READY, kept))
    with dirmq.Store(root):
        assert journals(root) == []
        assert sorted(os.listdir(os.path.join(q.path, layout.READY))) == sorted([kept, later])


def test_a_journal_whose_removal_failed_is_removed_later_its_descriptor_closed_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint whose unlink of a flushed journal fails (EIO) tries again at the next one.
    Its descriptor was closed already: closed again, its number was the next journal file's
    by then, and the publishes after it failed (EBADF) or wrote into whatever held it."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    faults = FaultyFS(monkeypatch, root)
    faults.fail("unlink", errno.EIO, times=1)
    q.put(b"first")
    wait_until(lambda: faults.raised["unlink"] == 1, 30, "a failed removal")
    journal = store.journal
    for n in range(3):  # each in a journal file of its own: the checkpoints switch files
        done = journal.checkpoints
        q.put(b"%d" % n)
        wait_until(lambda done=done: journal.checkpoints > done, 30, "a checkpoint")
    wait_until(lambda: journals(root) == [], 30, "every journal removed")
    assert len(q.get(10, visibility_s=60)) == 4
    store.close()


def test_a_failed_checkpoint_that_cannot_rename_a_journal_still_closes_every_one(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failing disk fails more than the syncfs: a journal it cannot rename `unflushed.` stays
    as it is, and the others are still renamed (or removed, with no record) and closed."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    q.put(b"kept")
    [first] = journals(root)
    faults = FaultyFS(monkeypatch, root)
    monkeypatch.setattr(journal_module, "syncfs", fsio.syncfs)  # the faulty one
    faults.fail("syncfs", errno.EIO)
    faults.fail("rename", errno.EIO, times=1)
    wait_until(lambda: faults.raised["rename"] == 1, 30, "a failed checkpoint's rename")
    wait_until(lambda: store.journal._thread is None, 30, "the journal off")
    faults.clear()
    assert journals(root) == [first]  # the checkpoint's next file, empty, removed
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            held.add(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:
            pass
    assert not [path for path in held if layout.JOURNAL_DIR in path]
    store.close()


def test_a_failed_checkpoint_keeps_the_dead_processes_journals_it_was_to_remove(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files a dead publisher's journal covers are as unsure as this Store's once a
    `syncfs` failed: the error was this process's to see, and a later opener's flush, through
    a descriptor opened after it, succeeds and would remove that journal."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    [dead] = _killed_publishers_journals(root)
    faults = FaultyFS(monkeypatch, root)
    monkeypatch.setattr(journal_module, "syncfs", fsio.syncfs)  # the faulty one
    faults.fail("syncfs", errno.EIO)
    q.put(b"mine")
    [mine] = [j for j in journals(root) if j != dead]
    wait_until(lambda: faults.raised["syncfs"] >= 1, 30, "a failed checkpoint")
    faults.clear()
    kept = sorted([f"unflushed.{dead}", f"unflushed.{mine}"])
    wait_until(lambda: journals(root) == kept, 30, "both journals kept")
    store.close()
    with dirmq.Store(root):  # a same-boot opener leaves them
        assert journals(root) == kept
    assert {p.kind for p in fsck(root, repair=False).problems} == {Kind.UNFLUSHED_JOURNAL}


def test_a_failed_recovery_flush_keeps_the_dead_processes_journals(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opener whose `syncfs` fails has seen the error: the next opener's succeeds and would
    remove the journal of files that may not be on the disk."""
    with dirmq.Store(root) as setup:
        setup.create_queue("q")
    [dead] = _killed_publishers_journals(root)
    faults = FaultyFS(monkeypatch, root)
    monkeypatch.setattr(journal_replay, "syncfs", fsio.syncfs)  # the faulty one
    faults.fail("syncfs", errno.EIO)
    with pytest.raises(StorageError):
        dirmq.Store(root)
    faults.clear()
    assert journals(root) == [f"unflushed.{dead}"]
    with dirmq.Store(root):
        assert journals(root) == [f"unflushed.{dead}"]


def _killed_publishers_journals(root: Path) -> list[str]:
    """The journals a publisher left, SIGKILLed while publishing into `root`'s queue `q`."""
    before = set(journals(root))
    publisher = spawn("publish", root, "q", module="tests.support.journal_workers")
    assert publisher.stdout is not None
    publisher.stdout.readline()
    kill(publisher)
    return sorted(set(journals(root)) - before)


# -- recovery: a dead process of this boot ------------------------------------------------------
def test_a_killed_publishers_journal_is_flushed_and_removed_never_replayed(root: Path) -> None:
    with dirmq.Store(root) as setup:
        setup.create_queue("q")
    publisher = spawn("publish", root, "q", module="tests.support.journal_workers")
    assert publisher.stdout is not None
    acknowledged: list[str] = []
    while len(acknowledged) < 200:
        acknowledged += publisher.stdout.readline().split()
    acknowledged += kill(publisher).split()
    assert journals(root), "the publisher was killed with its journal open"
    # A message consumed meanwhile (its file gone, as an ack retires it): a replay would bring
    # it back, a flush does not.
    consumed = acknowledged[0]
    os.unlink(os.path.join(root, "q", layout.READY, consumed))
    report = fsck(root, repair=False)
    assert {p.kind for p in report.problems} == {Kind.JOURNAL}
    assert report.ok, "a dead process's journal is a notice"
    with dirmq.Store(root) as store:
        assert journals(root) == []
        q = store.queue("q")
        ready = os.listdir(os.path.join(q.path, layout.READY))
        assert consumed not in ready
        assert sorted(set(acknowledged) - {consumed}) == sorted(
            n for n in ready if n in set(acknowledged)
        ), "every acknowledged message present, once"


def test_a_killed_publishers_journal_is_flushed_and_removed_by_a_running_publisher(
    root: Path,
) -> None:
    """Left until the next open, a dead process's journal outlives the acks of what it covers,
    and a machine crash, however much later, replays them all."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    publisher = spawn("publish", root, "q", module="tests.support.journal_workers")
    assert publisher.stdout is not None
    acknowledged = publisher.stdout.readline().split()
    acknowledged += kill(publisher).split()
    [dead] = journals(root)
    for message in q.get(10, visibility_s=60):  # consumed and acknowledged
        q.ack(message.receipt or "")
    q.put(b"mine")  # this process's journal: its checkpoints run
    wait_until(lambda: dead not in journals(root), 30, "the dead journal flushed and removed")
    store.close()


def test_a_killed_publishers_journal_is_removed_by_a_server_that_only_consumes(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that publishes nothing runs no checkpoint: the server sweeps dead publishers'
    journals now and then itself (here every 50 ms), as it releases idle queues."""
    monkeypatch.setattr(broker_module, "RELEASE_EVERY_S", 0.05)
    store = dirmq.Store(root)
    q = store.create_queue("q")
    publisher = spawn("publish", root, "q", module="tests.support.journal_workers")
    assert publisher.stdout is not None
    publisher.stdout.readline()
    kill(publisher)
    [dead] = journals(root)

    async def consume_only() -> None:
        broker = Broker(store)
        broker.start()
        try:
            got = await broker.receive(q, 10, 60, 0)
            assert got
            for message in got:
                await broker.ack(q, message.receipt or "")
            async with asyncio.timeout(30):
                while dead in journals(root):
                    await asyncio.sleep(0.02)
        finally:
            broker.close()

    asyncio.run(consume_only())
    assert store.journal.checkpoints == 0  # no journal of its own swept it
    store.close()


# -- recovery: a machine crash (an earlier boot) ------------------------------------------------
FATES = ("intact", "lost", "torn", "leased", "dead", "tail")


@pytest.fixture
def crashed(root: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A root whose queue `q` holds messages in every fate a machine crash can leave, and a
    journal of an earlier boot recording all of them: the messages' names by fate."""
    store = dirmq.Store(root, journal=False)
    q = store.create_queue("q")
    gone_q = store.create_queue("deleted")
    fates = dict(zip(FATES, q.put_many([f.encode() for f in FATES]), strict=True))
    data = {fate: _file_of(q, message_id)[1] for fate, message_id in fates.items()}
    # Recorded as their publish named them (in @ready, never received).
    records = [("q", f"{layout.READY}/{fates[f]}", data[f]) for f in FATES if f != "tail"]
    for message in q.get(len(FATES), visibility_s=600):
        if message.id == fates["dead"]:
            q.dead_letter(message.receipt or "")
        elif message.id != fates["leased"]:  # that one stays leased
            q.nack(message.receipt or "")  # now @ready/<id>.1
    # A direct lease whose file the crash lost: written back into @ready.
    direct_id = "1" * 16 + "-" + "d" * 12
    lost_lease = f"{layout.LEASED}/{layout.timed_name(direct_id, 1, 1, None)}"
    records.append(("q", lost_lease, codec.encode(b"direct", {}, None, message_id=direct_id)))
    fates["direct"] = direct_id
    gone_id = gone_q.put(b"gone")
    records.append(("deleted", *_file_of(gone_q, gone_id)))
    store.close()
    shutil.rmtree(os.path.join(root, "deleted"))  # its queue deleted since
    ready = os.path.join(q.path, layout.READY)
    os.unlink(os.path.join(ready, f"{fates['lost']}.1"))
    with open(os.path.join(ready, f"{fates['torn']}.1"), "r+b") as f:
        f.truncate(10)
    os.unlink(os.path.join(ready, f"{fates['tail']}.1"))
    tail = b"".join(record_pieces("q", f"{layout.READY}/{fates['tail']}", data["tail"]))
    _write_journal(root, records, boot=ANOTHER_BOOT, tail=tail[:-3])
    yield root, fates


def test_a_crash_journal_writes_back_exactly_what_is_missing_or_torn(
    crashed: tuple[Path, dict[str, str]],
) -> None:
    root, fates = crashed
    [judged] = judge_all(str(root))
    assert judged.verdict is Verdict.CRASHED
    with dirmq.Store(root) as store:
        assert journals(root) == []
        q = store.queue("q")
        ready = os.listdir(os.path.join(q.path, layout.READY))
        assert fates["lost"] in ready and q.peek(fates["lost"]).body == b"lost"
        assert fates["torn"] in ready and q.peek(fates["torn"]).body == b"torn"
        assert _copies(q, fates["torn"]) == [f"{layout.READY}/{fates['torn']}"], "torn: anew"
        for fate in ("intact", "leased", "dead"):  # there, in any state: left as it is
            assert len(_copies(q, fates[fate])) == 1, fate
        assert _copies(q, fates["leased"])[0].startswith(layout.LEASED)
        assert _copies(q, fates["dead"])[0].startswith(layout.DEAD)
        assert _copies(q, fates["tail"]) == [], "a torn tail record was never acknowledged"
        assert _copies(q, fates["direct"]) == [f"{layout.READY}/{fates['direct']}.1"]
        assert _copies(q, fates["intact"]) == [f"{layout.READY}/{fates['intact']}.1"]
        assert q.peek(fates["direct"]).body == b"direct"
        assert not os.path.exists(os.path.join(root, "deleted"))
    report = fsck(root, repair=False)
    assert report.ok, report.problems


def test_a_replayed_message_holds_its_capacity_slot_again(root: Path) -> None:
    """A slot's symlink is made with no flush of its own (a writethrough publish's directory
    fsync used to carry it): a machine crash loses it with the file, and the message written
    back without it would let the queue hold more than its capacity."""
    with dirmq.Store(root, journal=False) as store:
        q = store.create_queue("q", QueueConfig(capacity=2))
        ids = q.put_many([b"one", b"two"])
        records = [("q", f"{layout.READY}/{i}", _file_of(q, i)[1]) for i in ids]
    for message_id in ids:  # lost to the crash: the files and their slots
        os.unlink(os.path.join(q.path, layout.READY, message_id))
    for slot in os.listdir(os.path.join(q.path, layout.SLOTS)):
        os.unlink(os.path.join(q.path, layout.SLOTS, slot))
    _write_journal(root, records, boot=ANOTHER_BOOT)
    with dirmq.Store(root) as store:
        q = store.queue("q")
        assert q.stats().ready == 2
        slots = os.path.join(q.path, layout.SLOTS)
        assert sorted(os.readlink(os.path.join(slots, s)) for s in os.listdir(slots)) == sorted(ids)
        with pytest.raises(dirmq.QueueFull):
            q.put(b"three", timeout_s=0)


def test_a_replay_cut_short_by_its_claimers_death_is_claimed_and_done_again(
    crashed: tuple[Path, dict[str, str]],
) -> None:
    root, fates = crashed
    [name] = journals(root)
    claimed = f"replaying.{ANOTHER_BOOT}.{_dead_owner()}.{name}"
    os.rename(root / layout.JOURNAL_DIR / name, root / layout.JOURNAL_DIR / claimed)
    [judged] = judge_all(str(root))
    assert judged.verdict is Verdict.CRASHED
    with dirmq.Store(root) as store:
        assert journals(root) == []
        q = store.queue("q")
        for fate in ("lost", "torn", "direct", "intact", "leased"):
            assert len(_copies(q, fates[fate])) == 1, fate


def test_a_replay_writes_nothing_outside_its_queues(root: Path) -> None:
    with dirmq.Store(root, journal=False) as store:
        store.create_queue("q")
    message_id = "1" * 16 + "-" + "e" * 12
    data = codec.encode(b"escape", {}, None, message_id=message_id)
    records = [
        ("q", f"{layout.READY}/../../{message_id}", data),
        ("../outside", f"{layout.READY}/{message_id}", data),
        ("q", f"not-a-state/{message_id}", data),
        # A state no publish names: a message file among the capacity or dedup symlinks, the
        # pool's free files, the dead letters or the temps would be a queue no one wrote.
        *[
            ("q", f"{state}/{message_id}", data)
            for state in (layout.SLOTS, layout.DEDUP, layout.FREE, layout.DEAD, layout.TMP)
        ],
        ("q", f"{layout.CORRUPT}/{message_id}", data),
    ]
    _write_journal(root, records, boot=ANOTHER_BOOT)
    before = sorted(p.name for p in root.parent.iterdir())
    with dirmq.Store(root):
        assert journals(root) == []
    assert sorted(p.name for p in root.parent.iterdir()) == before
    assert not list(root.glob(f"**/{message_id}*"))


def test_two_processes_recovering_one_crash_journal_write_each_message_once(
    crashed: tuple[Path, dict[str, str]],
) -> None:
    root, fates = crashed
    workers = [
        spawn("recover", root, module="tests.support.journal_workers", stdin=True) for _ in range(2)
    ]
    for worker in workers:
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
    counts = sorted(int(worker.communicate(timeout=60)[0]) for worker in workers)
    assert counts == [0, 3], "one claimed it (lost, torn, direct), the other found it gone"
    with dirmq.Store(root) as store:
        q = store.queue("q")
        for fate in ("lost", "torn", "direct", "intact"):
            assert len(_copies(q, fates[fate])) == 1, fate


def test_fsck_reports_a_crash_journal_and_repair_replays_it(
    crashed: tuple[Path, dict[str, str]],
) -> None:
    root, fates = crashed
    report = fsck(root, repair=False)
    [problem] = [p for p in report.problems if p.kind.value == "journal"]
    assert "earlier boot" in problem.detail and not problem.repaired
    assert journals(root), "a check alone changes nothing"
    repaired = fsck(root, repair=True)
    [fixed] = [p for p in repaired.problems if p.kind.value == "journal"]
    assert fixed.repaired and "3 missing message(s) written back" in fixed.detail
    assert journals(root) == []
    assert os.path.exists(os.path.join(root, "q", layout.READY, fates["lost"]))


def test_a_journal_of_a_live_process_is_left_alone(root: Path) -> None:
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
        q.put(b"x")
        [journal] = journals(root)
        with dirmq.Store(root) as other:  # another opener: the owner (this process) runs
            assert other.queue("q").stats().ready == 1
        assert journals(root) == [journal]
        assert [j.verdict for j in judge_all(str(root))] == [Verdict.IN_USE]
        assert not [p for p in fsck(root, repair=False).problems if p.kind.value == "journal"]


# -- the format ---------------------------------------------------------------------------------
def test_a_root_of_a_newer_format_is_refused(root: Path) -> None:
    root.mkdir()
    (root / layout.ROOT_MARKER).write_text('{"format": 7, "access": "private"}\n')
    with pytest.raises(ConfigError, match="format 7, newer than this dirmq reads"):
        dirmq.Store(root)
    report = fsck(root, repair=True)
    assert any("unsupported root format 7" in p.detail for p in report.problems)


def test_a_journal_whose_header_this_version_does_not_write_is_left_alone(root: Path) -> None:
    """A newer journal format (or a garbled header): its records cannot be read here, and
    removing it (as a dead process's, or an empty replay's) could lose what they hold."""
    with dirmq.Store(root, journal=False) as store:
        store.create_queue("q")
    path = _write_journal(root, [], boot=ANOTHER_BOOT)
    owner = path.name.rpartition(".")[0]
    path.write_bytes(f"dirmq-journal 3 boot={ANOTHER_BOOT} owner={owner}\n@...".encode())
    assert [j.verdict for j in judge_all(str(root))] == [Verdict.FOREIGN]
    with dirmq.Store(root):
        assert journals(root) == [path.name]
    report = fsck(root, repair=True)
    assert [p.kind for p in report.problems] == [Kind.STRAY]
    assert journals(root) == [path.name]


# -- the server ---------------------------------------------------------------------------------
@pytest.mark.parametrize("journal", [True, False])
def test_the_servers_publish_with_the_journal_on_and_off(tmp_path: Path, journal: bool) -> None:
    root = tmp_path / "root"
    server = start_server(root, *([] if journal else ["--no-journal"]))
    try:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            assert client.put("/q").status_code in (200, 201)
            answer = client.post("/q/messages", content=b"hello")
            assert answer.status_code == 201, answer.text
            message_id = answer.json()["id"]
            assert os.listdir(root / "q" / layout.READY) == [message_id]
            assert bool(journals(root)) is journal
            assert root_format(root) == (ROOT_FORMAT if journal else BASE_FORMAT)
            assert client.get("/q/messages").content == b"hello"
    finally:
        server.stop()
    assert journals(root) == [], "a server that stops leaves no journal"
