"""The Spark layer's protocol without a SparkSession: the stream reader driven the way PySpark
drives it (latestOffset, partitions, read, restarts), the ledger, the upkeep thread, the
writers' commit/abort and their exactly-once markers, and option parsing. Fast and exact where
the Spark tests can only observe the outcome.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")

import pyarrow as pa
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

import dirmq
from dirmq.errors import InvalidArgument, InvalidName
from dirmq.spark import DirmqDataSource, connect
from dirmq.spark import options as options_module
from dirmq.spark.leasing import LeasePartition, leased_table, split
from dirmq.spark.ledger import Ledger
from dirmq.spark.options import parse_options
from dirmq.spark.rows import READ_SCHEMA
from dirmq.spark.stream import DirmqStreamReader
from dirmq.spark.upkeep import Upkeep, settle_receipts, settle_record
from dirmq.spark.writing import (
    DirmqBatchWriter,
    DirmqStreamWriter,
    StagedRows,
    publish,
    with_dedup_ids,
)
from dirmq.store.filemodes import PRIVATE, Access

ACCESS = Access.named(PRIVATE)


@pytest.fixture(autouse=True)
def _close_cached_handles() -> Iterator[None]:
    yield
    connect.close_all()  # the Stores and HTTP clients the reader opened in this process


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def queue(root: Path) -> Iterator[dirmq.Queue]:
    with dirmq.Store(root) as store:
        yield store.create_queue("jobs")


def _reader(root: Path, **extra: str) -> DirmqStreamReader:
    options = {"path": str(root), "queue": "jobs", "consumer": "c", "numPartitions": "2"}
    return DirmqStreamReader(parse_options({**options, **extra}))


def _read(reader: DirmqStreamReader, start: dict[str, Any], end: dict[str, Any]) -> list[str]:
    ids: list[str] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            ids.extend(batch.column("id").to_pylist())
    return ids


# -- the stream reader's protocol -----------------------------------------------------------------
def test_batches_are_recorded_replayed_and_acknowledged_after_the_commit(
    root: Path, queue: dirmq.Queue
) -> None:
    published = queue.put_many([b"m%d" % i for i in range(500)])
    reader = _reader(root)
    try:
        start = reader.initialOffset()
        assert start == {"seq": 0, "messages": 0, "partitions": 0}
        first = reader.latestOffset(start, ReadMaxRows(200))
        assert first == {"seq": 1, "messages": 200, "partitions": 2}
        batch1 = _read(reader, start, first)
        assert sorted(batch1) == published[:200]
        assert _read(reader, start, first) == batch1  # a retried task replays its record
        assert queue.stats().in_flight == 200

        # Spark committed batch 1 and plans batch 2: its tasks acknowledge batch 1.
        second = reader.latestOffset(first, ReadMaxRows(200))
        assert second["seq"] == 2
        partitions = reader.partitions(first, second)
        assert all(isinstance(p, LeasePartition) for p in partitions)
        handed = sorted(r for p in partitions for r in p.settle)  # type: ignore[attr-defined]
        assert handed == [(1, 0), (1, 1)]
        batch2 = [i for p in partitions for b in reader.read(p) for i in b.column("id").to_pylist()]
        assert sorted(batch2) == published[200:400]
        assert queue.stats().in_flight == 200  # batch 1 acknowledged, batch 2 leased
    finally:
        reader.stop()

    # The driver restarts; Spark replays batch 2 from its log, without calling latestOffset.
    again = _reader(root)
    try:
        assert sorted(_read(again, first, second)) == sorted(batch2)
        third = again.latestOffset(second, ReadAllAvailable())
        assert third["messages"] == 100
        assert sorted(_read(again, second, third)) == published[400:]
        assert again.latestOffset(third, ReadAllAvailable()) == third  # idle: settles batch 3
        assert queue.stats().total == 0
        assert Ledger(again._options.consumer_dir(), ACCESS).seqs() == []
    finally:
        again.stop()


def test_read_tasks_are_given_disjoint_names_and_skip_what_others_took(
    root: Path, queue: dirmq.Queue
) -> None:
    published = queue.put_many([b"m%d" % i for i in range(400)])
    reader = _reader(root)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(300))
        partitions = reader.partitions(start, end)
        names = [p.names for p in partitions]  # type: ignore[attr-defined]
        assert names == [published[:150], published[150:300]]
        # Another consumer of the queue takes a planned message before the task runs.
        with dirmq.Store(root) as other:
            [stolen] = other.queue("jobs").get(1)
        assert stolen.id == published[0]
        got = [i for p in partitions for b in reader.read(p) for i in b.column("id").to_pylist()]
        assert got == published[1:300]
        following = reader.latestOffset(end, ReadAllAvailable())
        assert sorted(_read(reader, end, following)) == published[300:]
        reader.latestOffset(following, ReadAllAvailable())  # idle: settles everything
        assert queue.stats().total == 1  # only the other consumer's lease is left
    finally:
        reader.stop()


def test_a_task_records_its_leases_then_reads_them_in_bounded_batches(
    root: Path, queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dirmq.spark import leasing

    monkeypatch.setattr(leasing, "BATCH_BYTES", 1000)  # 10 bodies of 100 bytes
    published = queue.put_many([b"%0100d" % i for i in range(50)])
    reader = _reader(root, numPartitions="1")
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        first = reader.partitions(start, end)[0]
        assert isinstance(first, LeasePartition) and len(first.names) == 50  # one task
        rows = reader.read(first)
        batch = next(rows)
        # The record was written before the first row: every lease, though only 10 were read.
        record = Ledger(reader._options.consumer_dir(), ACCESS).part_record(1, 0)
        assert record is not None and len(record.leases) == len(record.receipts) == 50
        assert [batch.num_rows] + [b.num_rows for b in rows] == [10] * 5

        # A heartbeat renames a lease; a retried task reads its record by lease name, and the
        # moved one by id.
        queue.extend(record.receipts[3], 600)
        replayed = [i for b in reader.read(first) for i in b.column("id").to_pylist()]
        assert sorted(replayed) == published
    finally:
        reader.stop()


def test_a_restarted_driver_replays_every_recorded_partition(
    root: Path, queue: dirmq.Queue
) -> None:
    published = queue.put_many([b"m%d" % i for i in range(400)])
    reader = _reader(root)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(400))
        assert end["partitions"] == 2
        first_run = _read(reader, start, end)
        assert sorted(first_run) == published
    finally:
        reader.stop()
    queue.put(b"one new message")  # fewer ready than partitions when the driver comes back
    again = _reader(root)
    try:
        assert sorted(_read(again, start, end)) == published
        following = again.latestOffset(end, ReadAllAvailable())
        assert following["messages"] == 1
        _read(again, end, following)
        again.latestOffset(following, ReadAllAvailable())
        assert queue.stats().total == 0
    finally:
        again.stop()


def test_a_restarted_driver_names_the_messages_of_a_batch_nobody_recorded(
    root: Path, queue: dirmq.Queue
) -> None:
    published = queue.put_many([b"m%d" % i for i in range(300)])
    reader = _reader(root)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(200))  # logged by Spark, then the driver died
    reader.stop()
    again = _reader(root)
    try:
        partitions = again.partitions(start, end)
        assert all(isinstance(p, LeasePartition) and p.names and not p.quota for p in partitions)
        got = [i for p in partitions for b in again.read(p) for i in b.column("id").to_pylist()]
        assert sorted(got) == published[:200]
    finally:
        again.stop()


def test_a_restarted_batch_with_a_partial_record_leases_no_more_than_a_held_batch(
    root: Path, queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(options_module, "DEFAULT_MAX_HELD_BATCH", 4)
    published = queue.put_many([b"m%d" % i for i in range(300)])
    reader = _reader(root)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(200))
    first = reader.partitions(start, end)[0]
    recorded = [i for b in reader.read(first) for i in b.column("id").to_pylist()]
    reader.stop()  # the driver died with partition 0 recorded, partition 1 never run
    again = _reader(root)
    try:
        partitions = again.partitions(start, end)
        assert [(p.names, p.quota) for p in partitions if isinstance(p, LeasePartition)] == [
            ([], 100),  # recorded: replays its record
            ([], 2),  # leases with `get`: its share of a held batch (4) at most
        ]
        got = [i for p in partitions for b in again.read(p) for i in b.column("id").to_pylist()]
        assert sorted(got) == sorted(recorded + published[100:102])  # the record, then 2 more
    finally:
        again.stop()


def test_a_restarted_batch_is_charged_to_the_available_now_budget(
    root: Path, queue: dirmq.Queue
) -> None:
    queue.put_many([b"m%d" % i for i in range(300)])
    reader = _reader(root)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(200))
    reader.stop()
    again = _reader(root)
    try:
        again.prepareForTriggerAvailableNow()  # 300 ready, 200 of them for the logged batch
        _read(again, start, end)
        queue.put_many([b"late"] * 50)  # published after the run started: not for this run
        following = again.latestOffset(end, ReadAllAvailable())
        assert following["messages"] == 100
        _read(again, end, following)
        assert again.latestOffset(following, ReadAllAvailable()) == following
        assert queue.stats().ready == 50
    finally:
        again.stop()


def test_only_a_local_filesystem_gets_the_large_default_batches(
    root: Path, queue: dirmq.Queue
) -> None:
    queue.put_many([b"x"] * 3)
    local = _reader(root)
    polled = DirmqStreamReader(parse_options({"path": str(root), "queue": "jobs", "consumer": "p"}))
    try:
        local.latestOffset(local.initialOffset(), ReadAllAvailable())
        assert local._driver().large_batches
        connect.local_store(str(root)).watch_mode = "poll"  # as on NFS: renewals are slow
        polled.latestOffset(polled.initialOffset(), ReadAllAvailable())
        assert not polled._driver().large_batches
    finally:
        local.stop()
        polled.stop()


def test_available_now_keeps_its_last_batch_small(root: Path, queue: dirmq.Queue) -> None:
    queue.put_many([b"x"] * 3500)
    reader = _reader(root, maxMessagesPerBatch="2000")
    try:
        reader.prepareForTriggerAvailableNow()
        offsets = [reader.initialOffset()]
        for _ in range(4):
            offsets.append(reader.latestOffset(offsets[-1], ReadAllAvailable()))
            _read(reader, offsets[-2], offsets[-1])
        # 2000 + 1500 would leave 1500 for the driver to acknowledge alone, with every
        # executor waiting: the last batch gets 1000 (FINAL_BATCH), the one before the rest.
        assert [o["messages"] for o in offsets[1:4]] == [2000, 500, 1000]
        assert offsets[4] == offsets[3] and queue.stats().total == 0
    finally:
        reader.stop()


def test_a_group_at_the_head_is_leased_with_get(root: Path, queue: dirmq.Queue) -> None:
    ids = queue.put_many([dirmq.OutgoingMessage(b"g%d" % i, group="g") for i in range(3)])
    reader = _reader(root, numPartitions="1")
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        [partition] = reader.partitions(start, end)
        assert isinstance(partition, LeasePartition) and partition.names == []
        assert partition.quota == 3
        got = [i for b in reader.read(partition) for i in b.column("id").to_pylist()]
        assert got == ids[:1]  # one message of a group in flight at a time, in order
    finally:
        reader.stop()


def test_batches_held_in_memory_get_the_smaller_default_cap(
    root: Path, queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Named batches are streamed a file at a time; a count plan (a group at the head) is held
    # by its tasks until recorded, so its default cap is the smaller one.
    monkeypatch.setattr(options_module, "DEFAULT_MAX_BATCH", 6)
    monkeypatch.setattr(options_module, "DEFAULT_MAX_HELD_BATCH", 2)
    queue.put_many([b"plain"] * 8)
    queue.put_many([dirmq.OutgoingMessage(b"g%d" % i, group=f"g{i}") for i in range(9)])
    reader = _reader(root)
    try:
        offsets = [reader.initialOffset()]
        for _ in range(4):
            offsets.append(reader.latestOffset(offsets[-1], ReadAllAvailable()))
            _read(reader, offsets[-2], offsets[-1])
        assert [o["messages"] for o in offsets[1:]] == [6, 2, 2, 2]  # named, named, count...
        reader.stop()  # one running query per consumer name: the capped one follows it
        capped = _reader(root, maxMessagesPerBatch="3")  # an explicit cap holds for both
        assert capped.latestOffset(offsets[-1], ReadAllAvailable())["messages"] == 3
        capped.stop()
    finally:
        reader.stop()


def test_the_default_batch_caps_follow_where_messages_are_held() -> None:
    local = parse_options({"path": "/r", "queue": "q"})
    assert local.batch_cap(held=False) == options_module.DEFAULT_MAX_BATCH == 200_000
    assert local.batch_cap(held=True) == options_module.DEFAULT_MAX_HELD_BATCH == 50_000
    remote = parse_options({"url": "http://h", "queue": "q"})
    assert remote.batch_cap(held=False) == remote.batch_cap(held=True) == 50_000
    capped = parse_options({"path": "/r", "queue": "q", "maxMessagesPerBatch": "7"})
    assert capped.batch_cap(held=False) == capped.batch_cap(held=True) == 7


def test_url_batches_get_a_partition_per_25000_rows_unless_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    remote = parse_options({"url": "http://h", "queue": "q"})
    mib = 1024 * 1024
    assert [remote.rows_partitions_for(n, n * 170) for n in (150, 25_000, 25_001, 90_000)] == [
        1,
        1,
        2,
        4,
    ]
    assert remote.rows_partitions_for(1000, 70 * mib) == 3  # 32 MiB of rows at most
    assert remote.rows_partitions_for(10**7, 10**10) == 8  # and the CPU count
    told = parse_options({"url": "http://h", "queue": "q", "numPartitions": "3"})
    assert told.rows_partitions_for(1000, 1000) == 3


def test_what_was_leased_ahead_and_lost_its_lease_is_left_out(queue: dirmq.Queue) -> None:
    from dirmq.spark.ahead import LeaseAhead

    queue.put_many([b"x"] * 3)
    ahead = LeaseAhead(queue, 0.3, 3, 3, queue.nack_each)
    try:
        time.sleep(0.45)  # the leases (0.3 s) end while no batch takes them,
        assert [m.body for m in queue.get(5)] == [b"x"] * 3  # and another consumer leases them
        assert ahead.take(3) == []  # so no batch may deliver them
    finally:
        ahead.close()


class _Overlap:
    """Counts the calls under way at once (each made to take a moment)."""

    def __init__(self) -> None:
        self.under_way = 0
        self.most_at_once = 0
        self.calls = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def call(self) -> Iterator[int]:
        """One call: yields its number (from 1), the others under way counted meanwhile."""
        with self._lock:
            self.calls += 1
            number = self.calls
            self.under_way += 1
            self.most_at_once = max(self.most_at_once, self.under_way)
        try:
            yield number
        finally:
            with self._lock:
                self.under_way -= 1


class _CountingGets(_Overlap):
    """A queue whose gets are counted while under way (each takes a moment)."""

    def __init__(self, queue: dirmq.Queue, fail_at: int | None = None) -> None:
        super().__init__()
        self.queue = queue
        self.fail_at = fail_at

    def get(self, max_count: int, *, visibility_s: float | None = None) -> list[dirmq.Message]:
        with self.call() as number:
            if number == self.fail_at:
                raise dirmq.StorageError(5, "the disk failed (injected)")
            time.sleep(0.01)
            return self.queue.get(max_count, visibility_s=visibility_s)


def test_leasing_ahead_keeps_two_gets_under_way_and_takes_each_message_once(
    queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dirmq.spark import ahead as ahead_module

    monkeypatch.setattr(ahead_module, "GET_CHUNK", 7)
    published = queue.put_many([b"m%d" % i for i in range(200)])
    counting = _CountingGets(queue)
    ahead = ahead_module.LeaseAhead(counting, 60, 150, 40, queue.nack_each)  # type: ignore[arg-type]
    try:
        taken: list[dirmq.Message] = []
        while len(taken) < 150:
            held = queue.stats().in_flight - len(taken)
            assert held <= 40  # never more held (or asked for) than one batch
            taken += ahead.take(min(25, 150 - len(taken)))
        assert ahead.take(10) == []  # the run's 150 are out: nothing more is leased
    finally:
        ahead.close()
    assert counting.most_at_once == 2
    ids = [m.id for m in taken]
    assert len(set(ids)) == 150 and set(ids) <= set(published)
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (50, 150)


def test_a_failed_get_ahead_stops_both_threads_and_reaches_the_batch(
    queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dirmq.spark import ahead as ahead_module

    monkeypatch.setattr(ahead_module, "GET_CHUNK", 5)
    queue.put_many([b"m%d" % i for i in range(100)])
    counting = _CountingGets(queue, fail_at=4)
    ahead = ahead_module.LeaseAhead(counting, 60, 100, 100, queue.nack_each)  # type: ignore[arg-type]
    try:
        taken = ahead.take(100)  # what the gets before the failure leased
        assert 0 < len(taken) < 100
        with pytest.raises(dirmq.StorageError, match="injected"):
            ahead.take(100)
        assert counting.calls <= 5  # the other thread's get under way ends it too
    finally:
        ahead.close()
    assert queue.stats().in_flight == len(taken)


def test_a_batch_spark_never_logged_is_given_back(root: Path, queue: dirmq.Queue) -> None:
    queue.put_many([b"m%d" % i for i in range(10)])
    reader = _reader(root, numPartitions="1")
    try:
        start = reader.initialOffset()
        planned = reader.latestOffset(start, ReadAllAvailable())
        _read(reader, start, planned)  # leased and recorded...
        assert queue.stats().in_flight == 10
        # ...but Spark asks again from the same start: that batch was never logged.
        replanned = reader.latestOffset(start, ReadAllAvailable())
        assert replanned == planned and queue.stats().ready == 10
        assert len(_read(reader, start, replanned)) == 10
    finally:
        reader.stop()


def test_a_batch_already_acknowledged_produces_nothing(root: Path, queue: dirmq.Queue) -> None:
    queue.put_many([b"a", b"b"])
    reader = _reader(root)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        _read(reader, start, end)
        assert reader.latestOffset(end, ReadAllAvailable()) == end  # settles it
        assert reader.partitions(start, end) == []  # an old checkpoint replaying it: nothing
    finally:
        reader.stop()


def test_available_now_plans_only_what_was_ready(root: Path, queue: dirmq.Queue) -> None:
    queue.put_many([b"early"] * 30)
    reader = _reader(root, maxMessagesPerTrigger="20")
    try:
        reader.prepareForTriggerAvailableNow()
        queue.put_many([b"late"] * 10)
        start = reader.initialOffset()
        limit = reader.getDefaultReadLimit()
        assert limit == ReadMaxRows(20)
        first = reader.latestOffset(start, limit)
        second = reader.latestOffset(first, limit)
        assert (first["messages"], second["messages"]) == (20, 10)
        assert reader.latestOffset(second, limit) == second
    finally:
        reader.stop()


def test_available_now_budgets_from_the_listing_its_first_batch_plans_from(
    root: Path, queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = queue.put_many([b"p%d" % i for i in range(4)])
    queue.put_many([dirmq.OutgoingMessage(b"g%d" % i, group="g") for i in range(2)])
    listings: list[bool] = []
    real = dirmq.Queue.ready_names

    def counted(self: dirmq.Queue, *args: Any, **kwargs: Any) -> list[str]:
        listings.append(kwargs.get("groups", False))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(dirmq.Queue, "ready_names", counted)
    reader = _reader(root, numPartitions="1")
    try:
        monkeypatch.setattr(dirmq.Queue, "stats", None)  # the index is not built for a count
        reader.prepareForTriggerAvailableNow()
        assert reader._budget == 6  # the group's messages are ready too
        first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        [partition] = reader.partitions(reader.initialOffset(), first)
        assert isinstance(partition, LeasePartition) and partition.names == plain
        assert listings == [True]  # one listing served the count and the plan
    finally:
        reader.stop()


def test_a_new_checkpoint_starts_where_the_consumer_acknowledged(
    root: Path, queue: dirmq.Queue
) -> None:
    queue.put_many([b"x"] * 4)
    reader = _reader(root)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        _read(reader, start, end)
        reader.latestOffset(end, ReadAllAvailable())
    finally:
        reader.stop()
    assert _reader(root).initialOffset()["seq"] == end["seq"]


def test_the_reader_pickles_without_its_driver_state(root: Path, queue: dirmq.Queue) -> None:
    import pickle

    reader = _reader(root)
    try:
        reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
        copy = pickle.loads(pickle.dumps(reader))
        assert copy._driver_state is None
    finally:
        reader.stop()


# -- ledger and upkeep ----------------------------------------------------------------------------
def test_the_first_record_of_a_partition_wins(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger"), ACCESS)
    assert ledger.record_part(3, 0, ["a.1"])
    assert not ledger.record_part(3, 0, ["b.1"])
    assert ledger.part(3, 0) == ["a.1"] and ledger.seqs() == [3]
    ledger.set_acked(3)
    ledger.set_acked(2)  # never backwards
    assert ledger.acked() == 3


def test_a_batch_is_as_old_as_its_oldest_record(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path), ACCESS)
    assert ledger.record_part(1, 0, ["a.1"]) and ledger.record_part(1, 1, ["b.1"])
    for part, age_s in ((0, 100), (1, 90)):
        then = time.time() - age_s
        os.utime(os.path.join(ledger.batch_dir(1), f"part-{part:05d}.json"), (then, then))
    ledger.drop_part(1, 0)  # settling part 0 touches the directory, not part 1's age
    recorded = ledger.recorded_at(1)
    assert recorded is not None and 89 < time.time() - recorded < 92
    assert ledger.recorded_at(2) is None


def test_settling_deletes_what_an_expired_lease_cannot_acknowledge(queue: dirmq.Queue) -> None:
    queue.put_many([b"fresh", b"expired"])
    [fresh, expired] = queue.get(2, visibility_s=60)
    queue.nack(expired.receipt or "")  # as if the lease had expired
    settle_receipts(queue, [fresh.receipt or "", expired.receipt or ""])
    assert queue.stats().total == 0


def test_a_record_settles_by_lease_name_and_by_receipt_what_moved(
    tmp_path: Path, queue: dirmq.Queue
) -> None:
    queue.put_many([b"a", b"b", b"c"])
    got = queue.claim_named(queue.ready_names(), visibility_s=60)
    receipts = [m.receipt or "" for _, m in got]
    ledger = Ledger(str(tmp_path / "ledger"), ACCESS)
    ledger.record_part(1, 0, receipts, [lease for lease, _ in got])
    queue.extend(receipts[0], 120)  # a heartbeat renamed this lease
    [record] = ledger.records(1)
    assert record.receipts == receipts and len(record.leases) == 3
    settle_record(queue, record)
    assert queue.stats().total == 0


def test_the_heartbeat_keeps_recorded_leases_alive(tmp_path: Path, queue: dirmq.Queue) -> None:
    queue.put(b"slow")
    [message] = queue.get(1, visibility_s=1.2)
    ledger = Ledger(str(tmp_path / "ledger"), ACCESS)
    ledger.record_part(1, 0, [message.receipt or ""])
    upkeep = Upkeep(queue, ledger, lease_s=1.2)  # beats every 0.3 s
    try:
        time.sleep(3.0)  # the first lease would have expired twice over
        assert queue.stats().in_flight == 1
        assert queue.get(1) == []
        upkeep.wait_settled(1, 10)
        assert queue.stats().total == 0
    finally:
        upkeep.close()


class _CountingAcks(_Overlap):
    """A queue reached as over HTTP (not a local `Queue`), whose acks are counted while under
    way."""

    def __init__(self, queue: dirmq.Queue) -> None:
        super().__init__()
        self.queue = queue
        self.sizes: list[int] = []

    def ack_many(self, receipts: list[str]) -> dict[str, Exception]:
        with self.call():
            self.sizes.append(len(receipts))
            time.sleep(0.05)
            return self.queue.ack_many(receipts)


def test_a_whole_batch_recorded_over_http_is_acknowledged_on_both_settle_threads(
    tmp_path: Path, queue: dirmq.Queue
) -> None:
    """Over `url` a batch is one record: its requests' worth of receipts (1,000 each) are
    dealt out to the settle threads, so two connections acknowledge it side by side."""
    queue.put_many([b"m%d" % i for i in range(2500)])
    got = queue.get(1000, visibility_s=120) + queue.get(1000, visibility_s=120)
    got += queue.get(500, visibility_s=120)
    ledger = Ledger(str(tmp_path / "ledger"), ACCESS)
    ledger.write_rows(1, leased_table(got))
    counting = _CountingAcks(queue)
    upkeep = Upkeep(counting, ledger, lease_s=120)  # type: ignore[arg-type]
    try:
        upkeep.wait_settled(1, 10)
    finally:
        upkeep.close()
    assert sorted(counting.sizes) == [500, 2000]  # whole requests to a thread
    assert counting.most_at_once == 2
    assert queue.stats().total == 0 and ledger.acked() == 1


# -- writers --------------------------------------------------------------------------------------
_BODY = StructType([StructField("body", BinaryType())])


def _staged(rows: list[bytes], partition: int = 0, **ids: Any) -> StagedRows:
    table = pa.table({"body": pa.array(rows, pa.binary())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return StagedRows(partition, len(rows), data=sink.getvalue().to_pybytes(), **ids)


def test_a_batch_write_publishes_on_commit_in_task_order(root: Path, queue: dirmq.Queue) -> None:
    writer = DirmqBatchWriter(parse_options({"path": str(root), "queue": "jobs"}), _BODY)
    writer.commit([_staged([b"c"], 1), None, _staged([b"a", b"b"], 0)])
    assert [m.body for m in queue.browse()] == [b"a", b"b", b"c"]
    writer.abort([_staged([b"never"])])
    assert queue.stats().ready == 3


def test_a_retried_micro_batch_is_published_once(root: Path, queue: dirmq.Queue) -> None:
    options = parse_options({"path": str(root), "queue": "jobs"})
    staged = [_staged([b"same", b"same", b"other"], query_id="q1", batch_id=7)]
    DirmqStreamWriter(options, _BODY).commit(list(staged), 7)
    DirmqStreamWriter(options, _BODY).commit(list(staged), 7)  # Spark re-runs the batch
    assert sorted(m.body for m in queue.browse()) == [b"other", b"same", b"same"]


def test_an_interrupted_commit_publishes_only_the_rest_on_retry(
    root: Path, queue: dirmq.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dirmq.spark import writing

    options = parse_options({"path": str(root), "queue": "jobs"})
    rows = [b"r%d" % (i % 700) for i in range(1200)]  # duplicates included, over 3 chunks
    staged = [_staged(rows[:600], 0, query_id="q", batch_id=1), _staged(rows[600:], 1)]
    staged[1].query_id, staged[1].batch_id = "q", 1
    calls = 0
    real_put_many = queue.put_many

    def crash_on_second_chunk(messages: Any, **kwargs: Any) -> list[str]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("the driver died here")
        return real_put_many(messages, **kwargs)

    monkeypatch.setattr(queue, "put_many", crash_on_second_chunk)
    monkeypatch.setattr(writing, "open_queue", lambda *_a, **_k: queue)
    with pytest.raises(OSError, match="died"):
        DirmqStreamWriter(options, _BODY).commit(list(staged), 1)
    assert queue.stats().ready == writing.PUT_CHUNK
    DirmqStreamWriter(options, _BODY).commit(list(staged), 1)
    assert sorted(m.body for m in queue.browse(limit=5000)) == sorted(rows)


def test_dedup_ids_do_not_depend_on_row_order() -> None:
    a = pa.table({"body": pa.array([b"x", b"y", b"x"], pa.binary())})
    b = pa.table({"body": pa.array([b"x", b"x", b"y"], pa.binary())})
    ids_a = {m.dedup_id for m in with_dedup_ids("q", 1, [a])}
    ids_b = {m.dedup_id for m in with_dedup_ids("q", 1, [b])}
    assert ids_a == ids_b and len(ids_a) == 3
    assert ids_a.isdisjoint(m.dedup_id for m in with_dedup_ids("q", 2, [a]))


def test_publish_chunks(queue: dirmq.Queue) -> None:
    assert publish(queue, (dirmq.OutgoingMessage(b"%d" % i) for i in range(1001))) == 1001


# -- options and schemas --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"queue": "q"}, "exactly one of"),
        ({"path": "/r", "url": "http://x", "queue": "q"}, "exactly one of"),
        ({"path": "/r"}, "queue"),
        ({"url": "ftp://x", "queue": "q"}, "http"),
        ({"path": "/r", "queue": "q", "maxMessagesPerTrigger": "0"}, "positive integer"),
        ({"path": "/r", "queue": "q", "leaseSeconds": "nan"}, "positive number"),
        ({"path": "/r", "queue": "q", "states": "ready,gone"}, "states"),
        ({"path": "/r", "queue": "q", "consumer": "../x"}, "consumer"),
        ({"path": "/r", "queue": "q", "createQueue": "yes"}, "true or false"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], error: str) -> None:
    with pytest.raises(InvalidArgument, match=error):
        parse_options(options)


def test_options_are_case_insensitive_and_names_are_checked() -> None:
    parsed = parse_options({"PATH": "/r", "Queue": "a/b", "MAXMESSAGESPERTRIGGER": "5"})
    assert (parsed.queue, parsed.max_per_trigger) == ("a/b", 5)
    with pytest.raises(InvalidName):
        parse_options({"path": "/r", "queue": "../escape"})
    with pytest.raises(InvalidArgument, match="stateDir"):
        parse_options({"url": "http://h", "queue": "q", "consumer": "c"}).consumer_dir()
    assert split(5, 3) == [2, 2, 1] and split(1, 3) == [1, 0, 0]


def test_the_data_source_refuses_what_it_cannot_do(root: Path, queue: dirmq.Queue) -> None:
    source = DirmqDataSource({"path": str(root), "queue": "jobs"})
    assert DirmqDataSource.name() == "dirmq" and source.schema() == READ_SCHEMA
    with pytest.raises(InvalidArgument, match="append"):
        source.writer(_BODY, overwrite=True)
    with pytest.raises(InvalidArgument, match="'body' is binary in the dirmq source, not string"):
        source.reader(StructType([StructField("body", StringType())]))
    with pytest.raises(InvalidArgument, match="consumer"):
        source.streamReader(READ_SCHEMA)
    extra = StructType([StructField("body", StringType()), StructField("colour", StringType())])
    with pytest.raises(InvalidArgument, match="colour"):
        source.writer(extra, overwrite=False)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ([], "at least one column"),
        ([("colour", StringType())], "no column 'colour'; its columns are id, body, headers"),
        ([("id", BinaryType())], "'id' is string in the dirmq source, not binary"),
        ([("id", StringType()), ("id", StringType())], "declared twice"),
        ([("id", StringType(), False)], "'id' is declared NOT NULL"),
    ],
)
def test_a_declared_schema_must_be_made_of_the_source_columns(
    root: Path, queue: dirmq.Queue, fields: list[tuple[str, Any]], error: str
) -> None:
    source = DirmqDataSource({"path": str(root), "queue": "jobs", "consumer": "c"})
    schema = StructType([StructField(*field) for field in fields])
    for make in (source.reader, source.streamReader):
        with pytest.raises(InvalidArgument, match=error):
            make(schema)


def test_declared_columns_are_the_only_ones_built_in_their_order(
    root: Path, queue: dirmq.Queue
) -> None:
    queue.put_many([dirmq.OutgoingMessage(b, {"X-Attr-K": "v"}) for b in (b"a", b"b", b"c")])
    declared = StructType([StructField("body", BinaryType()), StructField("id", StringType())])
    source = DirmqDataSource({"path": str(root), "queue": "jobs", "consumer": "c"})
    snapshot = source.reader(declared)
    [batch] = [b for p in snapshot.partitions() for b in snapshot.read(p)]
    assert batch.schema.names == ["body", "id"] and batch.column(0).to_pylist() == [
        b"a",
        b"b",
        b"c",
    ]

    stream = source.streamReader(declared)
    try:
        start = stream.initialOffset()
        end = stream.latestOffset(start, ReadAllAvailable())
        rows = [b for p in stream.partitions(start, end) for b in stream.read(p)]
        assert all(b.schema.names == ["body", "id"] for b in rows)
        assert sorted(v for b in rows for v in b.column("body").to_pylist()) == [b"a", b"b", b"c"]
    finally:
        stream.stop()


def test_a_snapshot_of_a_missing_queue_is_an_error(root: Path, queue: dirmq.Queue) -> None:
    from dirmq.errors import QueueNotFound
    from dirmq.spark.snapshot import DirmqSnapshotReader

    reader = DirmqSnapshotReader(parse_options({"path": str(root), "queue": "nope"}))
    with pytest.raises(QueueNotFound):
        reader.partitions()


def test_the_spark_layer_sits_above_store_and_client() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import dirmq.spark, dirmq.spark.stream, dirmq.spark.snapshot, dirmq.spark.writing\n"
        "above = ('dirmq.server', 'dirmq.cli', 'dirmq.sqs')\n"
        "print([m for m in sys.modules if m.split('.')[:2] in [a.split('.') for a in above]])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- over HTTP ------------------------------------------------------------------------------------
def test_url_mode_leases_on_the_driver_and_replays_the_recorded_rows(
    http_server: Any, tmp_path: Path
) -> None:
    from dirmq.client import RemoteStore
    from dirmq.spark.leasing import RowsPartition

    name = f"spark-{tmp_path.name}"
    options = {
        "url": http_server.url,
        "queue": name,
        "consumer": "c",
        "stateDir": str(tmp_path / "state"),
        "numPartitions": "2",
        "pollWaitSeconds": "0.05",
    }
    with RemoteStore(http_server.url) as remote:
        queue = remote.create_queue(name)
        published = queue.put_many([b"r%d" % i for i in range(300)])
        reader = DirmqStreamReader(parse_options(options))
        try:
            start = reader.initialOffset()
            first = reader.latestOffset(start, ReadMaxRows(200))
            assert first == {"seq": 1, "messages": 200, "partitions": 2}
            assert queue.stats().in_flight == 200  # leased by the driver, before any task
            parts = reader.partitions(start, first)
            assert all(isinstance(p, RowsPartition) for p in parts)
            batch1 = _read(reader, start, first)
            assert sorted(batch1) == published[:200]
        finally:
            reader.stop()
        # The driver restarted, and the query now declares fewer columns than the run that
        # recorded the rows: the record holds them all, the replay gives the declared ones.
        again = DirmqStreamReader(parse_options(options), ("id", "receive_count"))
        try:
            assert _read(again, start, first) == batch1
            replayed = [b for p in again.partitions(start, first) for b in again.read(p)]
            assert {tuple(b.schema.names) for b in replayed} == {("id", "receive_count")}
            second = again.latestOffset(first, ReadAllAvailable())
            assert sorted(_read(again, first, second)) == published[200:]
            assert again.latestOffset(second, ReadAllAvailable()) == second
            assert queue.stats().total == 0
        finally:
            again.stop()
        remote.delete_queue(name)


def test_url_mode_available_now_splits_what_is_left_between_the_last_two_batches(
    http_server: Any, tmp_path: Path
) -> None:
    """The driver acknowledges the one before the last while the last runs: over `url` the
    last two batches share what is left, once per run (not halved again and again)."""
    from dirmq.client import RemoteStore

    name = f"spark-{tmp_path.name}"
    options = {
        "url": http_server.url,
        "queue": name,
        "consumer": "c",
        "stateDir": str(tmp_path / "state"),
        "maxMessagesPerBatch": "4000",
        "pollWaitSeconds": "0.05",
    }
    with RemoteStore(http_server.url) as remote:
        queue = remote.create_queue(name)
        published = [i for n in range(8) for i in queue.put_many([b"%d" % n] * 1000)]
        reader = DirmqStreamReader(parse_options(options))
        try:
            reader.prepareForTriggerAvailableNow()
            offsets = [reader.initialOffset()]
            read: list[str] = []
            for _ in range(4):
                offsets.append(reader.latestOffset(offsets[-1], ReadAllAvailable()))
                read += _read(reader, offsets[-2], offsets[-1])
            assert [o["messages"] for o in offsets[1:4]] == [4000, 2000, 2000]
            assert offsets[4] == offsets[3]
            assert sorted(read) == published and queue.stats().total == 0
        finally:
            reader.stop()
        remote.delete_queue(name)


def _url_reader(url: str, name: str, state: Path) -> DirmqStreamReader:
    options = {"url": url, "queue": name, "consumer": "c", "stateDir": str(state)}
    return DirmqStreamReader(parse_options({**options, "pollWaitSeconds": "0.05"}))


def _wait_for(check: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_url_mode_available_now_leases_ahead_of_the_batches(
    http_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While Spark runs a batch the driver leases the next ones: the first batch takes half of
    the run, the last two share the rest; each batch is one partition (25,000 rows each)."""
    from dirmq.client import RemoteStore
    from dirmq.spark import stream

    monkeypatch.setattr(stream, "FIRST_CUT_MIN", 100)  # as if 300 were a large run
    monkeypatch.setattr(stream, "FINAL_BATCH", 10)
    name = f"spark-{tmp_path.name}"
    with RemoteStore(http_server.url) as remote:
        queue = remote.create_queue(name)
        published = queue.put_many([b"a%d" % i for i in range(300)])
        reader = _url_reader(http_server.url, name, tmp_path / "state")
        try:
            reader.prepareForTriggerAvailableNow()
            offsets = [reader.initialOffset()]
            offsets.append(reader.latestOffset(offsets[0], ReadAllAvailable()))
            assert offsets[1] == {"seq": 1, "messages": 150, "partitions": 1}
            _wait_for(lambda: queue.stats().in_flight == 300)  # the rest, leased ahead
            read = _read(reader, offsets[0], offsets[1])
            for _ in range(3):
                offsets.append(reader.latestOffset(offsets[-1], ReadAllAvailable()))
                read += _read(reader, offsets[-2], offsets[-1])
            assert [o["messages"] for o in offsets[1:4]] == [150, 75, 75]
            assert offsets[4] == offsets[3]  # nothing more: settled, the run ends
            assert sorted(read) == published and queue.stats().total == 0
        finally:
            reader.stop()
        remote.delete_queue(name)


