"""A message file names its own message (`Dirmq-Id`): content that belongs to another message,
as a crash can leave in a recycled file, is corrupt and is never delivered (docs/FORMAT.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dirmq
from dirmq.store import codec, layout, ownpool
from dirmq.store.fsck import Kind, fsck
from dirmq.store.ids import new_id

ids = st.builds(new_id)


@given(st.binary(max_size=1024), st.booleans(), ids)
def test_codec_writes_and_checks_the_id(body: bytes, with_headers: bool, message_id: str) -> None:
    headers = {"Content-Type": "text/plain"} if with_headers else {}
    encoded = codec.encode(body, headers, message_id=message_id)
    assert f"\nDirmq-Id: {message_id}\n".encode() in encoded.partition(b"\n\n")[0] + b"\n"
    decoded = codec.decode(encoded, message_id)
    assert (decoded.body, decoded.headers) == (body, headers)
    assert decoded.system == {codec.ID: message_id}
    assert codec.decode(encoded).body == body  # a reader that knows no name checks nothing
    with pytest.raises(dirmq.CorruptMessage, match="not " + new_id()[:5]):
        codec.decode(encoded, new_id())


@given(st.binary(max_size=1024), ids)
def test_files_without_an_id_are_not_checked(body: bytes, message_id: str) -> None:
    assert codec.decode(codec.encode(body, {}), message_id).body == body


def memory_queue(store: dirmq.Store, name: str = "q", **config: Any) -> dirmq.Queue:
    """Memory durability: puts rename first, flush never (the case Dirmq-Id protects)."""
    return store.create_queue(name, dirmq.QueueConfig(durability=dirmq.Durability.MEMORY, **config))


def file_of(q: dirmq.Queue, directory: str, name: str) -> Path:
    return Path(q.path, directory, name)


def corrupt_ids(q: dirmq.Queue) -> list[str]:
    entries = [layout.parse_entry(n) for n in os.listdir(Path(q.path, layout.CORRUPT))]
    return sorted(e.message_id for e in entries if e is not None)


def acked_file_bytes(q: dirmq.Queue) -> tuple[str, bytes]:
    """Publish, receive and acknowledge one message; its id and the bytes its file held."""
    old_id = q.put(b"already acknowledged", {"X-Colour": "blue"})
    [got] = q.get(1)
    assert got.receipt is not None and got.lease_deadline_s is not None
    # Its lease name (it also names this process as the holder: FORMAT.md "Lease holders").
    [lease] = [n for n in os.listdir(Path(q.path, layout.LEASED)) if n.startswith(old_id)]
    data = file_of(q, layout.LEASED, lease).read_bytes()
    q.ack(got.receipt)
    assert ownpool.wait_reaped(5)
    assert q._files.pool.own_files() == 1  # retired into this process's pool, to be recycled
    return old_id, data


def test_puts_record_their_id_also_in_recycled_files(store: dirmq.Store) -> None:
    q = memory_queue(store, capacity=10)
    old_id, _data = acked_file_bytes(q)
    new = q.put(b"new")
    assert q._files.pool.own_files() == 0  # the put overwrote the acked message's file
    text = file_of(q, layout.READY, new).read_bytes()
    assert f"\nDirmq-Id: {new}\n".encode() in text
    assert old_id.encode() not in text
    assert b"\nDirmq-Slot: " in text  # with the other system headers


def test_a_recycled_file_holding_an_acked_message_is_never_delivered(store: dirmq.Store) -> None:
    q = memory_queue(store)
    _old_id, old_bytes = acked_file_bytes(q)
    new = q.put(b"the new message")
    # The crash of FORMAT.md "Durability": the rename into @ready survived, the overwrite did not.
    file_of(q, layout.READY, new).write_bytes(old_bytes)
    assert codec.decode(old_bytes).body == b"already acknowledged"  # intact, checksum and all
    with pytest.raises(dirmq.CorruptMessage):  # a read by id says so (issue 15, defect 2)
        q.peek(new)
    assert list(q.browse()) == []
    assert q.get(1) == []
    assert corrupt_ids(q) == [new]  # quarantined by the get (under its lease name)
    assert q.stats().total == 0


def test_a_rename_undone_by_a_crash_is_not_delivered(store: dirmq.Store) -> None:
    """ext4 without a journal: the acked message's name comes back, holding the new content."""
    q = memory_queue(store)
    old_id, _data = acked_file_bytes(q)
    new = q.put(b"the new message")
    os.link(file_of(q, layout.READY, new), file_of(q, layout.READY, layout.ready_name(old_id, 1)))
    q.sweep()  # rescans: the index learns of the resurrected name
    got = q.get(5)
    assert [(m.id, m.body) for m in got] == [(new, b"the new message")]
    assert corrupt_ids(q) == [old_id]


