"""The backlog (store/backlog.py): a deep queue costs what a short one does to open, keeps FIFO,
and loses nothing at a kill, during a refill or during the migration of an earlier version's
flat @ready; fsck knows its layout; every count and listing sees what waits in it."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dirmq
from dirmq.store import (
    backlog,
    bucketdir,
    capacity,
    codec,
    delays,
    files,
    fsio,
    layout,
    publishing,
)
from dirmq.store.census import queue_depth
from dirmq.store.fsck import Kind, fsck
from dirmq.store.ids import new_ids

from .support.fixtures import http_client, serve
from .support.open_listing import listed_by_a_first_get
from .support.procs import REPO
from .support.waiting import wait_until

MEMORY = dirmq.QueueConfig(durability="memory")


def _python(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env
    )


def _fill(queue: dirmq.Queue, count: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, count, 1000):
        ids += queue.put_many([b"m%d" % i for i in range(start, min(count, start + 1000))])
    return ids


def _backlog_count(queue: dirmq.Queue) -> int:
    return sum(1 for _ in backlog.names(queue.path))


def _drain(queue: dirmq.Queue) -> list[str]:
    got: list[str] = []
    while batch := queue.get(100):
        got += [m.id for m in batch]
        assert queue.ack_many([m.receipt or "" for m in batch]) == {}
    return got


def test_an_open_lists_the_head_not_the_depth(store: dirmq.Store) -> None:
    """The O(head) property: what a fresh process lists to open a queue and take one message
    does not grow with the depth (here 2,000 against 30,000: the same head of @ready)."""
    shallow, deep = store.create_queue("shallow", MEMORY), store.create_queue("deep", MEMORY)
    _fill(shallow, 2_000)
    _fill(deep, 30_000)
    assert len(os.listdir(Path(deep.path) / layout.READY)) == backlog.SPILL_AT
    assert _backlog_count(deep) == 30_000 - backlog.SPILL_AT
    listed_shallow = sum(listed_by_a_first_get(store.root, "shallow").values())
    listed_deep = sum(listed_by_a_first_get(store.root, "deep").values())
    assert listed_shallow < 3 * backlog.SPILL_AT
    assert listed_deep <= listed_shallow + 50, (listed_shallow, listed_deep)


def test_fifo_through_the_backlog_and_counts_that_see_it(store: dirmq.Store) -> None:
    q = store.create_queue("fifo", MEMORY)
    ids = _fill(q, 3_500)
    assert q.stats().ready == 3_500
    assert queue_depth(store.root, "fifo").ready == 3_500
    browsed = [m.id for m in q.browse(limit=None)]
    assert browsed == ids  # @ready, then the backlog, in id order
    assert [m.id for m in q.browse(limit=10, after=ids[2_000])] == ids[2_001:2_011]
    assert all(m.state == "ready" for m in q.browse(limit=3, after=ids[3_000]))
    assert q.peek(ids[-1]).body == b"m3499"  # by id, in its bucket
    assert _drain(q) == ids
    assert not backlog.occupied(q.path)  # emptied (the last seconds' buckets may stay a while)
    assert fsck(store.root, repair=False).ok


def test_purge_and_delete_reach_the_backlog(store: dirmq.Store) -> None:
    q = store.create_queue("purged", MEMORY)
    ids = _fill(q, 1_500)
    assert q.delete(ids[-1])
    assert q.purge() == 1_499
    assert os.listdir(Path(q.path) / layout.BACKLOG) == []
    q.put(b"after")  # an empty backlog: straight into @ready again
    assert os.listdir(Path(q.path) / layout.READY) != []
    assert q.stats().ready == 1


def test_a_sweep_keeps_the_capacity_slots_of_messages_in_the_backlog(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot whose message is behind @ready is held, not leaked: a sweep once freed every such
    slot older than a minute (the index does not know the backlog), and the queue then took
    more messages than its capacity."""
    monkeypatch.setattr(capacity, "LEAK_GRACE_S", -1.0)  # every slot old enough to be freed
    q = store.create_queue("bounded", dirmq.QueueConfig(durability="memory", capacity=2_500))
    _fill(q, 2_500)
    assert _backlog_count(q) > 0
    assert q.sweep().slots_released == 0
    with pytest.raises(dirmq.QueueFull):
        q.put(b"one too many", timeout_s=0)
    assert len(os.listdir(Path(q.path) / layout.SLOTS)) == 2_500