def test_url_mode_stop_gives_back_what_was_leased_ahead(
    http_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Messages leased ahead are recorded only when a batch takes them: a query stopped before
    gives them back at once, and its recorded batch replays after a restart, exactly once."""
    from dirmq.client import RemoteStore
    from dirmq.spark import stream

    monkeypatch.setattr(stream, "FIRST_CUT_MIN", 100)
    name = f"spark-{tmp_path.name}"
    with RemoteStore(http_server.url) as remote:
        queue = remote.create_queue(name)
        published = queue.put_many([b"b%d" % i for i in range(300)])
        reader = _url_reader(http_server.url, name, tmp_path / "state")
        try:
            reader.prepareForTriggerAvailableNow()
            start = reader.initialOffset()
            first = reader.latestOffset(start, ReadAllAvailable())
            _wait_for(lambda: queue.stats().in_flight == 300)
        finally:
            reader.stop()
        stats = queue.stats()
        assert (stats.ready, stats.in_flight) == (150, 150)  # batch 1 stays leased
        again = _url_reader(http_server.url, name, tmp_path / "state")
        try:
            read = _read(again, start, first)  # Spark replays the batch it logged
            second = again.latestOffset(first, ReadAllAvailable())
            read += _read(again, first, second)
            assert again.latestOffset(second, ReadAllAvailable()) == second
            assert sorted(read) == published and queue.stats().total == 0
        finally:
            again.stop()
        remote.delete_queue(name)


def test_url_mode_snapshots_page_through_the_queue(http_server: Any, tmp_path: Path) -> None:
    """More than one browse answer (1000): the driver pages the ids, each partition browses
    its own range; a message acknowledged between plan and read is left out."""
    from dirmq.client import RemoteStore
    from dirmq.spark.snapshot import BrowsedPartition, DirmqSnapshotReader

    name = f"spark-{tmp_path.name}"
    with RemoteStore(http_server.url) as remote:
        queue = remote.create_queue(name)
        ids = []
        for start in range(0, 2501, 500):
            ids += queue.put_many([b"%d" % i for i in range(start, min(start + 500, 2501))])
        options = {"url": http_server.url, "queue": name, "numPartitions": "3"}
        reader = DirmqSnapshotReader(parse_options(options))
        parts = reader.partitions()
        assert [p.count for p in parts if isinstance(p, BrowsedPartition)] == [834, 834, 833]
        (gone,) = queue.get(1)  # leased after the plan: not ready any more
        rows = [r for p in parts for b in reader.read(p) for r in b.to_pylist()]
        assert [r["id"] for r in rows] == [i for i in ids if i != gone.id]
        assert [r["body"] for r in rows[:2]] == [b"1", b"2"]
        assert {r["state"] for r in rows} == {"ready"}
        empty = remote.create_queue(name + "-empty")
        assert [
            b
            for p in DirmqSnapshotReader(
                parse_options({**options, "queue": empty.name})
            ).partitions()
            for b in reader.read(p)
        ] == []
        with pytest.raises(InvalidArgument, match="ready messages only"):
            DirmqSnapshotReader(parse_options({**options, "states": "all"})).partitions()
        remote.delete_queue(name)
        remote.delete_queue(empty.name)


def test_a_write_task_refuses_a_row_the_queue_would_refuse(root: Path, tmp_path: Path) -> None:
    from dirmq.errors import MessageTooLarge
    from dirmq.spark.writing import stage

    with dirmq.Store(root) as store:
        store.create_queue("small", dirmq.QueueConfig(max_message_bytes=10))
    options = parse_options({"path": str(root), "queue": "small"})
    good = pa.record_batch({"body": pa.array([b"ok"], pa.binary())})
    (tmp_path / "job").mkdir()  # made by the driver before any task runs
    staged = stage(options, str(tmp_path / "job"), iter([good]))
    assert staged.rows == 1 and staged.path is not None
    big = pa.record_batch({"body": pa.array([b"ok", b"far too long"], pa.binary())})
    with pytest.raises(MessageTooLarge):
        stage(options, str(tmp_path / "job"), iter([big]))
    reserved = pa.record_batch(
        {
            "body": pa.array([b"x"], pa.binary()),
            "headers": pa.array([[("Dirmq-Slot", "1")]], pa.map_(pa.string(), pa.string())),
        }
    )
    with pytest.raises(InvalidArgument, match="reserved"):
        stage(options, str(tmp_path / "job"), iter([reserved]))


def test_url_mode_stream_writes_are_deduplicated_without_a_state_dir(
    http_server: Any, tmp_path: Path
) -> None:
    from dirmq.client import RemoteStore

    name = f"spark-{tmp_path.name}"
    with RemoteStore(http_server.url) as remote:
        queue = remote.create_queue(name)
        options = parse_options({"url": http_server.url, "queue": name})
        staged = [_staged([b"a", b"b", b"a"], query_id="q", batch_id=3)]
        DirmqStreamWriter(options, _BODY).commit(list(staged), 3)
        DirmqStreamWriter(options, _BODY).commit(list(staged), 3)
        assert sorted(m.body for m in queue.browse()) == [b"a", b"a", b"b"]
        remote.delete_queue(name)
