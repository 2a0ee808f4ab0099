"""The commit journal's edges between processes (store/journal.py, journal_replay.py,
marker.py; docs/FORMAT.md, "The commit journal"): a journal kept unflushed whose rename failed,
the root's format never marked backwards, a queue deleted and created again before a crash,
and a process that re-executes itself."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import StorageError
from dirmq.store import fsio, init_root, journal_replay, layout
from dirmq.store import incarnation as incarnation_module
from dirmq.store import journal as journal_module
from dirmq.store.fsck import Kind, fsck
from dirmq.store.incarnation import incarnation
from dirmq.store.journal_judge import Verdict, judge_all
from dirmq.store.journal_replay import read_records

from .support.faultfs import FaultyFS
from .support.journal_roots import as_if_rebooted, journals, root_format
from .support.procs import kill, spawn


# -- 1. a journal kept unflushed whose rename failed --------------------------------------------
def test_a_journal_its_failed_checkpoint_could_not_rename_is_kept_once_its_owner_dies(
    root: Path,
) -> None:
    """A checkpoint's `syncfs` failed, and so did the rename that marks the journal
    `unflushed.`: under its owner's name, it was judged the journal of a process that merely
    died once its owner was killed, and the next opener's flush (which succeeds, proving
    nothing) removed it with the only durable copy of what the disk may have lost."""
    with dirmq.Store(root) as setup:
        q = setup.create_queue("q")
    publisher = spawn("publish_unflushed", root, "q", module="tests.support.journal_workers")
    assert publisher.stdout is not None
    message_id = publisher.stdout.readline().strip()
    assert message_id, "the publisher gave its journal up"
    kill(publisher)
    [journal] = journals(root)
    with dirmq.Store(root) as store:  # a same-boot opener, and its sweep
        store.sweep_journals()
        assert journals(root) == [journal], "kept: neither removed nor replayed"
    assert [j.verdict for j in judge_all(str(root))] == [Verdict.UNFLUSHED]
    report = fsck(root, repair=True)
    assert [p.kind for p in report.problems] == [Kind.UNFLUSHED_JOURNAL]
    init_root(root)  # `dirmq init` gives every entry the root's modes: not this one
    assert [j.verdict for j in judge_all(str(root))] == [Verdict.UNFLUSHED]
    assert journals(root) == [journal]
    # The reboot, and the disk lost the file: the journal brings it back.
    as_if_rebooted(root / layout.JOURNAL_DIR / journal)
    os.unlink(os.path.join(q.path, layout.READY, message_id))
    with dirmq.Store(root) as store:
        assert journals(root) == []
        assert os.listdir(os.path.join(q.path, layout.READY)) == [message_id]
        assert store.queue("q").peek(message_id).body == b"unflushed"


def test_a_failed_recovery_flush_that_cannot_rename_a_dead_journal_still_keeps_it(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recovery's `syncfs` failed: each dead process's journal is kept, and one whose rename
    failed too must be kept all the same (and must not stop the others being kept)."""
    with dirmq.Store(root) as setup:
        setup.create_queue("q")
    publishers = [
        spawn("publish", root, "q", module="tests.support.journal_workers") for _ in range(2)
    ]
    for publisher in publishers:  # both publishing at once (an opener flushes a dead one's)
        assert publisher.stdout is not None
        publisher.stdout.readline()
    for publisher in publishers:
        kill(publisher)
    dead = journals(root)
    assert len(dead) == 2
    faults = FaultyFS(monkeypatch, root)
    monkeypatch.setattr(journal_replay, "syncfs", fsio.syncfs)  # the faulty one
    faults.fail("syncfs", errno.EIO)
    faults.fail("rename", errno.EIO, times=1)
    with pytest.raises(StorageError):
        dirmq.Store(root)
    faults.clear()
    assert faults.raised["rename"] == 1
    with dirmq.Store(root) as store:  # a same-boot opener whose flush succeeds
        store.sweep_journals()
        assert len(journals(root)) == 2, "both kept"
    assert [j.verdict for j in judge_all(str(root))] == [Verdict.UNFLUSHED] * 2


