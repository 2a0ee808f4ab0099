"""Delayed messages in buckets of their due minute (store/delays.py, docs/FORMAT.md "Delayed
messages", root format 5): where a delayed publish and a nack with a delay put a message, due
messages delivered bucket by bucket (and each bucket removed once emptied), a writer whose
bucket a consumer removed, another process's delay seen through the bucket's watch, and the
migration of a root of format 4 (on open, killed half-way, beside a process of version 4)."""

from __future__ import annotations

import errno
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import dirmq
from dirmq.store import codec, delays, layout, watch
from dirmq.store.census import Census, queue_depth
from dirmq.store.fsck import Kind, fsck
from dirmq.store.ids import new_ids

from .support.procs import kill, spawn
from .support.store_now import store_now
from .support.waiting import wait_until

MEMORY = dirmq.QueueConfig(durability="memory")


def delayed_files(queue_dir: str | Path) -> dict[str, list[str]]:
    """{entry of @delayed: the names in it} ("" for the flat entries of an earlier format)."""
    found: dict[str, list[str]] = {}
    top = Path(queue_dir) / layout.DELAYED
    for entry in top.iterdir():
        if entry.is_dir():
            found[entry.name] = sorted(os.listdir(entry))
        else:
            found.setdefault("", []).append(entry.name)
    return found


