"""The PySpark data source on a real local[2] SparkSession: batch write/read, streaming reads
that survive a failed task, availableNow, HTTP mode, streaming writes.

Sinks that must be idempotent are directories of files named by message id, written by
`foreach` writers defined inside the tests (so they travel to the executors by value).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")  # an install without the `spark` extra skips this module

from pyspark.errors import StreamingQueryException

import dirmq
from dirmq.spark.options import STATE_SUBDIR

from .support.servers import start_server
from .support.spark_fixtures import run_available_now, spark_fixture  # noqa: F401

pytestmark = pytest.mark.timeout(240)


def _fill(queue: dirmq.Queue, count: int, prefix: str = "m") -> list[bytes]:
    bodies = [f'{{"n": {i}, "tag": "{prefix}{i}"}}'.encode() for i in range(count)]
    for start in range(0, count, 500):
        queue.put_many(bodies[start : start + 500])
    return bodies


def _listing(queue_dir: Path) -> dict[str, list[str]]:
    return {
        d.name: sorted(os.listdir(d))
        for d in sorted(queue_dir.iterdir())
        if d.is_dir() and d.name in ("@ready", "@leased", "@delayed", "@dead")
    }


def _id_sink(sink: Path, fail_flag: Path | None = None, fail_at: int = -1) -> Any:
    """A foreach writer that stores each row as `<sink>/<id>` (idempotent) and logs
    `(epoch, id)`; the first time it meets the row whose body has "n": fail_at while
    `fail_flag` exists, it removes the flag and fails the task, mid-batch."""
    sink_dir, log_dir, flag = str(sink), str(sink) + ".log", str(fail_flag) if fail_flag else ""

    class IdSink:
        def open(self, partition_id: int, epoch_id: int) -> bool:
            self.epoch = epoch_id
            os.makedirs(sink_dir, exist_ok=True)
            os.makedirs(log_dir, exist_ok=True)
            name = f"{epoch_id}-{partition_id}-{os.getpid()}"
            self.log = open(os.path.join(log_dir, name), "a")  # noqa: SIM115
            return True

        def process(self, row: Any) -> None:
            self.log.write(f"{self.epoch} {row.id} {row.receive_count}\n")
            self.log.flush()
            tmp = os.path.join(sink_dir, f".{row.id}.tmp")
            with open(tmp, "wb") as f:
                f.write(row.body)
            os.replace(tmp, os.path.join(sink_dir, row.id))
            if flag and json.loads(row.body)["n"] == fail_at and os.path.exists(flag):
                os.unlink(flag)
                raise RuntimeError("injected failure in the middle of a batch")

        def close(self, error: BaseException | None) -> None:
            self.log.close()

    return IdSink()


def _sink_log(sink: Path) -> list[tuple[int, str, int]]:
    entries = []
    log_dir = Path(str(sink) + ".log")
    for path in log_dir.iterdir():
        for line in path.read_text().splitlines():
            epoch, message_id, count = line.split()
            entries.append((int(epoch), message_id, int(count)))
    return entries


def _stream(spark: Any, **options: str) -> Any:
    reader = spark.readStream.format("dirmq")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# -- batch ----------------------------------------------------------------------------------------
def test_priorities_are_written_and_read(spark: Any, tmp_path: Path) -> None:
    """A `priority` column writes each row at its level; reads show each message's level, and
    the queue delivers the highest first."""
    root = tmp_path / "root"
    store = dirmq.Store(root)
    store.create_queue("tickets", dirmq.QueueConfig(priority_levels=3))
    df = spark.createDataFrame(
        [(b"low", 0), (b"high", 2), (b"mid", 1)], "body binary, priority int"
    )
    df.write.format("dirmq").option("path", str(root)).option("queue", "tickets").mode(
        "append"
    ).save()
    back = spark.read.format("dirmq").option("path", str(root)).option("queue", "tickets").load()
    assert {bytes(r.body): r.priority for r in back.collect()} == {b"low": 0, b"high": 2, b"mid": 1}
    bad = spark.createDataFrame([(b"x", 3)], "body binary, priority int")
    with pytest.raises(Exception, match="from 0 to 2"):
        bad.write.format("dirmq").option("path", str(root)).option("queue", "tickets").mode(
            "append"
        ).save()
    assert [m.body for m in store.queue("tickets").get(3)] == [b"high", b"mid", b"low"]
    store.close()


def test_write_then_read_back(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = dirmq.Store(root)
    store.create_queue("shop/orders")
    rows = [
        (f"order {i}".encode(), {"X-Attr-Shop": f"s{i % 3}"}, "text/plain", None, None)
        for i in range(50)
    ]
    rows.append((b"\x00\xffbinary", {}, None, "g1", 0.0))
    rows.append((b"later", {}, None, None, 3600.0))
    df = spark.createDataFrame(
        rows,
        "body binary, headers map<string,string>, content_type string, `group` string, "
        "delay_s double",
    )
    df.write.format("dirmq").option("path", str(root)).option("queue", "shop/orders").mode(
        "append"
    ).save()
    stats = store.queue("shop/orders").stats()
    assert (stats.ready, stats.delayed) == (51, 1)

    back = (
        spark.read.format("dirmq")
        .option("path", str(root))
        .option("queue", "shop/orders")
        .option("states", "all")
        .load()
        .collect()
    )
    assert len(back) == 52
    by_body = {bytes(r.body): r for r in back}
    assert by_body[b"order 7"].headers == {"X-Attr-Shop": "s1", "Content-Type": "text/plain"}
    assert by_body[b"order 7"].content_type == "text/plain"
    assert by_body[b"order 7"].state == "ready" and by_body[b"order 7"].receive_count == 0
    assert by_body[b"\x00\xffbinary"].group == "g1"
    assert by_body[b"later"].state == "delayed"
    assert [r.id for r in back] == sorted(r.id for r in back)  # FIFO order within partitions
    assert {r.published_at.year for r in back} == {by_body[b"later"].published_at.year}
    assert not list((root / STATE_SUBDIR / "staging").iterdir())  # staging cleaned up


def test_batch_read_leaves_the_queue_untouched(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "root"
    store = dirmq.Store(root)
    queue = store.create_queue("q")
    _fill(queue, 300)
    leased = queue.get(40, visibility_s=600)
    before = _listing(Path(queue.path))
    stats_before = queue.stats()

    df = spark.read.format("dirmq").option("path", str(root)).option("queue", "q").load()
    rows = df.collect()
    assert len(rows) == 300
    assert sum(r.state == "leased" for r in rows) == 40
    assert {r.id for r in rows if r.state == "leased"} == {m.id for m in leased}
    assert df.rdd.getNumPartitions() == 2
    assert _listing(Path(queue.path)) == before
    assert queue.stats().total == stats_before.total
    queue.ack(leased[0].receipt or "")  # the leases are still ours


def test_a_declared_schema_reads_only_those_columns(spark: Any, tmp_path: Path) -> None:
    root, out = tmp_path / "root", tmp_path / "parquet"
    queue = dirmq.Store(root).create_queue("q")
    bodies = _fill(queue, 400)
    declared = "body binary, id string, published_at timestamp"

    snapshot = (
        spark.read.format("dirmq").schema(declared).option("path", str(root)).option("queue", "q")
    )
    rows = snapshot.load().collect()
    assert rows[0].__fields__ == ["body", "id", "published_at"]
    assert sorted(bytes(r.body) for r in rows) == sorted(bodies)

    stream = spark.readStream.format("dirmq").schema("id string, body binary")
    stream = stream.option("path", str(root)).option("queue", "q").option("consumer", "narrow")
    run_available_now(stream.load(), out, tmp_path / "checkpoint")
    written = spark.read.parquet(str(out))
    assert written.columns == ["id", "body"]
    assert written.count() == 400 and written.select("id").distinct().count() == 400
    assert queue.stats().total == 0

    with pytest.raises(Exception, match="no column 'colour'"):
        spark.read.format("dirmq").schema("colour string").option("path", str(root)).option(
            "queue", "q"
        ).load().collect()


def _wait_for_tasks_to_end(spark: Any, group: str, timeout_s: float = 120.0) -> None:
    """Wait until every task of the jobs of `group` has ended: a failed job is reported as soon
    as one task fails, while its other tasks may still run (and write)."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stages = [
            tracker.getStageInfo(stage)
            for job in tracker.getJobIdsForGroup(group)
            for stage in (tracker.getJobInfo(job).stageIds if tracker.getJobInfo(job) else [])
        ]
        if stages and all(s is None or s.numActiveTasks == 0 for s in stages):
            return
        time.sleep(0.1)
    raise AssertionError(f"the tasks of {group} still run after {timeout_s} s")