# -- 2. the root's format never marked backwards ------------------------------------------------
def test_marking_an_earlier_root_5_never_writes_over_a_journal_writers_6(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that marks a root of format 4 as 5 (any open) read the marker before a
    publisher of another process marked it 6 for its journal, and wrote after: 5 over 6,
    with a journal in the root that a format-5 process would not replay after a crash."""
    with dirmq.Store(root, journal=False) as setup:
        setup.create_queue("q")
    marker = str(root / layout.ROOT_MARKER)
    (root / layout.ROOT_MARKER).write_text('{"format": 4, "access": "private"}\n')
    publishers = []

    def another_process_publishes() -> None:  # between this process's read and its write
        if not publishers:
            publisher = spawn("publish", root, "q", module="tests.support.journal_workers")
            publishers.append(publisher)
            assert publisher.stdout is not None and publisher.stdout.readline()
            assert root_format(root) == 6 and journals(root)

    def fd_target(fd: int) -> str:
        try:
            return os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return ""

    def by_name(real):  # type: ignore[no-untyped-def]
        def call(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
            if os.fspath(dst) == marker:
                another_process_publishes()
            return real(src, dst, *args, **kwargs)

        return call

    def by_descriptor(real):  # type: ignore[no-untyped-def]
        def call(fd, *args, **kwargs):  # type: ignore[no-untyped-def]
            if fd_target(fd) == marker:
                another_process_publishes()
            return real(fd, *args, **kwargs)

        return call

    for name in ("replace", "rename", "link"):
        monkeypatch.setattr(os, name, by_name(getattr(os, name)))
    for name in ("write", "pwrite", "writev"):
        monkeypatch.setattr(os, name, by_descriptor(getattr(os, name)))
    with dirmq.Store(root, journal=False):
        assert publishers, "this process wrote the marker"
        assert root_format(root) == 6, "marked backwards"
    kill(publishers[0])


@pytest.mark.parametrize("rewrite", ["dirmq init", "fsck"])
def test_a_marker_written_anew_never_leaves_5_over_a_journal_writers_6(
    root: Path, monkeypatch: pytest.MonkeyPatch, rewrite: str
) -> None:
    """`dirmq init` (a root's access set again) and fsck (a broken marker repaired) write the
    marker anew: they read the format to write (5: no journal yet), and another process
    writes its first journal, marking 6, before their rename. The root must end marked 6."""
    with dirmq.Store(root, journal=False) as setup:
        setup.create_queue("q")
    assert root_format(root) == 5
    if rewrite == "fsck":
        (root / layout.ROOT_MARKER).write_text("not a marker\n")
    marker = str(root / layout.ROOT_MARKER)
    publishers = []

    def by_name(real):  # type: ignore[no-untyped-def]
        def call(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
            if os.fspath(dst) == marker and not publishers:  # between the read and the rename
                publisher = spawn("publish", root, "q", module="tests.support.journal_workers")
                publishers.append(publisher)
                assert publisher.stdout is not None and publisher.stdout.readline()
                assert root_format(root) == 6 and journals(root)
            return real(src, dst, *args, **kwargs)

        return call

    for name in ("replace", "rename", "link"):
        monkeypatch.setattr(os, name, by_name(getattr(os, name)))
    try:
        if rewrite == "fsck":
            fsck(root, repair=True)
        else:
            init_root(root)
        assert publishers, "the marker was not written anew"
        assert root_format(root) == 6, "marked backwards"
    finally:
        for publisher in publishers:
            kill(publisher)


def test_an_earlier_roots_marker_is_marked_5_in_place_the_rest_as_it_was(root: Path) -> None:
    with dirmq.Store(root, journal=False):
        pass
    written = '{"access": "private",\n "format" :3, "note": "format: 4"}\n'
    (root / layout.ROOT_MARKER).write_text(written)
    with dirmq.Store(root, journal=False):
        pass
    assert (root / layout.ROOT_MARKER).read_text() == written.replace(":3", ":5")


# -- 3. a queue deleted and created again before a crash ----------------------------------------
def test_a_replay_never_brings_a_deleted_queues_messages_into_the_queue_made_after_it(
    root: Path,
) -> None:
    """The journal named a queue by name only: a machine crash within a second of deleting a
    queue and creating it again replayed the deleted one's messages into the new one."""
    with dirmq.Store(root) as setup:
        q = setup.create_queue("q")
    worker = spawn("publish_recreate", root, "q", module="tests.support.journal_workers")
    assert worker.stdout is not None
    old, new = worker.stdout.readline().split()
    kill(worker)
    [journal] = journals(root)
    path = root / layout.JOURNAL_DIR / journal
    names = [r.name for r in read_records(str(path))]
    assert names == [f"{layout.READY}/{old}", f"{layout.READY}/{new}"], "both in the journal"
    as_if_rebooted(path)
    os.unlink(os.path.join(q.path, layout.READY, new))  # lost to the crash
    with dirmq.Store(root) as store:
        assert journals(root) == []
        assert os.listdir(os.path.join(q.path, layout.READY)) == [new]
        assert store.queue("q").peek(new).body == b"new"


def test_a_record_of_a_publisher_without_statx_is_replayed_by_one_with_it(root: Path) -> None:
    """A publisher whose C library has no `statx` names a queue's inode alone (birth 0); a
    recovering process that reads the birth time took that record for another creation of the
    queue and skipped it: an acknowledged message lost to the crash never came back."""
    with dirmq.Store(root) as setup:
        q = setup.create_queue("q")
    if incarnation(q.path).endswith(".0"):
        pytest.skip("this filesystem keeps no birth time: both name the inode alone")
    worker = spawn("publish_without_statx", root, "q", module="tests.support.journal_workers")
    assert worker.stdout is not None
    message_id = worker.stdout.readline().strip()
    kill(worker)
    [journal] = journals(root)
    path = root / layout.JOURNAL_DIR / journal
    [record] = read_records(str(path))
    assert record.incarnation == f"{os.stat(q.path + '/' + layout.READY).st_ino}.0"
    as_if_rebooted(path)
    os.unlink(os.path.join(q.path, layout.READY, message_id))  # lost to the crash
    with dirmq.Store(root) as store:
        assert journals(root) == []
        assert store.queue("q").peek(message_id).body == b"no statx"


def test_a_recovery_whose_statx_is_refused_replays_by_the_inode(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container's seccomp filter may refuse `statx` (EPERM: Docker's default profile before
    18.04), which the C library does not emulate as it does ENOSYS: the recovering process
    knew no incarnation of the queue and skipped every journal 2 record of it."""
    with dirmq.Store(root) as setup:
        q = setup.create_queue("q")
    worker = spawn(
        "publish_without_statx", root, "q", "real", module="tests.support.journal_workers"
    )
    assert worker.stdout is not None
    message_id = worker.stdout.readline().strip()
    kill(worker)
    [journal] = journals(root)
    as_if_rebooted(root / layout.JOURNAL_DIR / journal)
    os.unlink(os.path.join(q.path, layout.READY, message_id))  # lost to the crash

    def refused(*_args: object) -> int:  # as a seccomp filter answers
        ctypes.set_errno(errno.EPERM)
        return -1

    monkeypatch.setattr(incarnation_module, "_statx", refused)
    with dirmq.Store(root) as store:
        assert journals(root) == []
        assert store.queue("q").peek(message_id).body == b"no statx"


def test_a_publish_its_queue_is_deleted_and_created_again_under_flushes_its_files_itself(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group's records name the creation of its queue known before they were appended; its
    files, named by path once they are flushed, land in the queue created again meanwhile,
    whose replay would skip them: the publisher flushes them itself before it answers."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    q.put(b"first")  # the journal's file, made
    other = dirmq.Store(root, journal=False)  # as another process would
    real_fdatasync, real_syncfs = os.fdatasync, journal_module.syncfs
    straddled, flushed = [], []

    def fdatasync(fd: int) -> None:  # the record is durable: "q" is made anew
        real_fdatasync(fd)
        if not straddled and os.readlink(f"/proc/self/fd/{fd}").startswith(str(root / "@journal")):
            straddled.append(fd)
            other.delete_queue("q")
            other.create_queue("q")

    def syncfs(fd: int) -> None:
        flushed.append(threading.current_thread())
        real_syncfs(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(journal_module, "syncfs", syncfs)
    message_id = q.put(b"straddles")
    assert straddled and threading.main_thread() in flushed, "flushed before it was answered"
    assert os.listdir(os.path.join(q.path, layout.READY)) == [message_id]
    [journal] = journals(root)
    [_, record] = read_records(str(root / layout.JOURNAL_DIR / journal))
    assert record.incarnation != incarnation(q.path), "named the creation it was appended for"
    other.close()
    store.close()


def test_a_publish_into_a_queue_created_again_since_is_recorded_as_the_new_one(
    root: Path,
) -> None:
    """A Store knows each queue's incarnation from its last publish: the first after the queue
    was made anew elsewhere flushes its files itself, and the next ones' records name the new
    queue (a replay restores them)."""
    store = dirmq.Store(root)
    q = store.create_queue("q")
    q.put(b"old")
    with dirmq.Store(root, journal=False) as other:
        other.delete_queue("q")
        other.create_queue("q")
    first = q.put(b"first after")
    then = q.put(b"then")
    journal = root / layout.JOURNAL_DIR / journals(root)[-1]
    [record] = [r for r in read_records(str(journal)) if r.name.endswith(then)]
    assert record.incarnation == incarnation(q.path)
    saved = journal.read_bytes()
    store.close()
    # A machine crash: the journal kept, as if rebooted, and the message lost.
    journal.write_bytes(saved)
    as_if_rebooted(journal)
    os.unlink(os.path.join(q.path, layout.READY, then))
    with dirmq.Store(root) as reopened:
        assert sorted(os.listdir(os.path.join(q.path, layout.READY))) == sorted([first, then])
        assert reopened.queue("q").peek(then).body == b"then"


# -- 4. a process that re-executes itself -------------------------------------------------------
def test_a_process_that_re_executes_itself_takes_new_journal_names_and_drops_its_old_images(
    root: Path,
) -> None:
    """Same pid, same start time: the new image took its old image's journal names (its first
    journal file collided: that publish took its own flush), and the old image's journal,
    under the name of a process that runs, was never removed while the new image lived (a
    machine crash would replay every message it covers, acknowledged or not)."""
    with dirmq.Store(root) as setup:
        q = setup.create_queue("q")
    worker = spawn("publish_then_exec", root, "q", module="tests.support.journal_workers")
    assert worker.stdout is not None
    before, *old_journals = worker.stdout.readline().split()
    after, *journals = worker.stdout.readline().split()
    assert len(old_journals) == 1
    assert old_journals[0] not in journals, "the old image's journal flushed and removed"
    [journal] = journals
    records = read_records(str(root / layout.JOURNAL_DIR / journal))
    assert [r.name for r in records] == [f"{layout.READY}/{after}"], "through the journal"
    kill(worker)
    assert sorted(os.listdir(os.path.join(q.path, layout.READY))) == sorted([before, after])