@pytest.mark.usefixtures("private_umask")  # files it plants get the root's modes
def test_files_of_the_older_format_still_deliver(store: dirmq.Store) -> None:
    q = memory_queue(store)
    message_id = new_id()
    data = codec.encode(b"written before Dirmq-Id", {"X-Colour": "red"}, {"Group": "g"})
    assert b"\nDirmq-Id:" not in data
    file_of(q, layout.READY, message_id).write_bytes(data)
    q.sweep()
    assert q.peek(message_id).body == b"written before Dirmq-Id"
    [got] = q.get(1)
    assert (got.id, got.body, got.headers) == (
        message_id,
        b"written before Dirmq-Id",
        {"X-Colour": "red"},
    )
    assert fsck(store.root, repair=False).ok


def test_fsck_reports_and_quarantines_a_file_of_another_message(store: dirmq.Store) -> None:
    q = memory_queue(store)
    _old_id, old_bytes = acked_file_bytes(q)
    new = q.put(b"new")
    kept = q.put(b"kept")
    path = file_of(q, layout.READY, new)
    path.write_bytes(old_bytes)
    report = fsck(store.root, repair=False)
    [problem] = report.problems
    assert (problem.kind, problem.path) == (Kind.CORRUPT, str(path))
    assert "holds message" in problem.detail
    repaired = fsck(store.root, repair=True)
    assert repaired.ok and [p.repaired for p in repaired.problems] == [True]
    assert os.listdir(Path(q.path, layout.CORRUPT)) == [new]
    assert fsck(store.root, repair=False).problems == ()
    assert q.peek(kept).body == b"kept"


@pytest.mark.usefixtures("private_umask")  # files it plants get the root's modes
def test_a_mismatched_copy_never_wins_a_duplicate(store: dirmq.Store) -> None:
    q = memory_queue(store)
    _old_id, old_bytes = acked_file_bytes(q)
    message_id = q.put(b"good copy")
    # A leased copy would be kept first; holding another message, it must not compete.
    file_of(q, layout.LEASED, layout.timed_name(message_id, 1, 1)).write_bytes(old_bytes)
    repaired = fsck(store.root, repair=True)
    assert repaired.ok
    assert {p.kind for p in repaired.problems} == {Kind.CORRUPT}
    assert q.peek(message_id).body == b"good copy"


def test_spark_snapshot_skips_a_file_of_another_message(store: dirmq.Store) -> None:
    pytest.importorskip("pyspark")
    from dirmq.spark.options import parse_options
    from dirmq.spark.snapshot import DirmqSnapshotReader

    q = memory_queue(store)
    _old_id, old_bytes = acked_file_bytes(q)
    new = q.put(b"new")
    kept = q.put(b"kept")
    file_of(q, layout.READY, new).write_bytes(old_bytes)
    reader = DirmqSnapshotReader(parse_options({"path": str(store.root), "queue": "q"}))
    rows = [
        row
        for partition in reader.partitions()
        for batch in reader.read(partition)
        for row in batch.to_pylist()
    ]
    assert [(r["id"], r["body"]) for r in rows] == [(kept, b"kept")]


@pytest.mark.usefixtures("private_umask")  # files it plants get the root's modes
def test_fsck_knows_the_upper_layers_directories_at_the_root(store: dirmq.Store) -> None:
    memory_queue(store)
    for reserved in ("@pubsub", "@spark"):
        os.makedirs(Path(store.root, reserved, "anything"))
    Path(store.root, "@other").mkdir()
    report = fsck(store.root, repair=False)
    assert [(p.kind, os.path.basename(p.path)) for p in report.problems] == [(Kind.STRAY, "@other")]
    os.rmdir(Path(store.root, "@spark", "anything"))
    os.rmdir(Path(store.root, "@spark"))
    Path(store.root, "@spark").write_bytes(b"not a directory")
    strays = [p for p in fsck(store.root, repair=True).problems if p.kind is Kind.STRAY]
    assert sorted((os.path.basename(p.path), p.detail) for p in strays) == [
        ("@other", "unknown entry (names starting '@' are reserved)"),
        ("@spark", "expected a directory"),
    ]