def test_a_failed_write_publishes_nothing(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as f
    from pyspark.sql.types import StringType

    root = tmp_path / "root"
    queue = dirmq.Store(root).create_queue("q")

    def explode(n: int) -> str:
        if n == 170:
            raise ValueError("a row the job cannot produce")
        return f"row {n}"

    bad = f.udf(explode, StringType(), useArrow=False)
    df = spark.range(200).repartition(2).select(bad("id").alias("body"))
    group = f"failed-write-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "a write that fails")
    try:
        with pytest.raises(Exception, match="a row the job cannot produce"):
            df.write.format("dirmq").option("path", str(root)).option("queue", "q").mode(
                "append"
            ).save()
        _wait_for_tasks_to_end(spark, group)  # the other task may still run: let it end
    finally:
        for key in ("spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel"):
            spark.sparkContext.setLocalProperty(key, None)
    assert queue.stats().total == 0
    staging = root / STATE_SUBDIR / "staging"
    assert not staging.exists() or not list(staging.iterdir())


def test_a_task_that_stages_after_the_abort_leaves_nothing(tmp_path: Path) -> None:
    """Spark reports a job's failure without waiting for its other tasks, so the driver may
    abort while a task still runs (seen on a busy machine): that task must find nowhere to
    stage its rows, rather than make the job's directory again."""
    import pyarrow as pa
    from pyspark.sql.types import BinaryType, StructField, StructType

    from dirmq.spark.options import parse_options
    from dirmq.spark.writing import DirmqBatchWriter

    root = tmp_path / "root"
    queue = dirmq.Store(root).create_queue("q")
    options = parse_options({"path": str(root), "queue": "q"})
    writer = DirmqBatchWriter(options, StructType([StructField("body", BinaryType())]))
    rows = pa.record_batch([pa.array([b"late"], pa.binary())], names=["body"])
    writer.abort([])  # the driver, once another task failed
    with pytest.raises(dirmq.InvalidArgument, match="aborted"):
        writer.write(iter([rows]))  # the task that was still running
    staging = root / STATE_SUBDIR / "staging"
    assert not list(staging.rglob("*"))
    assert queue.stats().total == 0


# -- streaming reads ------------------------------------------------------------------------------
def test_a_failed_task_replays_its_batch_exactly_once_into_an_idempotent_sink(
    spark: Any, tmp_path: Path
) -> None:
    root, sink, flag = tmp_path / "root", tmp_path / "sink", tmp_path / "fail-once"
    queue = dirmq.Store(root).create_queue("events")
    bodies = _fill(queue, 300)
    flag.touch()

    def run() -> Any:
        stream = _stream(
            spark, path=str(root), queue="events", consumer="etl", maxMessagesPerTrigger="100"
        )
        return (
            stream.writeStream.foreach(_id_sink(sink, flag, fail_at=150))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    first = run()
    with pytest.raises(StreamingQueryException, match="injected failure"):
        first.awaitTermination()
    assert not flag.exists()
    stats = queue.stats()
    # Batch 1 is leased; batch 0 was committed, and acknowledged by batch 1's tasks unless
    # they were cancelled first; batch 2 was never planned.
    assert stats.ready == 100 and stats.in_flight in (100, 200)

    second = run()
    second.awaitTermination()
    assert second.exception() is None

    written = {p.name: p.read_bytes() for p in sink.iterdir() if not p.name.startswith(".")}
    assert sorted(written.values()) == sorted(bodies)  # every message, exactly once by id
    log = _sink_log(sink)
    failed_batch = {mid for epoch, mid, _ in log if epoch == 1}
    assert len(failed_batch) == 100  # the replay of batch 1 produced the same 100 messages
    assert {epoch for epoch, _, _ in log} == {0, 1, 2}
    assert all(count == 1 for _, _, count in log)  # nothing was ever leased twice
    assert queue.stats().total == 0  # all acknowledged, the last batch included
    assert not list((root / STATE_SUBDIR / "consumers" / "events" / "@etl" / "batches").iterdir())


def test_available_now_drains_the_queue_and_a_second_run_finds_nothing(
    spark: Any, tmp_path: Path
) -> None:
    root, out = tmp_path / "root", tmp_path / "parquet"
    queue = dirmq.Store(root).create_queue("q")
    _fill(queue, 1000)

    def run() -> Any:
        df = _stream(spark, path=str(root), queue="q", consumer="drain")
        return run_available_now(df, out, tmp_path / "checkpoint")

    first = run()
    assert sum(p["numInputRows"] for p in first.recentProgress) == 1000
    assert queue.stats().total == 0
    _fill(queue, 5, prefix="late")  # arrives between the runs
    second = run()
    assert sum(p["numInputRows"] for p in second.recentProgress) == 5
    third = run()
    assert sum(p["numInputRows"] for p in third.recentProgress) == 0
    table = spark.read.parquet(str(out))
    assert table.count() == 1005 and table.select("id").distinct().count() == 1005


def test_a_long_batch_keeps_its_leases(spark: Any, tmp_path: Path) -> None:
    root, sink = tmp_path / "root", tmp_path / "sink"
    queue = dirmq.Store(root).create_queue("slow")
    _fill(queue, 60)
    from pyspark.sql import functions as f

    slow = f.udf(lambda body: __import__("time").sleep(0.1) or body, "binary", useArrow=False)
    query = (
        _stream(
            spark,
            path=str(root),
            queue="slow",
            consumer="slow",
            leaseSeconds="2",
            maxMessagesPerTrigger="30",
            numPartitions="1",
        )
        .withColumn("body", slow("body"))  # 30 rows x 0.1 s: each batch outlives its lease
        .writeStream.foreach(_id_sink(sink))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    log = _sink_log(sink)
    assert len(log) == 60 and len({mid for _, mid, _ in log}) == 60
    assert all(count == 1 for _, _, count in log)  # no lease expired and was taken again
    assert queue.stats().total == 0


def _wait_for(condition: Any, what: str, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s} s")
        time.sleep(0.1)


def test_a_consumer_name_is_held_by_one_query_at_a_time(spark: Any, tmp_path: Path) -> None:
    root, sink = tmp_path / "root", tmp_path / "sink"
    queue = dirmq.Store(root).create_queue("events")
    _fill(queue, 300)

    def start(checkpoint: str, available_now: bool = False) -> Any:
        stream = _stream(
            spark, path=str(root), queue="events", consumer="etl", maxMessagesPerTrigger="100"
        )
        writer = stream.writeStream.foreach(_id_sink(sink)).option(
            "checkpointLocation", str(tmp_path / checkpoint)
        )
        if available_now:
            return writer.trigger(availableNow=True).start()
        return writer.trigger(processingTime="200 milliseconds").start()

    first = start("first")
    try:
        _wait_for(lambda: first.lastProgress is not None, "the first query's first batch")
        second = start("second")
        with pytest.raises(StreamingQueryException) as refused:
            second.awaitTermination(120)
        message = str(refused.value)
        assert "consumer 'etl' of queue 'events' is held by a running query" in message
        assert "stop that query first" in message
        _wait_for(lambda: queue.stats().total == 0, "the first query draining the queue")
    finally:
        first.stop()
    _fill(queue, 200, prefix="after")
    third = start("third", available_now=True)  # the name is free again
    third.awaitTermination()
    assert third.exception() is None
    log = _sink_log(sink)
    assert len(log) == 500 and len({mid for _, mid, _ in log}) == 500  # nothing twice
    assert queue.stats().total == 0


def test_a_dead_holder_of_a_consumer_name_is_taken_over(spark: Any, tmp_path: Path) -> None:
    import socket
    import subprocess

    from dirmq.spark.holder import read_record, record_path
    from dirmq.store.processes import HOST_TAG, ProcessIdentity, current

    root, out = tmp_path / "root", tmp_path / "parquet"
    queue = dirmq.Store(root).create_queue("q")
    _fill(queue, 50)
    gone = subprocess.Popen(["true"])
    gone.wait()
    consumer_dir = root / STATE_SUBDIR / "consumers" / "q" / "@etl"
    consumer_dir.mkdir(parents=True)
    process = ProcessIdentity(HOST_TAG, current().pid_ns, gone.pid, 0).token()  # FORMAT.md
    record = {
        "process": process,
        "host": socket.gethostname(),
        "pid": gone.pid,
        "token": "x",
        "timeout_s": 600,
    }
    Path(record_path(str(consumer_dir), 4)).write_text(json.dumps(record))  # renewed just now
    query = run_available_now(
        _stream(spark, path=str(root), queue="q", consumer="etl"), out, tmp_path / "checkpoint"
    )
    assert query.exception() is None
    assert spark.read.parquet(str(out)).count() == 50 and queue.stats().total == 0
    assert not os.path.exists(record_path(str(consumer_dir), 4))
    taken = read_record(record_path(str(consumer_dir), 5))
    assert taken is not None  # the query's own, free again once its process has ended
    _wait_for(lambda: not taken.is_alive(time.time()), "the query's hold ending")


# -- streaming writes -----------------------------------------------------------------------------
def test_streaming_queue_to_queue_with_a_failed_sink_task(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as f

    root, flag = tmp_path / "root", tmp_path / "fail-once"
    store = dirmq.Store(root)
    source = store.create_queue("in")
    target = store.create_queue("out")
    bodies = _fill(source, 200)
    flag.touch()
    flag_path = str(flag)

    def fail_once(n: int) -> int:
        if n == 150 and os.path.exists(flag_path):
            os.unlink(flag_path)
            raise RuntimeError("injected sink failure")
        return n

    check = f.udf(fail_once, "int", useArrow=False)

    def run() -> Any:
        stream = _stream(
            spark, path=str(root), queue="in", consumer="copy", maxMessagesPerTrigger="100"
        )
        parsed = stream.select(
            "body",
            check(f.get_json_object(f.col("body").cast("string"), "$.n").cast("int")).alias("n"),
        )
        return (
            parsed.select(
                "body",
                f.map_from_arrays(
                    f.array(f.lit("X-Attr-N")), f.array(f.col("n").cast("string"))
                ).alias("headers"),
            )
            .writeStream.format("dirmq")
            .option("path", str(root))
            .option("queue", "out")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )

    first = run()
    with pytest.raises(StreamingQueryException, match="injected sink failure"):
        first.awaitTermination()
    assert target.stats().total == 100  # batch 0 published; batch 1 failed, published nothing
    second = run()
    second.awaitTermination()
    copied = sorted(m.body for m in target.browse())
    assert copied == sorted(bodies)
    assert source.stats().total == 0


# -- over HTTP ------------------------------------------------------------------------------------
def test_http_mode(spark: Any, tmp_path: Path) -> None:
    server = start_server(tmp_path / "served")
    try:
        url = server.url
        df = spark.createDataFrame([(f"event {i}",) for i in range(250)], "body string")
        df.write.format("dirmq").option("url", url).option("queue", "web/in").option(
            "createQueue", "true"
        ).mode("append").save()
        snapshot = spark.read.format("dirmq").option("url", url).option("queue", "web/in")
        rows = snapshot.option("states", "ready").load().collect()
        assert sorted(bytes(r.body) for r in rows) == sorted(
            f"event {i}".encode() for i in range(250)
        )

        out = tmp_path / "parquet"
        query = (
            _stream(
                spark,
                url=url,
                queue="web/in",
                consumer="web",
                stateDir=str(tmp_path / "state"),
                maxMessagesPerTrigger="100",
            )
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert [p["numInputRows"] for p in query.recentProgress][:3] == [100, 100, 50]
        assert spark.read.parquet(str(out)).select("id").distinct().count() == 250
        with dirmq.client.RemoteStore(url) as remote:
            assert remote.queue("web/in").stats().total == 0
    finally:
        server.stop()