def _in_own_bucket(found: dict[str, list[str]]) -> bool:
    return all(
        bucket == str(delays.due_of(name) // 60_000)  # type: ignore[operator]
        for bucket, names in found.items()
        if bucket
        for name in names
    )


class _Clock:
    def __init__(self) -> None:
        self.ms = time.time_ns() // 1_000_000

    def now_ms(self) -> int:
        return self.ms


@contextmanager
def store_clock() -> Iterator[_Clock]:
    """The store's clock (`clock.now_ms`, imported by name where it is read), moved by the
    test: due times minutes apart without waiting minutes."""
    clock = _Clock()
    with store_now(clock.now_ms):
        yield clock


def test_a_delayed_publish_goes_into_the_bucket_of_its_due_minute(store: dirmq.Store) -> None:
    q = store.create_queue("q", MEMORY)
    soon = q.put(b"soon", delay_s=0.2)
    later = q.put(b"later", delay_s=3_600)
    found = delayed_files(q.path)
    assert "" not in found and _in_own_bucket(found)
    assert sorted(n[: layout.ID_LENGTH] for names in found.values() for n in names) == sorted(
        [soon, later]
    )
    assert q.stats().delayed == 2
    assert q.get_one() is None
    message = q.get_one(wait_s=10)
    assert message is not None and message.id == soon
    assert q.peek(later).state == "delayed"  # found though its bucket was never listed
    assert [m.id for m in q.browse(None, state="delayed")] == [later]


def test_a_nack_with_a_delay_goes_into_the_bucket_of_its_due_minute(store: dirmq.Store) -> None:
    q = store.create_queue("q", MEMORY)
    message_id = q.put(b"again later")
    message = q.get_one()
    assert message is not None and message.receipt is not None
    assert q.nack(message.receipt, delay_s=600) == "delayed"
    found = delayed_files(q.path)
    [[name]] = found.values()
    assert name.startswith(f"{message_id}.1.") and _in_own_bucket(found)
    assert q.stats().delayed == 1 and q.get_one() is None
    soon = q.put(b"soon")
    got = q.get_one()
    assert got is not None and got.receipt is not None and got.id == soon
    nacked = time.monotonic()
    assert q.nack(got.receipt, delay_s=0.2) == "delayed"
    again = q.get_one(wait_s=10)
    assert again is not None and again.id == soon and again.receive_count == 2
    assert time.monotonic() - nacked >= 0.2 - 0.001  # the clocks differ (below: the store's)


def test_a_due_time_is_never_early(store: dirmq.Store) -> None:
    """A due time is whole milliseconds of the wall clock, reached when the clock's millisecond
    (rounded down) gets to it: rounded up, so neither a publish's delay nor a nack's falls due
    before its seconds are over (rounded down, a 0.2 s delay came up to 1 ms early)."""
    q = store.create_queue("never-early", MEMORY)

    def due_ns() -> int:
        [[name]] = delayed_files(q.path).values()
        entry = layout.parse_entry(name)
        assert entry is not None and entry.at_ms is not None
        return entry.at_ms * 1_000_000

    for delay_s in (0.2, 0.0005, 1.2345678):
        before = time.time_ns()
        message_id = q.put(b"later", delay_s=delay_s)
        assert due_ns() >= before + round(delay_s * 1e9)
        q.delete(message_id)
    q.put(b"now")
    got = q.get_one()
    assert got is not None and got.receipt is not None
    before = time.time_ns()
    assert q.nack(got.receipt, delay_s=0.2) == "delayed"
    assert due_ns() >= before + 200_000_000


def test_due_messages_are_delivered_bucket_by_bucket_and_emptied_buckets_go(
    store: dirmq.Store,
) -> None:
    """Four delays in three minutes' buckets: each is delivered once due and not before, and a
    bucket is removed once its minute is over and it is emptied."""
    with store_clock() as clock:
        q = store.create_queue("q", MEMORY)
        clock.ms = (clock.ms // 60_000 + 1) * 60_000 + 1_000  # a second into a minute
        start = clock.ms
        first = q.put(b"first", delay_s=30)
        second = q.put(b"second", delay_s=90)
        third = q.put(b"third", delay_s=95)
        fourth = q.put(b"fourth", delay_s=150)
        assert len(delayed_files(q.path)) == 3
        assert q.get_one() is None
        for due_s, message_id in [(30, first), (90, second), (95, third), (150, fourth)]:
            clock.ms = start + due_s * 1_000 - 1
            assert q.get_one() is None, f"delivered before its time ({due_s} s)"
            clock.ms += 1
            got = q.get_one()
            assert got is not None and got.id == message_id, (due_s, got)
            q.ack(got.receipt or "")
        assert len(delayed_files(q.path)) == 1, "the buckets of past minutes are gone"
        clock.ms += 120_000
        assert q.get_one() is None
        assert q.stats().delayed == 0
        assert delayed_files(q.path) == {}, "and the last one, once its minute is over"


def test_another_process_delay_into_a_begun_bucket_is_seen_at_once(root: Path) -> None:
    """A process that has listed (loaded) the bucket of this minute hears of another process's
    delay into it through that bucket's watch, and delivers it when due, not when it next
    lists the bucket."""
    with dirmq.Store(root) as mine, dirmq.Store(root) as theirs:
        q = mine.create_queue("q", MEMORY)
        q.put(b"now")
        message = q.get_one()  # opens the index
        assert message is not None
        q.ack(message.receipt or "")
        q.put(b"loads the bucket", delay_s=0.05)
        got = q.get_one(wait_s=10)
        assert got is not None
        q.ack(got.receipt or "")
        # Now this minute's bucket (or the next one's) is loaded here; another process
        # delays a message into it.
        sent = time.monotonic()
        other = theirs.queue("q").put(b"from another process", delay_s=0.3)
        got = q.get_one(wait_s=10)
        assert got is not None and got.id == other
        assert time.monotonic() - sent < 5, "delivered when due, not at a later listing"


def test_a_writer_whose_bucket_went_makes_it_again(store: dirmq.Store) -> None:
    """A publisher trusts the bucket it made last (no mkdir per message); a consumer that
    emptied and removed it meanwhile makes its next rename fail: it makes the bucket again."""
    q = store.create_queue("q")
    first = q.put(b"makes the bucket", delay_s=600)
    [(bucket, [name])] = delayed_files(q.path).items()
    aside = Path(q.path) / name
    os.rename(Path(q.path) / layout.DELAYED / bucket / name, aside)  # emptied ...
    os.rmdir(Path(q.path) / layout.DELAYED / bucket)  # ... and removed, as a get would
    second = q.put(b"same minute", delay_s=600.001)
    found = delayed_files(q.path)
    assert [n[: layout.ID_LENGTH] for names in found.values() for n in names] == [second]
    assert _in_own_bucket(found)
    os.rename(aside, Path(q.path) / delays.relative_dir(name) / name)
    assert {m.id for m in q.browse(None, state="delayed")} == {first, second}
    # A nack with a delay trusts the same bucket: gone, it is made again too.
    for bucket, names in delayed_files(q.path).items():
        for each in names:
            os.rename(Path(q.path) / layout.DELAYED / bucket / each, Path(q.path) / each)
        os.rmdir(Path(q.path) / layout.DELAYED / bucket)
    nacked = q.put(b"nacked", delay_s=0)
    message = q.get_one()
    assert message is not None and message.id == nacked and message.receipt is not None
    assert q.nack(message.receipt, delay_s=600.002) == "delayed"
    found = delayed_files(q.path)
    assert [n[: layout.ID_LENGTH] for names in found.values() for n in names] == [nacked]


def _format4_root(root: Path, count: int, spread_minutes: int = 1) -> tuple[str, list[str]]:
    """A root of format 4 with queue "q" holding `count` flat delays (one due now, the rest
    an hour on, spread over `spread_minutes` minutes): what version 4 wrote."""
    with dirmq.Store(root) as store:
        q = store.create_queue("q")
    (root / layout.ROOT_MARKER).write_text(json.dumps({"format": 4, "access": "private"}))
    now_ms = time.time_ns() // 1_000_000
    ids = new_ids(count)
    flat = Path(q.path) / layout.DELAYED
    for i, message_id in enumerate(ids):
        due = now_ms - 1 if i == 0 else now_ms + 3_600_000 + (i % spread_minutes) * 60_000
        data = codec.encode(b"m%d" % i, {}, message_id=message_id)
        _write(flat / layout.timed_name(message_id, 0, due), data)
    return q.path, ids


def _write(path: Path, data: bytes) -> None:
    """A file as a process of the root would write it (the root's private access)."""
    path.write_bytes(data)
    path.chmod(0o600)


def test_a_root_of_format_4_is_migrated_on_open(root: Path) -> None:
    queue_dir, ids = _format4_root(root, 50, spread_minutes=3)
    report = fsck(root, repair=False)
    assert report.ok and {p.kind for p in report.problems} == {Kind.FLAT_DELAY}
    with dirmq.Store(root) as store:
        q = store.queue("q")
        got = q.get_one()
        assert got is not None and got.id == ids[0]  # the due one, delivered
        assert q.stats().delayed == 49
        found = {bucket: names for bucket, names in delayed_files(queue_dir).items() if names}
        assert "" not in found and len(found) == 3 and _in_own_bucket(found)
    assert json.loads((root / layout.ROOT_MARKER).read_text())["format"] == 5
    assert fsck(root, repair=False).problems == ()


def test_fsck_repair_moves_flat_and_misplaced_delays_home(root: Path) -> None:
    queue_dir, _ids = _format4_root(root, 5)
    # A delay in a bucket other than its due minute's, and a stray directory in @delayed.
    with dirmq.Store(root) as store:
        pass
    wrong = Path(queue_dir) / layout.DELAYED / "12345"
    wrong.mkdir(mode=0o700)
    [misplaced_id] = new_ids(1)
    due = time.time_ns() // 1_000_000 + 600_000
    name = layout.timed_name(misplaced_id, 0, due)
    _write(wrong / name, codec.encode(b"misplaced", {}, message_id=misplaced_id))
    (Path(queue_dir) / layout.DELAYED / "notes").mkdir(mode=0o700)
    report = fsck(root, repair=False)
    kinds = Counter(p.kind for p in report.problems)
    assert kinds == {Kind.FLAT_DELAY: 5, Kind.MISNAMED: 1, Kind.STRAY: 1}, report.problems
    assert not report.ok
    repaired = fsck(root, repair=True)
    assert repaired.ok
    (Path(queue_dir) / layout.DELAYED / "notes").rmdir()
    os.rmdir(wrong)
    again = fsck(root, repair=False)
    assert again.problems == (), again.problems
    found = delayed_files(queue_dir)
    assert "" not in found and _in_own_bucket(found)
    with dirmq.Store(root) as store:
        assert store.queue("q").peek(misplaced_id).body == b"misplaced"
        assert store.queue("q").stats().delayed == 5  # and one due: ready


def test_a_migration_killed_half_way_loses_nothing(root: Path) -> None:
    """SIGKILL a process moving 3,000 flat delays (each in a minute of its own: a bucket made
    and flushed each) into their buckets: every message is still there exactly once, flat or
    in its bucket, fsck finds nothing but flat delays, and the next open finishes."""
    count = 3_000
    queue_dir, ids = _format4_root(root, count, spread_minutes=count)
    flat = Path(queue_dir) / layout.DELAYED
    opener = spawn("open", root, "q")
    assert opener.stdout is not None and opener.stdout.readline().strip() == "opening"

    def some_moved() -> bool:
        return any(entry.is_dir() and os.listdir(entry) for entry in flat.iterdir())

    wait_until(some_moved, 60, "the migration to begin")
    kill(opener)
    found = delayed_files(queue_dir)
    assert found.get(""), "the kill came after the migration ended: nothing half-way to test"
    names = [n for each in found.values() for n in each]
    assert sorted(n[: layout.ID_LENGTH] for n in names) == sorted(ids), "each message once"
    assert _in_own_bucket(found)
    report = fsck(root, repair=False)
    assert report.ok and {p.kind for p in report.problems} <= {Kind.FLAT_DELAY}
    with dirmq.Store(root) as store:
        q = store.queue("q")
        assert q.stats().delayed + q.stats().ready == count
        assert delayed_files(queue_dir).get("") is None, "the next open finished it"
    assert fsck(root, repair=False).problems == ()


def test_a_flat_delay_written_beside_a_running_process_is_delivered(root: Path) -> None:
    """A process of version 4 on the same root writes delays flat into @delayed: a process of
    version 5 that has the queue open moves each into its bucket and delivers it when due."""
    with dirmq.Store(root) as store:
        q = store.create_queue("q", MEMORY)
        assert q.get_one() is None  # the index is built
        [message_id] = new_ids(1)
        due = time.time_ns() // 1_000_000 + 200
        name = layout.timed_name(message_id, 0, due)
        tmp = Path(q.path) / layout.TMP / "v4"
        _write(tmp, codec.encode(b"from version 4", {}, message_id=message_id))
        os.rename(tmp, Path(q.path) / layout.DELAYED / name)
        got = q.get_one(wait_s=10)
        assert got is not None and got.id == message_id
        assert "" not in delayed_files(q.path)


def test_delays_take_no_room_of_ready(store: dirmq.Store) -> None:
    """1,200 delayed publishes (more than @ready's head of 1,000 before the backlog) neither
    send the next ready message behind @ready nor fail (a delayed message counted as spilled
    to the backlog once had no durability to make its bucket with)."""
    q = store.create_queue("q", dirmq.QueueConfig(delay_s=3_600))
    q.put_many([b"d"] * 600)
    q.put_many([b"d"] * 600)
    now = q.put(b"now", delay_s=0)
    assert os.listdir(Path(q.path) / layout.READY) == [now]
    assert os.listdir(Path(q.path) / layout.BACKLOG) == []
    assert q.stats().delayed == 1_200


def test_out_of_watches_for_a_bucket_the_queue_is_polled(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bucket whose watch cannot be had (the user's inotify watches spent) is still loaded,
    and the queue polled from then on: its delays, and another process's, are delivered."""
    real = watch.add_watch

    def add_watch(fd: int, path: str, mask: int) -> int:
        if f"/{layout.DELAYED}/" in path:
            raise OSError(errno.ENOSPC, f"inotify_add_watch {path}: No space left on device")
        return real(fd, path, mask)

    monkeypatch.setattr(watch, "add_watch", add_watch)
    with dirmq.Store(root, poll_interval_s=0.05) as mine, dirmq.Store(root) as theirs:
        q = mine.create_queue("q", MEMORY)
        first = q.put(b"mine", delay_s=0.05)
        got = q.get_one(wait_s=10)
        assert got is not None and got.id == first
        assert q.polled()
        other = theirs.queue("q").put(b"theirs", delay_s=0.1)
        got = q.get_one(wait_s=10)
        assert got is not None and got.id == other


def test_a_late_writer_into_a_past_bucket_is_not_left_behind(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer whose rename into a bucket lands after a consumer listed the bucket (its
    minute over) but before the consumer's rmdir: the rmdir fails, the consumer lists the
    bucket again and delivers the late message, rather than leaving it until a rescan."""
    with store_clock() as clock:
        q = store.create_queue("q", MEMORY)
        clock.ms = (clock.ms // 60_000 + 1) * 60_000 + 1_000  # a second into a minute
        first = q.put(b"first", delay_s=30)
        [(bucket, [name])] = delayed_files(q.path).items()
        clock.ms += 30_000
        got = q.get_one()  # the bucket loaded (its minute has begun), its one message due
        assert got is not None and got.id == first
        q.ack(got.receipt or "")
        [late_id] = new_ids(1)
        late = layout.timed_name(late_id, 0, delays.due_of(name) or 0)
        real = delays.bucket_names
        planted: list[str] = []

        def listing_then_a_late_rename(queue_dir: str, minute: int) -> list[str]:
            names = real(queue_dir, minute)
            if not planted:
                planted.append(late)
                data = codec.encode(b"late", {}, message_id=late_id)
                _write(Path(q.path) / layout.DELAYED / bucket / late, data)
            return names

        monkeypatch.setattr(delays, "bucket_names", listing_then_a_late_rename)
        clock.ms += 60_000  # the bucket's minute is over: listed (empty), then removed
        assert [m.id for m in q.get(10)] == [late_id]
        assert delayed_files(q.path) == {}


def test_the_census_counts_delays_in_their_buckets(store: dirmq.Store) -> None:
    """/metrics' census (no queue opened): a delay to come counts as delayed, a due one as
    ready, whichever bucket holds it; a kept census counts again what changed."""
    q = store.create_queue("q", MEMORY)
    q.put(b"later", delay_s=3_600)
    q.put(b"due", delay_s=0.01)
    wait_until(lambda: time.time_ns() // 1_000_000 > _earliest_due(q.path), 5, "the delay due")
    depth = queue_depth(store.root, "q")
    assert (depth.ready, depth.delayed) == (1, 1)
    kept = Census(store.root)
    assert [(d.stats.ready, d.stats.delayed) for d in kept.depths()] == [(1, 1)]
    q.put(b"later still", delay_s=7_200)
    assert [(d.stats.ready, d.stats.delayed) for d in kept.depths()] == [(1, 2)]


def _earliest_due(queue_dir: str) -> int:
    return min(
        delays.due_of(name) or 0 for names in delayed_files(queue_dir).values() for name in names
    )
