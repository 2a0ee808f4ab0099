"""Injected faults: a really full disk (a small tmpfs) and EIO from fsync.

A failed put raises a clear StorageError, leaves no partial file anywhere, and the queue keeps
working once the fault is gone. The flush faults are of the group commit (the commit journal
off); the journal's own are in tests/test_journal.py.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.store import fsio, layout

from .support.disks import small_tmpfs


@pytest.fixture
def store(root: Path) -> Iterator[dirmq.Store]:
    with dirmq.Store(root, journal=False) as s:
        yield s


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path, "1m") as mount_point:
        yield mount_point


class _Everything:
    def __contains__(self, _item: object) -> bool:
        return True

    def add(self, _item: object) -> None:
        pass


@pytest.fixture(autouse=True, params=["O_TMPFILE", "named temp files"])
def temp_file_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run every fault test both with unnamed O_TMPFILE inodes and with named @tmp files
    (the fallback for filesystems without O_TMPFILE, e.g. NFS)."""
    if request.param == "named temp files":
        monkeypatch.setattr(fsio, "_tmpfile_unsupported", _Everything())
    return str(request.param)


def _files(queue: dirmq.Queue, directory: str) -> list[str]:
    return os.listdir(os.path.join(queue.path, directory))


@pytest.mark.parametrize("durability", ["writethrough", "writeback", "memory"])
def test_disk_full_fails_cleanly_and_recovers(small_disk: Path, durability: str) -> None:
    store = dirmq.Store(small_disk / "root")
    q = store.create_queue("q", dirmq.QueueConfig(durability=dirmq.Durability(durability)))
    body = os.urandom(100 * 1024)
    stored = []
    with pytest.raises(dirmq.DiskFull, match="disk full"):
        for _ in range(50):
            stored.append(q.put(body))
    assert 3 <= len(stored) < 50
    assert _files(q, layout.TMP) == [], "a partial temp file was left behind"
    assert sorted(_files(q, layout.READY)) == sorted(stored), "only complete messages visible"
    with pytest.raises(dirmq.DiskFull):
        q.put_many([body, body])
    assert _files(q, layout.TMP) == []
    for _ in range(3):  # free some space by consuming
        message = q.get_one()
        assert message is not None and message.body == body
        q.ack(message.receipt or "")
    q.put(body)
    q.put_many([b"small", b"batch"])
    assert q.stats().total == len(stored) - 3 + 3


def test_eio_on_fsync_fails_the_put_and_leaves_nothing(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")
    q.put(b"before")

    def broken_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    real_fsync = os.fsync
    monkeypatch.setattr(fsio.os, "fsync", broken_fsync)
    with pytest.raises(dirmq.StorageError, match="Input/output error") as caught:
        q.put(b"lost")
    assert caught.value.errno == errno.EIO
    monkeypatch.setattr(fsio.os, "fsync", real_fsync)
    assert _files(q, layout.TMP) == []
    assert len(_files(q, layout.READY)) == 1
    q.put(b"after")
    assert [m.body for m in q.get(5)] == [b"before", b"after"]


def test_eio_on_group_flush_fails_every_member(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")

    def broken_syncfs(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    real_syncfs = fsio.syncfs
    monkeypatch.setattr(fsio, "syncfs", broken_syncfs)
    with pytest.raises(dirmq.StorageError):
        q.put_many([b"a", b"b", b"c"])
    monkeypatch.setattr(fsio, "syncfs", real_syncfs)
    assert _files(q, layout.TMP) == [] and _files(q, layout.READY) == []
    q.put_many([b"a", b"b"])
    assert q.stats().ready == 2


def test_write_error_mid_file_removes_the_partial_file(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")
    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, data: bytes | memoryview) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, bytes(data)[:1000])  # short writes force a second call

    monkeypatch.setattr(fsio.os, "write", failing_write)
    with pytest.raises(dirmq.DiskFull):
        q.put(b"x" * 5000)
    monkeypatch.setattr(fsio.os, "write", real_write)
    assert _files(q, layout.TMP) == [] and _files(q, layout.READY) == []
