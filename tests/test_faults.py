"""Injected faults: a really full disk (a small tmpfs) and EIO from fsync.

A failed put raises a clear StorageError, leaves no partial file anywhere, and the queue keeps
working once the fault is gone.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.store import fsio, layout

from .disks import small_tmpfs


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


# -- prepare / publish_prepared: the server's two-stage publish --------------------------------
def test_prepared_messages_stay_invisible_until_published(store: dirmq.Store) -> None:
    q = store.create_queue("q")
    first = q.prepare([dirmq.OutgoingMessage(b"a"), dirmq.OutgoingMessage(b"b")])
    second = q.prepare([dirmq.OutgoingMessage(b"c")])
    assert q.stats().total == 0 and q.get_one() is None
    q.publish_prepared([first, second])
    assert [m.body for m in q.get(5)] == [b"a", b"b", b"c"]
    assert [m.id for m in q.browse()] == []  # leased, not lost
    assert _files(q, layout.TMP) == []
    dropped = q.prepare([dirmq.OutgoingMessage(b"never")])
    dropped.discard()
    dropped.discard()  # idempotent
    assert _files(q, layout.TMP) == [] and q.stats().total == 3


def test_prepare_refuses_what_needs_put_many(store: dirmq.Store) -> None:
    q = store.create_queue("q")
    with pytest.raises(dirmq.InvalidArgument, match="dedup"):
        q.prepare([dirmq.OutgoingMessage(b"a", dedup_id="once")])
    capped = store.create_queue("capped", dirmq.QueueConfig(capacity=10))
    with pytest.raises(dirmq.InvalidArgument, match="capacity"):
        capped.prepare([dirmq.OutgoingMessage(b"a")])
    memory = q.prepare([dirmq.OutgoingMessage(b"m")], "memory")
    durable = q.prepare([dirmq.OutgoingMessage(b"d")])
    with pytest.raises(dirmq.InvalidArgument, match="share a durability"):
        q.publish_prepared([memory, durable])
    q.publish_prepared([memory])
    q.publish_prepared([durable])
    assert q.stats().ready == 2


@pytest.mark.parametrize("broken", ["syncfs", "fsync"])
def test_eio_while_publishing_prepared_puts_leaves_none_of_them(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    """EIO on the data flush (syncfs, several files) or on a single file's / the directory's
    fsync: every prepared put of the commit fails, nothing of them is visible or left over."""
    q = store.create_queue("q")
    bodies = [b"a", b"b"] if broken == "syncfs" else [b"only"]
    puts = [q.prepare([dirmq.OutgoingMessage(body)]) for body in bodies]

    def eio(*_args: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    if broken == "syncfs":
        monkeypatch.setattr(fsio, "syncfs", eio)
    else:
        monkeypatch.setattr(fsio.os, "fsync", eio)
    with pytest.raises(dirmq.StorageError, match="Input/output error"):
        q.publish_prepared(puts)
    monkeypatch.undo()
    assert _files(q, layout.TMP) == [] and _files(q, layout.READY) == []
    q.publish_prepared([q.prepare([dirmq.OutgoingMessage(b"after")])])
    assert [m.body for m in q.get(5)] == [b"after"]


def test_disk_full_while_preparing_leaves_nothing(small_disk: Path) -> None:
    store = dirmq.Store(small_disk / "root")
    q = store.create_queue("q")
    body = os.urandom(100 * 1024)
    with pytest.raises(dirmq.DiskFull):
        q.prepare([dirmq.OutgoingMessage(body) for _ in range(50)])
    assert _files(q, layout.TMP) == [] and q.stats().total == 0
    q.publish_prepared([q.prepare([dirmq.OutgoingMessage(b"small")])])
    assert q.stats().ready == 1