def test_concurrent_consumers_take_each_message_once(store: dirmq.Store) -> None:
    """Four processes drain a deep queue at once, each refilling @ready from the backlog as it
    runs short: every message once."""
    q = store.create_queue("shared", MEMORY)
    ids = _fill(q, 6_000)
    drain = (
        "import sys, dirmq\n"
        "with dirmq.Store(sys.argv[1]) as s:\n"
        "    q = s.queue('shared')\n"
        "    while batch := q.get(50):\n"
        "        print(' '.join(m.id for m in batch), flush=True)\n"
        "        q.ack_many([m.receipt for m in batch])\n"
    )
    children = [_python("-c", drain, str(store.root)) for _ in range(4)]
    got: list[str] = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        assert child.returncode == 0
        got += out.split()
    assert sorted(got) == sorted(ids) and len(got) == len(set(got))


def test_a_waiting_get_finds_a_message_published_into_an_existing_bucket(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publish into a bucket that already exists makes no event a consumer watches (here the
    consumer's removal of the emptied bucket lost the race to that publish: made a no-op): a get
    waiting while the backlog has a bucket looks again (every BACKLOG_RECHECK_S). An empty
    bucket (a kill between its making and a publish) is removed by the next refill, and then
    publishes go straight to @ready."""
    q = store.create_queue("wake", MEMORY)
    message_id = new_ids(1)[0]
    bucket = Path(q.path) / backlog.relative_dir(message_id)
    bucket.mkdir(parents=True)
    monkeypatch.setattr(backlog, "_remove_empty", lambda path: None)
    got: list[dirmq.Message | None] = []
    waiter = threading.Thread(target=lambda: got.append(q.get_one(wait_s=20)))
    waiter.start()
    time.sleep(0.3)  # the waiter is asleep on an empty @ready, the bucket known
    fd = os.open(bucket / message_id, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, codec.encode(b"late", {}, message_id=message_id))
    os.close(fd)
    waiter.join(10)
    assert not waiter.is_alive() and got and got[0] is not None and got[0].id == message_id
    monkeypatch.undo()
    assert bucket.is_dir()  # a kill's leftover, say: empty
    assert q.get_one() is None  # refilled nothing
    assert not backlog.occupied(q.path)  # an empty bucket holds nothing back
    q.put(b"straight")
    assert len(os.listdir(Path(q.path) / layout.READY)) == 1


def _write_flat(queue_dir: Path, count: int) -> list[str]:
    """An earlier version's deep queue: every message in @ready."""
    ids = new_ids(count)
    for message_id in ids:  # with the private root's mode, as the store writes them
        fd = os.open(queue_dir / layout.READY / message_id, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, codec.encode(b"flat", {}, message_id=message_id))
        os.close(fd)
    return ids


def test_a_flat_ready_is_migrated_on_open_and_a_kill_midway_loses_nothing(
    store: dirmq.Store,
) -> None:
    q = store.create_queue("flat", MEMORY)
    ids = _write_flat(Path(q.path), 12_000)
    opener = (
        "import sys, time, dirmq\n"
        "with dirmq.Store(sys.argv[1]) as s:\n"
        "    s.queue('flat').stats()\n"
        "    time.sleep(60)\n"
    )
    child = _python("-c", opener, str(store.root))
    try:  # killed as soon as the migration has moved some (not all) messages
        wait_until(lambda: _backlog_count(q) > 0, timeout_s=60, interval_s=0.001)
    finally:
        child.kill()
        child.communicate(timeout=30)
    moved = _backlog_count(q)
    assert moved > 0
    ready = len(os.listdir(Path(q.path) / layout.READY))
    assert ready + moved == 12_000  # each message in one place, at every instant
    with dirmq.Store(store.root) as reopened:
        again = reopened.queue("flat")
        assert again.stats().ready == 12_000  # the open finished the migration
        assert len(os.listdir(Path(q.path) / layout.READY)) == backlog.SPILL_AT
        assert _drain(again) == ids
    assert fsck(store.root, repair=False).ok


def test_killed_consumers_refilling_lose_nothing(store: dirmq.Store) -> None:
    """Consumers SIGKILLed while they refill and drain: nothing acknowledged comes back,
    nothing else is lost, and fsck finds the queue sound."""
    q = store.create_queue("killed", dirmq.QueueConfig(visibility_timeout_s=0.2))
    ids = _fill(q, 8_000)
    drain = (  # says what it is about to ack, then that it did
        "import sys, dirmq\n"
        "with dirmq.Store(sys.argv[1]) as s:\n"
        "    q = s.queue('killed')\n"
        "    while batch := q.get(200):\n"
        "        print('acking', ' '.join(m.id for m in batch), flush=True)\n"
        "        failures = q.ack_many([m.receipt for m in batch])\n"
        "        assert not failures, failures\n"
        "        print('acked', flush=True)\n"
    )
    acked: list[str] = []
    maybe: list[str] = []  # announced, not confirmed: the kill came during their ack
    for round_ in range(4):
        child = _python("-c", drain, str(store.root))
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.startswith("acking")  # it drains: kill it mid-refill
        time.sleep(0.01 * round_)
        child.kill()
        out, _ = child.communicate(timeout=30)
        lines = [first.rstrip("\n"), *out.splitlines()]
        for i, line in enumerate(lines):
            if line.startswith("acking "):
                done = i + 1 < len(lines) and lines[i + 1] == "acked"
                (acked if done else maybe).extend(line.split()[1:])
    time.sleep(0.3)  # the killed consumers' leases expire
    rest = _drain(q)
    assert not set(rest) & set(acked), "an acknowledged message came back"
    lost = set(ids) - set(rest) - set(acked) - set(maybe)
    assert not lost, f"{len(lost)} messages lost"
    assert len(rest) == len(set(rest))
    report = fsck(store.root, repair=False)
    assert report.ok, report.problems


def test_fsck_checks_the_backlog(store: dirmq.Store) -> None:
    q = store.create_queue("checked", MEMORY)
    ids = _fill(q, 1_200)
    path = Path(q.path)
    [(bucket, name)] = [b for b in backlog.names(q.path) if b[1] == ids[-1]]
    (path / bucket / name).write_bytes(b"not a message")
    stray_bucket = path / layout.BACKLOG / "000001" / "0001"
    stray_bucket.mkdir(parents=True)
    misplaced = ids[-2]
    os.rename(path / backlog.relative_dir(misplaced) / misplaced, stray_bucket / misplaced)
    (path / layout.BACKLOG / "notes.txt").write_text("hello")
    report = fsck(store.root, repair=False)
    kinds = {(p.kind, os.path.basename(p.path)) for p in report.problems}
    assert (Kind.CORRUPT, ids[-1]) in kinds
    assert (Kind.MISNAMED, misplaced) in kinds
    assert (Kind.STRAY, "notes.txt") in kinds
    assert not report.ok
    repaired = fsck(store.root, repair=True)
    assert all(p.repaired for p in repaired.problems if p.kind != Kind.STRAY)
    assert (path / backlog.relative_dir(misplaced) / misplaced).exists()
    (path / layout.BACKLOG / "notes.txt").unlink()
    assert fsck(store.root, repair=False).problems == ()
    assert _drain(q) == ids[:-1]  # the corrupt one set aside, the misplaced one in its place


server = serve()
http = http_client()


def test_a_deep_queue_through_the_server(http: httpx.Client) -> None:
    """The native API over a deep queue: its count, and every message in order (published in
    batches, some single; received and acknowledged in batches: the backlog's refills happen
    under the server's gets either way, in a few requests rather than 4,500)."""
    count = 1_500
    assert http.put("/deep").status_code == 201
    sent: list[str] = []
    while len(sent) < count:  # one alone (behind the backlog too, from 1,000 on), 99 in a batch
        sent.append(http.post("/deep/messages", content=b"%d" % len(sent)).json()["id"])
        lines = b"".join(b'{"body": "%d"}\n' % n for n in range(len(sent), len(sent) + 99))
        published = http.post(
            "/deep/messages", content=lines, headers={"Content-Type": "application/x-ndjson"}
        )
        assert published.status_code == 201, published.text
        sent += published.json()["ids"]
    assert http.get("/deep").json()["stats"]["ready"] == count
    got: list[str] = []
    while len(got) < count:
        answer = http.get("/deep/messages", params={"max": "70"})
        assert answer.status_code == 200
        got += re.findall(r"X-Message-Id: (\S+)", answer.text, flags=re.IGNORECASE)
        receipts = re.findall(r"X-Receipt: (\S+)", answer.text, flags=re.IGNORECASE)
        settled = http.post("/deep/messages/ack", json={"receipts": receipts}).json()
        assert settled == {"settled": len(receipts), "failed": []}
    assert got == sent
    assert http.get("/deep").json()["stats"]["total"] == 0


def test_a_bucket_removed_under_a_publish_is_made_again(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refill that empties and removes the bucket a publisher has just made (between its
    mkdir and the rename): the rename makes it again, and the message is stored once."""
    q = store.create_queue("raced")
    _fill(q, backlog.SPILL_AT)
    real_name = fsio.PendingFile._name
    removed: list[str] = []

    def name_after_a_refill(pending: fsio.PendingFile) -> None:
        bucket = os.path.dirname(pending.final_path)
        if not removed and backlog.is_bucket_dir(os.path.relpath(bucket, q.path)):
            os.rmdir(bucket)  # what a refill's removal of an emptied bucket does
            removed.append(bucket)
        real_name(pending)

    monkeypatch.setattr(fsio.PendingFile, "_name", name_after_a_refill)
    message_id = q.put(b"raced")
    assert removed
    assert [name for _, name in backlog.names(q.path)] == [message_id]
    assert fsck(store.root, repair=False).ok


def test_a_trusted_bucket_removed_since_is_made_again(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A publisher trusts the bucket it made last (no mkdir per message). A refill that moved
    its messages out and removed it meanwhile: the next publish into that second's bucket finds
    it gone at its rename, makes it again, and is stored once."""
    q = store.create_queue("trusted")
    _fill(q, backlog.SPILL_AT)
    first = q.put(b"first")
    [(relative, name)] = list(backlog.names(q.path))
    bucket = os.path.join(q.path, relative)
    os.rename(os.path.join(bucket, name), os.path.join(q.path, layout.READY, name))  # a refill
    os.rmdir(bucket)
    later = f"{int(first[:16]) + 1:016d}{first[16:]}"  # the same second's next id
    monkeypatch.setattr(publishing, "new_ids", lambda count: [later])
    assert q.put(b"second") == later
    assert [name for _, name in backlog.names(q.path)] == [later]
    assert fsck(store.root, repair=False).ok


def test_a_publish_reads_the_oldest_bucket_only_up_to_its_first_message(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the backlog holds a message (asked by every batch published behind it) reads
    the oldest bucket's listing no further than its first name: in a deep queue that bucket
    holds a second's publishes."""
    q = store.create_queue("deep")
    _fill(q, backlog.SPILL_AT + 1)
    [(relative, _name)] = list(backlog.names(q.path))
    bucket = os.path.join(q.path, relative)
    for i in range(300):  # more of that second's messages (fsck would see them; no matter)
        with open(os.path.join(bucket, f"{i:016d}-000000000000"), "wb"):
            pass
    read: list[str] = []
    real_scandir = os.scandir

    class Counted:
        def __init__(self, path: str) -> None:
            self._it = real_scandir(path)

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self._it.close()

        def __iter__(self) -> Iterator[os.DirEntry[str]]:
            for entry in self._it:
                read.append(entry.name)
                yield entry

    monkeypatch.setattr(backlog.os, "scandir", Counted)
    assert backlog.occupied(q.path)
    assert len(read) == 1


def test_a_batch_behind_the_backlog_looks_at_the_last_message_it_spilled(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the message a publisher spilled last is still in its bucket the backlog holds a
    message: the next batch goes behind it without listing the backlog; once that message is
    gone (a refill), the backlog is looked at again."""
    q = store.create_queue("behind")
    _fill(q, backlog.SPILL_AT + 1)
    listed: list[str] = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(path: str) -> list[str]:
        listed.append(path)
        return real_listdir(path)

    def scandir(path: str) -> Iterator[os.DirEntry[str]]:
        listed.append(path)
        return real_scandir(path)

    monkeypatch.setattr(backlog.os, "listdir", listdir)
    monkeypatch.setattr(backlog.os, "scandir", scandir)
    ids = q.put_many([b"a", b"b"])
    assert listed == []
    spilled = {
        name[: layout.ID_LENGTH]: (relative, name) for relative, name in backlog.names(q.path)
    }
    assert set(ids) <= set(spilled)
    for relative, name in spilled.values():  # a refill takes them all
        os.rename(os.path.join(q.path, relative, name), os.path.join(q.path, layout.READY, name))
    listed.clear()
    q.put(b"c")
    assert listed, "the backlog was not looked at once the witness had gone"


def test_refills_taking_turns_move_each_name_once_oldest_first(store: dirmq.Store) -> None:
    """A process keeps the bucket it refills from as it listed it (`Backlog._move_from`):
    refills of two processes taking turns move every name once, oldest first, skipping what
    the other moved, and a name that came into the bucket after it was listed moves too."""
    q = store.create_queue("turns", MEMORY)
    _fill(q, 5_000)
    waiting = [name for _relative, name in backlog.names(q.path)]
    assert len(waiting) == 4_000
    ours, theirs = (backlog.Backlog(q.path, store.access) for _ in range(2))
    moved = ours.refill(300)
    # After our listing: a message into the bucket we refill from (the newest of its second).
    relative = backlog.relative_dir(moved[0])
    late = moved[0][:16] + "-ffffffffffff"
    Path(q.path, relative, late).write_bytes(Path(q.path, "@ready", moved[0]).read_bytes())
    turns = [ours, theirs, theirs, ours, ours, theirs]
    while refilled := turns[len(moved) % len(turns)].refill(250):
        assert refilled == sorted(refilled)
        moved += refilled
    assert sorted(moved) == sorted([*waiting, late]) and len(moved) == len(set(moved))
    moved.remove(late)  # found by the other's listing, or by ours once its names ran out
    assert moved == waiting
    assert _backlog_count(q) == 0


def test_a_bucket_another_process_made_is_flushed_into_its_parent_before_use(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A durable publish into a bucket (the backlog's second, a delay's minute) that another
    process made flushes the bucket's entry into its parent all the same: the maker may not
    have flushed it yet, and the message renamed into it must not lose its directory at a
    crash."""
    q = store.create_queue("made-by-another")
    flushed: list[str] = []
    real_fsync_dir = bucketdir.fsync_dir

    def fsync_dir(path: str) -> None:
        flushed.append(os.path.realpath(path))
        real_fsync_dir(path)

    monkeypatch.setattr(bucketdir, "fsync_dir", fsync_dir)
    name = new_ids(1)[0]
    theirs, ours = (backlog.Backlog(q.path, store.access) for _ in range(2))
    bucket = theirs.prepare(name, durable=False)  # made, not flushed (a memory queue's way)
    assert flushed == []
    assert ours.prepare(name, durable=True) == bucket
    assert flushed == [os.path.realpath(os.path.dirname(bucket))]
    flushed.clear()
    due_ms = int(time.time() * 1000) + 3_600_000
    their_delays, our_delays = (delays.DelayBuckets(q.path, store.access) for _ in range(2))
    minute = their_delays.prepare(due_ms, durable=False)
    assert our_delays.prepare(due_ms, durable=True) == minute
    assert flushed == [os.path.realpath(os.path.dirname(minute))]


def _drain_ready(queue: dirmq.Queue) -> list[str]:
    """Lease and ack the messages of @ready alone (a deep queue's head): their ids."""
    got: list[str] = []
    while len(got) < backlog.SPILL_AT:
        batch = queue.get(min(100, backlog.SPILL_AT - len(got)))
        got += [m.id for m in batch]
        assert queue.ack_many([m.receipt or "" for m in batch]) == {}
    assert os.listdir(Path(queue.path) / layout.READY) == []
    return got


def _renames(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every rename by path from now on (until `monkeypatch.undo()`), as (source directory,
    target directory), the last directory of each (a bucket's as `@backlog`)."""
    seen: list[tuple[str, str]] = []
    real = os.rename

    def where(path: Any) -> str:
        parts = os.fsdecode(path).split("/")
        return layout.BACKLOG if layout.BACKLOG in parts else parts[-2]

    def rename(src: Any, dst: Any, **kwargs: Any) -> None:
        real(src, dst, **kwargs)
        seen.append((where(src), where(dst)))

    monkeypatch.setattr(os, "rename", rename)
    return seen


def test_a_get_that_finds_ready_empty_leases_the_backlog_straight(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With @ready empty, a get leases the backlog's oldest from their buckets: one rename a
    message, none into @ready (a refill there and a claim from there cost two, and four
    events a message in every process watching). A message given back goes to @ready, older
    than the backlog, and is the next one; FIFO holds throughout."""
    q = store.create_queue("straight", MEMORY)
    ids = _fill(q, 2_500)
    assert _drain_ready(q) == ids[: backlog.SPILL_AT]
    renames = _renames(monkeypatch)
    batch = q.get(50)
    monkeypatch.undo()
    assert [m.id for m in batch] == ids[1_000:1_050]
    assert renames == [(layout.BACKLOG, layout.LEASED)] * 50
    assert os.listdir(Path(q.path) / layout.READY) == []
    assert q.stats().in_flight == 50
    assert q.nack(batch[10].receipt or "") == "returned"  # into @ready: older than the backlog
    assert q.ack_many([m.receipt or "" for m in batch if m is not batch[10]]) == {}
    again = q.get(3)
    assert [m.id for m in again] == [ids[1_010], ids[1_050], ids[1_051]]
    assert again[0].receive_count == 2 and again[1].receive_count == 1
    assert q.ack_many([m.receipt or "" for m in again]) == {}
    assert _drain(q) == ids[1_052:]
    assert fsck(store.root, repair=False).ok


def test_a_group_at_the_backlog_head_is_refilled_not_leased_straight(store: dirmq.Store) -> None:
    """A group's message is not leased from its bucket: @ready is refilled and the group's
    turn decided there (one message of a group in flight at a time)."""
    q = store.create_queue("grouped", MEMORY)
    ids = _fill(q, backlog.SPILL_AT)
    grouped = q.put_many([dirmq.OutgoingMessage(b"g", group="g") for _ in range(2)])
    plain = q.put_many([b"p%d" % i for i in range(3)])
    assert _backlog_count(q) == 5
    assert _drain_ready(q) == ids
    batch = q.get(10)
    assert [m.id for m in batch] == [grouped[0], *plain]  # the group's second waits its turn
    assert sorted(os.listdir(Path(q.path) / layout.READY))[0].startswith(grouped[1])
    assert q.ack_many([m.receipt or "" for m in batch]) == {}
    assert _drain(q) == [grouped[1]]


def test_a_backlog_message_that_cannot_be_read_is_handed_back_to_ready(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A get that leased from the backlog and could not read the file gives it back to
    @ready, in its FIFO place (older than the backlog: the next one), not left leased."""
    q = store.create_queue("unreadable", MEMORY)
    ids = _fill(q, backlog.SPILL_AT + 10)
    _drain_ready(q)

    def read_fails(path: str, message_id: str, body_file_over: int | None = None) -> Any:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(files, "read_message", read_fails)
    with pytest.raises(dirmq.StorageError):
        q.get(5)
    monkeypatch.undo()
    assert os.listdir(Path(q.path) / layout.LEASED) == []
    assert sorted(os.listdir(Path(q.path) / layout.READY)) == ids[1_000:1_005]
    assert _drain(q) == ids[1_000:]


def test_refills_of_another_process_beside_straight_leases(store: dirmq.Store) -> None:
    """A process that refills @ready (an earlier version, or a get of another kind) beside
    gets that lease from the backlog straight: every message once, in order (what a refill
    brought to @ready is older than what stays in the backlog, and a get takes @ready first)."""
    q = store.create_queue("mixed", MEMORY)
    ids = _fill(q, 6_000)
    theirs = backlog.Backlog(q.path, store.access)
    got = _drain_ready(q)
    while True:
        theirs.refill(120)
        batch = q.get(50)
        if not batch:
            break
        got += [m.id for m in batch]
        assert q.ack_many([m.receipt or "" for m in batch]) == {}
    assert got == ids


def test_a_message_past_its_ttl_leased_from_the_backlog_is_never_delivered(
    store: dirmq.Store,
) -> None:
    """A get leasing from the backlog checks each message's time to live as a claim from
    @ready does: one past it is dead-lettered (`ttl-expired`), never delivered."""
    store.create_queue("ttl-dlq")
    q = store.create_queue(
        "ttl", dirmq.QueueConfig(durability="memory", dead_letter_queue="ttl-dlq")
    )
    ids = _fill(q, backlog.SPILL_AT)
    late = q.put(b"late", ttl_s=0.2)
    kept = q.put(b"kept")
    assert _backlog_count(q) == 2
    assert _drain_ready(q) == ids
    wait_until(lambda: time.time() > int(late[:16]) / 1e6 + 0.25, what="the TTL to run out")
    assert [m.id for m in q.get(10)] == [kept]
    (dead,) = store.queue("ttl-dlq").get(10)
    assert dead.body == b"late" and dead.dead is not None and dead.dead.reason == "ttl-expired"
