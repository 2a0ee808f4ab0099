"""The commit journal's edges between processes (store/journal.py, journal_replay.py,
marker.py; docs/FORMAT.md, "The commit journal"): a journal kept unflushed whose rename failed,
the root's format never marked backwards, a queue deleted and created again before a crash,
and a process that re-executes itself."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import StorageError
from dirmq.store import fsio, journal_replay, layout
from dirmq.store.fsck import Kind, fsck
from dirmq.store.journal_format import boot_id
from dirmq.store.journal_replay import Verdict, judge_all

from .support.faultfs import FaultyFS
from .support.procs import kill, spawn

ANOTHER_BOOT = "00000000-0000-4000-8000-000000000000"  # a boot id this kernel never had


def _journals(root: Path) -> list[str]:
    directory = root / layout.JOURNAL_DIR
    return sorted(os.listdir(directory)) if directory.exists() else []


def _format(root: Path) -> int:
    return int(json.loads((root / layout.ROOT_MARKER).read_text())["format"])


def _as_if_rebooted(path: Path) -> None:
    """Make the journal at `path` one of an earlier boot (what a machine crash leaves)."""
    this_boot, earlier = f"boot={boot_id()}".encode(), f"boot={ANOTHER_BOOT}".encode()
    path.write_bytes(path.read_bytes().replace(this_boot, earlier, 1))


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
    [journal] = _journals(root)
    with dirmq.Store(root) as store:  # a same-boot opener, and its sweep
        store.sweep_journals()
        assert _journals(root) == [journal], "kept: neither removed nor replayed"
    assert [j.verdict for j in judge_all(str(root))] == [Verdict.UNFLUSHED]
    report = fsck(root, repair=True)
    assert [p.kind for p in report.problems] == [Kind.UNFLUSHED_JOURNAL]
    assert _journals(root) == [journal]
    # The reboot, and the disk lost the file: the journal brings it back.
    _as_if_rebooted(root / layout.JOURNAL_DIR / journal)
    os.unlink(os.path.join(q.path, layout.READY, message_id))
    with dirmq.Store(root) as store:
        assert _journals(root) == []
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
    dead = _journals(root)
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
        assert len(_journals(root)) == 2, "both kept"
    assert [j.verdict for j in judge_all(str(root))] == [Verdict.UNFLUSHED] * 2
