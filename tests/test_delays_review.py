"""Delays in their due minute's buckets (store/delays.py), the cases a review found not yet
covered by tests/test_delays.py: a waiting get woken when a bucket's minute begins with no event,
priorities through a bucket, a delayed message's time to live, a delayed nack at max receives,
delete and purge of delays in buckets never loaded, capacity slots of such delays kept by a
sweep, and fsck's repair of a bucket whose name is not a minute."""

from __future__ import annotations

import asyncio
import errno
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import dirmq
from dirmq.server.broker import Broker
from dirmq.store import backlog, codec, delays, layout
from dirmq.store.fsck import Kind, fsck
from dirmq.store.ids import new_ids

from .support.faultfs import FaultyFS
from .support.procs import kill, spawn
from .support.store_now import store_now
from .support.waiting import wait_until

MEMORY = dirmq.QueueConfig(durability="memory")


class _RunningClock:
    """The store's clock running at the real pace from an offset the test sets."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


@contextmanager
def store_clock() -> Iterator[_RunningClock]:
    """`clock.now_ms`, imported by name where it is read, replaced by a running clock."""
    clock = _RunningClock()
    with store_now(clock.now_ms):
        yield clock


def _delayed_names(queue_dir: str) -> list[str]:
    return [name for _bucket, name in delays.names(queue_dir)]


def test_a_waiting_get_is_woken_when_a_bucket_minute_begins_without_any_event(
    root: Path,
) -> None:
    """A bucket of the next minute, made before the consumer opened the queue, is not loaded
    (its minute has not begun): nothing will tell the waiting get of it, so the get's timer
    must end at the bucket's start, load it, and wait on for the message's own due time."""
    with store_clock() as clock:
        now = clock.now_ms()
        next_minute = (now // 60_000 + 1) * 60_000
        clock.offset_ms = next_minute - 400 - now  # 0.4 s before a minute begins
        with dirmq.Store(root) as theirs:
            q = theirs.create_queue("q", MEMORY)
            due = next_minute + 200
            message_id = q.put(
                b"due just into the next minute", delay_s=(due - clock.now_ms()) / 1000
            )
            assert list(delays.top(q.path)[0]) == [delays.minute_of(due)]
        with dirmq.Store(root) as mine:
            mine_q = mine.queue("q")
            assert mine_q.get_one() is None  # opened: the bucket known, not loaded
            got = mine_q.get_one(wait_s=20)
            assert got is not None and got.id == message_id
            assert clock.now_ms() >= due


def test_the_server_long_poll_is_woken_when_a_bucket_minute_begins_without_any_event(
    root: Path,
) -> None:
    """The server's long poll (broker.py's waiter line and its timer), as the library's get
    above: a bucket of the next minute, made before the server's first look, is due no
    earlier than its start; the timer ends there, then at the message's own due time."""
    with store_clock() as clock:
        now = clock.now_ms()
        next_minute = (now // 60_000 + 1) * 60_000
        clock.offset_ms = next_minute - 400 - now
        due = next_minute + 200
        with dirmq.Store(root) as theirs:
            q = theirs.create_queue("q", MEMORY)
            message_id = q.put(b"due", delay_s=(due - clock.now_ms()) / 1000)
        with dirmq.Store(root) as store:
            queue = store.queue("q")

            async def main() -> list[dirmq.Message]:
                broker = Broker(store)
                try:
                    return await broker.receive(queue, 1, 30, 20)
                finally:
                    broker.close()

            got = asyncio.run(main())
            assert [m.id for m in got] == [message_id]
            assert clock.now_ms() >= due


def test_delays_keep_their_priority_through_their_bucket(root: Path) -> None:
    """Delayed messages of several levels, due together, are delivered highest level first
    by a process that never loaded their bucket before it was past."""
    with store_clock() as clock, dirmq.Store(root) as store:
        q = store.create_queue("q", dirmq.QueueConfig(durability="memory", priority_levels=3))
        low = q.put(b"low", delay_s=90, priority=0)
        high = q.put(b"high", delay_s=90, priority=2)
        mid = q.put(b"mid", delay_s=90, priority=1)
        assert all("^" in n for n in _delayed_names(q.path) if not n.startswith(low))
        clock.offset_ms += 200_000  # the bucket's minute is over
        with dirmq.Store(root) as other:
            got = [m.id for m in other.queue("q").get(10)]
        assert got == [high, mid, low]


def test_a_delayed_message_past_its_time_to_live_is_never_delivered(root: Path) -> None:
    with store_clock() as clock, dirmq.Store(root) as store:
        q = store.create_queue("q", dirmq.QueueConfig(durability="memory"))
        late = q.put(b"too late", delay_s=120, ttl_s=60)
        kept = q.put(b"in time", delay_s=120, ttl_s=600)
        clock.offset_ms += 200_000
        assert [m.id for m in q.get(10)] == [kept]
        assert [m.id for m in q.browse(None, state="dead")] == [late]
        assert _delayed_names(q.path) == []


def test_a_delayed_nack_at_max_receives_is_dead_lettered_not_delayed(store: dirmq.Store) -> None:
    q = store.create_queue("q", dirmq.QueueConfig(durability="memory", max_receives=1))
    message_id = q.put(b"once")
    got = q.get_one()
    assert got is not None and got.receipt is not None
    assert q.nack(got.receipt, delay_s=600) == "dead-lettered"
    assert _delayed_names(q.path) == []
    assert [m.id for m in q.browse(None, state="dead")] == [message_id]


def test_delete_and_purge_reach_delays_in_buckets_never_loaded(root: Path) -> None:
    with dirmq.Store(root) as writer:
        q = writer.create_queue("q")
        ids = [q.put(b"later", delay_s=600 * (i + 1)) for i in range(3)]
        assert len(delays.top(q.path)[0]) == 3
    with dirmq.Store(root) as other:
        q = other.queue("q")
        assert q.get_one() is None  # the index opened: no bucket loaded
        assert q.peek(ids[1]).state == "delayed"
        assert q.delete(ids[1]) and not q.delete(ids[1])
        assert sorted(n[: layout.ID_LENGTH] for n in _delayed_names(q.path)) == sorted(
            [ids[0], ids[2]]
        )
        assert q.purge() == 2
        assert os.listdir(Path(q.path) / layout.DELAYED) == []
        assert q.stats().delayed == 0


def test_a_sweep_keeps_the_capacity_slots_of_delays_in_buckets_not_loaded(root: Path) -> None:
    """Slots over a minute old whose messages wait in buckets of minutes to come are held,
    not leaked: a sweep by a process that never listed those buckets frees none, nor does
    `dirmq fsck --repair`; a delete of one of those delays frees its slot."""
    with dirmq.Store(root) as writer:
        q = writer.create_queue("q", dirmq.QueueConfig(capacity=2))
        first = q.put(b"a", delay_s=3_600)
        q.put(b"b", delay_s=7_200)
    slots = Path(q.path) / layout.SLOTS
    old = time.time() - 600
    for slot in os.listdir(slots):
        os.utime(slots / slot, (old, old), follow_symlinks=False)
    with dirmq.Store(root) as other:
        q = other.queue("q")
        q.sweep()
        assert len(os.listdir(slots)) == 2
        with pytest.raises(dirmq.QueueFull):
            q.put(b"over capacity", timeout_s=0)
        report = fsck(root, repair=True)  # fsck's leaked-slot check sees the buckets too
        assert report.problems == () and len(os.listdir(slots)) == 2
        assert q.delete(first)  # its slot freed with it
        assert len(os.listdir(slots)) == 1
        q.put(b"in its place", timeout_s=0)


@pytest.mark.parametrize("bucket", ["0{minute}", "{minute}x", "x"])
def test_fsck_repair_moves_delays_out_of_a_bucket_whose_name_is_not_a_minute(
    root: Path, bucket: str
) -> None:
    """A directory of @delayed whose name no process reads as a minute hides its messages
    from every process: a repair moves each home and removes the directory."""
    with dirmq.Store(root) as store:
        q = store.create_queue("q", MEMORY)
    [message_id] = new_ids(1)
    due = time.time_ns() // 1_000_000 - 1_000
    name = layout.timed_name(message_id, 0, due)
    odd = Path(q.path) / layout.DELAYED / bucket.format(minute=delays.minute_of(due))
    odd.mkdir()
    (odd / name).write_bytes(codec.encode(b"hidden", {}, message_id=message_id))
    report = fsck(root, repair=False)
    assert any(p.path.startswith(str(odd)) for p in report.problems), report.problems
    fsck(root, repair=True)
    assert not odd.exists()
    assert _delayed_names(q.path) == [name]
    with dirmq.Store(root) as store:
        got = store.queue("q").get_one(wait_s=10)
        assert got is not None and got.id == message_id
    assert fsck(root, repair=False).problems == ()


@pytest.mark.parametrize("shared", [False, True])
def test_a_writer_whose_trusted_bucket_went_publishes_into_it_again(
    root: Path, shared: bool
) -> None:
    """A publisher trusts the bucket it made last; another host's consumer (its clock a little
    ahead) removed it as past. In the shared-filesystem mode the new file is written beside
    its final name, in that bucket: its creation, not only its rename, finds the bucket gone,
    and the publish must make it again rather than fail."""
    with dirmq.Store(root, shared=shared) as store:
        q = store.create_queue("q", MEMORY)
        first = q.put(b"makes the bucket", delay_s=600)
        [(bucket, name)] = list(delays.names(q.path))
        aside = Path(q.path) / name
        os.rename(Path(q.path) / bucket / name, aside)  # emptied and removed by a consumer
        os.rmdir(Path(q.path) / bucket)
        second = q.put(b"the same minute", delay_s=600.001)
        assert [n[: layout.ID_LENGTH] for n in _delayed_names(q.path)] == [second]
        os.rename(aside, Path(q.path) / bucket / name)
        assert {m.id for m in q.browse(None, state="delayed")} == {first, second}


def test_a_delay_left_in_a_past_bucket_of_an_earlier_minute_is_delivered_once_due(
    root: Path,
) -> None:
    """A delay in the bucket of a minute before its own (misnamed: put there by hand, or by a
    restore) keeps that bucket from being removed once its minute is over; it is still
    delivered when its own time comes, by a process that has not rescanned meanwhile (a
    server never does on its own under inotify), not only after `dirmq fsck --repair`."""
    with store_clock() as clock, dirmq.Store(root) as store:
        now = clock.now_ms()
        clock.offset_ms = (now // 60_000 + 1) * 60_000 + 1_000 - now  # a second into a minute
        q = store.create_queue("q", MEMORY)
        first = q.put(b"first", delay_s=30)
        [(bucket, name)] = list(delays.names(q.path))
        [late_id] = new_ids(1)
        late_due = (delays.due_of(name) or 0) + 90_000  # a minute or two later than its bucket
        late = layout.timed_name(late_id, 0, late_due)
        (Path(q.path) / bucket / late).write_bytes(codec.encode(b"late", {}, message_id=late_id))
        clock.offset_ms += 61_000  # the bucket's minute is over
        got = q.get(10)
        assert [m.id for m in got] == [first]
        q.ack(got[0].receipt or "")
        assert q.get_one() is None  # the misnamed one is not due yet
        clock.offset_ms += 90_000
        assert [m.id for m in q.get(10)] == [late_id]


@pytest.mark.parametrize("heard_between", [True, False])
def test_a_loaded_bucket_removed_and_made_again_is_watched_again(
    root: Path, heard_between: bool
) -> None:
    """The bucket of this minute, loaded here, is removed by another process (a consumer whose
    clock runs ahead took its minute for over) and made again by a writer: this process loads
    the new directory, watched, and hears of the writer's delay into it when it is due, not
    when the minute is over."""
    with store_clock() as clock, dirmq.Store(root) as mine, dirmq.Store(root) as theirs:
        now = clock.now_ms()
        clock.offset_ms = (now // 60_000 + 1) * 60_000 + 1_000 - now  # a second into a minute
        q = mine.create_queue("q", MEMORY)
        q.put(b"loads the bucket", delay_s=0.05)
        got = q.get_one(wait_s=10)
        assert got is not None
        q.ack(got.receipt or "")
        [minute] = delays.top(q.path)[0]
        assert minute == delays.minute_of(clock.now_ms())
        os.rmdir(Path(q.path) / delays.bucket_dir(minute))
        if heard_between:  # else the removal and the making are heard in one drain
            assert q.get_one() is None
        other = theirs.queue("q").put(b"into the bucket made again", delay_s=0.2)
        assert delays.top(q.path)[0] == [minute]
        end = (minute + 1) * 60_000
        got = q.get_one(wait_s=(end - clock.now_ms()) / 1000 - 5)
        assert got is not None and got.id == other, "not heard of before the minute's end"


@pytest.mark.parametrize("loaded", [True, False])
def test_grouped_delays_are_delivered_in_order_one_at_a_time(root: Path, loaded: bool) -> None:
    """Delays of one group (`~<tag>` in their names) in one bucket: delivered in id order, one
    in flight at a time, whether the bucket was loaded (its minute begun here) or only found
    past by a process that opened the queue after its minute."""
    with store_clock() as clock, dirmq.Store(root) as store, dirmq.Store(root) as later:
        now = clock.now_ms()
        clock.offset_ms = (now // 60_000 + 1) * 60_000 + 1_000 - now
        q = store.create_queue("q", MEMORY)
        ids = q.put_many(
            [dirmq.OutgoingMessage(b"%d" % i, group="g", delay_s=30) for i in range(3)]
        )
        assert all("~" in name for name in _delayed_names(q.path))
        if loaded:
            assert q.get_one() is None  # the bucket's minute has begun: loaded
            clock.offset_ms += 30_000
        else:
            clock.offset_ms += 90_000
            q = later.queue("q")  # opened now, its minute over
        got_ids = []
        for _ in ids:
            got = q.get(10)
            assert len(got) == 1, got
            got_ids.append(got[0].id)
            q.ack(got[0].receipt or "")
        assert got_ids == ids and q.get_one() is None


def test_a_consumer_killed_while_emptying_a_past_bucket_loses_nothing(root: Path) -> None:
    """SIGKILL a process moving a past bucket of 10,000 due delays into @ready: each message
    is still there exactly once, in the bucket or in @ready, fsck finds nothing, and the next
    process delivers the rest and removes the bucket."""
    count = 10_000
    with dirmq.Store(root) as store:
        q = store.create_queue("q", MEMORY)
    due = time.time_ns() // 1_000_000 - 120_000  # a minute or two ago: its bucket is past
    bucket = Path(q.path) / delays.bucket_dir(delays.minute_of(due))
    bucket.mkdir(mode=0o700)
    ids = new_ids(count)
    for message_id in ids:
        data = codec.encode(b"due", {}, message_id=message_id)
        fd = os.open(
            bucket / layout.timed_name(message_id, 0, due), os.O_WRONLY | os.O_CREAT, 0o600
        )
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    ready = Path(q.path) / layout.READY
    promoter = spawn("promote", root, "q", module="tests.support.delay_workers")
    assert promoter.stdout is not None and promoter.stdout.readline().strip() == "promoting"
    wait_until(lambda: bool(os.listdir(ready)), 60, "the first delivery")
    kill(promoter)
    left = os.listdir(bucket)
    assert left, "the kill came after the bucket was emptied: nothing half-way to test"
    names = left + os.listdir(ready)
    assert sorted(n[: layout.ID_LENGTH] for n in names) == sorted(ids), "each message once"
    assert fsck(root, repair=False).problems == ()
    with dirmq.Store(root) as store:
        got = store.queue("q").get(1_000)
        assert len(got) == 1_000
        assert not bucket.exists()
        assert store.queue("q").stats().ready == count - 1_000


def test_a_late_writer_into_a_past_bucket_kept_by_a_stray_is_heard(root: Path) -> None:
    """A past bucket that cannot be removed for an entry that is no delay (a stray file, or a
    temp of the shared-filesystem mode whose writer is slow) is left alone rather than listed
    at every get; a late writer's delay renamed into it afterwards is still heard of and
    delivered (a process under inotify does not rescan on its own)."""
    with dirmq.Store(root) as store:
        q = store.create_queue("q", MEMORY)
        due = time.time_ns() // 1_000_000 - 120_000  # its minute is over
        bucket = Path(q.path) / delays.bucket_dir(delays.minute_of(due))
        bucket.mkdir(mode=0o700)
        (bucket / "stray").write_bytes(b"")
        assert q.get_one() is None  # the bucket listed, kept by the stray: left alone
        assert q.get_one() is None
        [late_id] = new_ids(1)
        tmp = Path(q.path) / layout.TMP / "late"
        tmp.write_bytes(codec.encode(b"late", {}, message_id=late_id))
        os.rename(tmp, bucket / layout.timed_name(late_id, 0, due))
        got = q.get_one(wait_s=10)
        assert got is not None and got.id == late_id


def test_a_shared_mode_spill_whose_trusted_backlog_bucket_went_is_published(root: Path) -> None:
    """The same trust in the backlog (backlog.py): in the shared-filesystem mode a publish
    behind a full @ready whose bucket of this second a refill emptied and removed is written
    into the bucket made again, not refused with QueueNotFound."""
    with dirmq.Store(root, shared=True) as store:
        q = store.create_queue("q", MEMORY)
        q.put_many([b"ready"] * 1_000)
        first = q.put_many([b"behind"] * 5)
        spilled = list(backlog.names(q.path))
        assert len(spilled) == 5
        [directory] = {d for d, _n in spilled}
        for _d, name in spilled:  # emptied and removed, as a refill does
            os.rename(Path(q.path) / directory / name, Path(q.path) / layout.READY / name)
        os.rmdir(Path(q.path) / directory)
        again = q.put(b"behind, the same second")
        assert [n[: layout.ID_LENGTH] for _d, n in backlog.names(q.path)] == [again]
        assert not set(first) & {n[: layout.ID_LENGTH] for _d, n in backlog.names(q.path)}


def test_a_migration_that_fails_leaves_its_flat_delays_to_the_next_try(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flat delay of a process of version 4, heard of by a running process whose bucket for
    it cannot be made (the disk full): the get fails, and once the disk has room the next get
    moves the delay into its bucket and delivers it (the process does not rescan on its own:
    a delay it forgot would wait for a restart)."""
    with dirmq.Store(root) as store:
        q = store.create_queue("q", MEMORY)
        assert q.get_one() is None  # the index is built
        [message_id] = new_ids(1)
        name = layout.timed_name(message_id, 0, time.time_ns() // 1_000_000 - 1_000)
        tmp = Path(q.path) / layout.TMP / "v4"
        tmp.write_bytes(codec.encode(b"from version 4", {}, message_id=message_id))
        fs = FaultyFS(monkeypatch, Path(q.path) / layout.DELAYED)
        fs.fail("mkdir", errno.ENOSPC)
        os.rename(tmp, Path(q.path) / layout.DELAYED / name)  # flat, as version 4 writes
        with pytest.raises(dirmq.StorageError):
            q.get_one()
        fs.clear()
        got = q.get_one(wait_s=10)
        assert got is not None and got.id == message_id


def test_a_bucket_whose_listing_fails_as_it_is_loaded_is_loaded_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bucket of this minute, listed as its minute begins (loaded), cannot be listed (an
    I/O error): the get fails, and the next one lists it again and delivers its delay when
    due, not once the minute is over."""
    with store_clock() as clock, dirmq.Store(root) as store, dirmq.Store(root) as theirs:
        now = clock.now_ms()
        clock.offset_ms = (now // 60_000 + 1) * 60_000 + 1_000 - now  # a second into a minute
        q = store.create_queue("q", MEMORY)
        assert q.get_one() is None  # the index is built
        message_id = theirs.queue("q").put(b"due soon", delay_s=0.2)
        [minute] = delays.top(q.path)[0]
        fs = FaultyFS(monkeypatch, Path(q.path) / delays.bucket_dir(minute))
        fs.fail("listdir", errno.EIO)
        with pytest.raises(dirmq.StorageError):
            q.get_one()
        fs.clear()
        got = q.get_one(wait_s=20)
        assert got is not None and got.id == message_id


def test_a_flat_delay_of_version_4_is_found_by_id_before_it_is_migrated(root: Path) -> None:
    """A process of version 4 beside this one writes a delay flat into @delayed (no bucket
    exists): a peek or a delete by id finds it before any get moved it into its bucket."""
    with dirmq.Store(root) as store:
        q = store.create_queue("q", MEMORY)
        assert q.stats().delayed == 0  # the queue opened
        [message_id] = new_ids(1)
        name = layout.timed_name(message_id, 0, time.time_ns() // 1_000_000 + 3_600_000)
        tmp = Path(q.path) / layout.TMP / "v4"
        tmp.write_bytes(codec.encode(b"from version 4", {}, message_id=message_id))
        os.rename(tmp, Path(q.path) / layout.DELAYED / name)
        assert q.peek(message_id).state == "delayed"
        assert q.delete(message_id)
        assert _delayed_names(q.path) == []


@pytest.mark.parametrize("minutes_ago", [3, 0])
def test_a_file_named_as_a_bucket_fails_no_get(store: dirmq.Store, minutes_ago: int) -> None:
    """A file (not a directory) in @delayed whose name is a minute, past or this one: no get
    fails on it (its watch cannot be had: ENOTDIR) and the queue goes on; fsck judges it as
    any bad name (it stopped at it: "Not a directory")."""
    q = store.create_queue("q", MEMORY)
    assert q.get_one() is None  # the index is built
    minute = delays.minute_of(time.time_ns() // 1_000_000) - minutes_ago
    odd = Path(q.path) / layout.DELAYED / str(minute)
    odd.write_bytes(b"not a bucket")
    odd.chmod(0o600)
    for _ in range(3):
        assert q.get_one() is None
    message_id = q.put(b"goes on")
    got = q.get_one()
    assert got is not None and got.id == message_id
    assert [p.kind for p in fsck(store.root, repair=True).problems] == [Kind.BAD_NAME]
    assert not odd.exists() and fsck(store.root, repair=False).problems == ()
