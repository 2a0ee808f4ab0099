"""The `dirmq` data source over the pub/sub retained log (`stream=retained`): batch reads with
filters and ending offsets, streaming from earliest / latest / a number, restarts from a
checkpoint, admission control, availableNow, failOnDataLoss, and the cheap head probe."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")  # an install without the `spark` extra skips this module

from pyspark.errors import StreamingQueryException

from dirmq.client.pubsub import RemotePubSub
from dirmq.pubsub import PubSub
from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.seqlogs import LogHead
from dirmq.store import Store

from .support.servers import start_server
from .support.spark_fixtures import run_available_now, spark_fixture  # noqa: F401

pytestmark = pytest.mark.timeout(240)

CHANNELS = ("orders.eu", "orders.us", "audit")
SUBJECTS = ("created", "paid")


@pytest.fixture(name="hub")
def hub_fixture(tmp_path: Path) -> Iterator[PubSub]:
    hub = PubSub(Store(tmp_path / "root"))
    yield hub
    hub.close()


def _publish(hub: PubSub, count: int, tag: str = "m") -> None:
    """`count` retained messages; message i goes to CHANNELS[i % 3], subject SUBJECTS[i % 2]."""
    for i in range(count):
        hub.publish(
            CHANNELS[i % 3],
            f"{tag}{i}".encode(),
            subject=SUBJECTS[i % 2],
            mode="future",
            headers={"Content-Type": "text/plain"},
        )


def _root(hub: PubSub) -> str:
    return str(hub.store.root)


def _read(spark: Any, hub: PubSub, **options: str) -> Any:
    reader = spark.read.format("dirmq").option("path", _root(hub)).option("stream", "retained")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _stream(spark: Any, hub: PubSub, **options: str) -> Any:
    reader = spark.readStream.format("dirmq").option("path", _root(hub))
    reader = reader.option("stream", "retained")
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _seqs(df: Any) -> list[int]:
    return sorted(row.seq for row in df.select("seq").collect())


# -- batch ----------------------------------------------------------------------------------------
def test_batch_read_with_filters_and_offsets(spark: Any, hub: PubSub) -> None:
    _publish(hub, 30)
    rows = _read(spark, hub, numPartitions="3").orderBy("seq").collect()
    assert [r.seq for r in rows] == list(range(1, 31))
    first = rows[0]
    assert first.body == b"m0" and first.channel == "orders.eu" and first.subject == "created"
    assert first.content_type == "text/plain" and first.headers["Content-Type"] == "text/plain"
    assert first.id and first.published_at is not None
    assert len({r.id for r in rows}) == 30

    orders = _read(spark, hub, channels="orders")  # a prefix: orders.eu and orders.us
    assert _seqs(orders) == [s for s in range(1, 31) if (s - 1) % 3 != 2]
    paid_audit = _read(spark, hub, channels="audit, x", subjects="paid")
    assert _seqs(paid_audit) == [s for s in range(1, 31) if (s - 1) % 6 == 5]
    assert _seqs(_read(spark, hub, endingOffsets="11")) == list(range(1, 11))  # exclusive
    assert _seqs(_read(spark, hub, startingOffsets="5", endingOffsets='{"seq": 8}')) == [5, 6, 7]
    assert _seqs(_read(spark, hub, startingOffsets="25", endingOffsets="1000")) == list(
        range(25, 31)
    )
    narrow = spark.read.format("dirmq").schema("seq long, subject string")
    narrow = narrow.option("path", _root(hub)).option("stream", "retained").load()
    assert narrow.columns == ["seq", "subject"]
    assert sorted(r.seq for r in narrow.collect()) == list(range(1, 31))
    # Nothing was consumed: the log is intact.
    assert len(os.listdir(PubSubPaths.under(_root(hub)).retained)) == 30


def test_bad_options_are_refused_at_load(spark: Any, hub: PubSub) -> None:
    with pytest.raises(Exception, match="exactly one of the options `path`"):
        _read(spark, hub, url="http://127.0.0.1:1")
    with pytest.raises(Exception, match="must start with http"):
        spark.read.format("dirmq").option("url", "ftp://x").option("stream", "retained").load()
    with pytest.raises(Exception, match="either `queue` or `stream=retained`"):
        _read(spark, hub, queue="q")
    with pytest.raises(Exception, match="startingOffsets"):
        _read(spark, hub, startingOffsets="soon")
    with pytest.raises(Exception, match="the only stream is `retained`"):
        spark.read.format("dirmq").option("path", _root(hub)).option("stream", "x").load()
    df = spark.createDataFrame([(b"x",)], "body binary")
    with pytest.raises(Exception, match="cannot be written"):
        df.write.format("dirmq").option("path", _root(hub)).option("stream", "retained").mode(
            "append"
        ).save()


# -- streaming ------------------------------------------------------------------------------------
def test_stream_from_earliest_latest_and_a_number(spark: Any, hub: PubSub, tmp_path: Path) -> None:
    _publish(hub, 20)
    earliest = run_available_now(_stream(spark, hub), tmp_path / "a", tmp_path / "a.ckpt")
    assert sum(p["numInputRows"] for p in earliest.recentProgress) == 20
    assert _seqs(spark.read.parquet(str(tmp_path / "a"))) == list(range(1, 21))
    numbered = _stream(spark, hub, startingOffsets="15")
    run_available_now(numbered, tmp_path / "b", tmp_path / "b.ckpt")
    assert _seqs(spark.read.parquet(str(tmp_path / "b"))) == list(range(15, 21))

    query = (
        _stream(spark, hub, startingOffsets="latest", channels="orders.us")
        .writeStream.format("memory")
        .queryName("retained_latest")
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark.table("retained_latest").count() == 0
        _publish(hub, 6, tag="late")  # seqs 21-26; orders.us: late1 (22) and late4 (25)
        query.processAllAvailable()
        rows = spark.table("retained_latest").orderBy("seq").collect()
        assert [(r.seq, r.body) for r in rows] == [(22, b"late1"), (25, b"late4")]
    finally:
        query.stop()


def test_restart_continues_exactly_and_max_per_trigger(
    spark: Any, hub: PubSub, tmp_path: Path
) -> None:
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"

    def run() -> list[int]:
        df = _stream(spark, hub, maxMessagesPerTrigger="7", numPartitions="2")
        query = run_available_now(df, out, checkpoint)
        return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]

    _publish(hub, 30)
    assert run() == [7, 7, 7, 7, 2]
    _publish(hub, 10, tag="second")
    assert run() == [7, 3]  # continues after seq 30: no replay, no gap
    assert run() == []
    seqs = _seqs(spark.read.parquet(str(out)))
    assert seqs == list(range(1, 41))

    # Nothing was consumed: a new query from earliest replays the whole log.
    again = run_available_now(_stream(spark, hub), tmp_path / "again", tmp_path / "again.ckpt")
    assert sum(p["numInputRows"] for p in again.recentProgress) == 40


def test_fail_on_data_loss(spark: Any, hub: PubSub, tmp_path: Path) -> None:
    _publish(hub, 20)
    os.unlink(PubSubPaths.under(_root(hub)).retained_entry(10))

    with pytest.raises(Exception, match="retained entry 10 is missing"):
        _read(spark, hub).collect()
    assert _seqs(_read(spark, hub, failOnDataLoss="false")) == [s for s in range(1, 21) if s != 10]

    failing = (
        _stream(spark, hub)
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "fail"))
        .option("checkpointLocation", str(tmp_path / "fail.ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException, match="failOnDataLoss=false"):
        failing.awaitTermination()

    run_available_now(
        _stream(spark, hub, failOnDataLoss="false", maxMessagesPerTrigger="8"),
        tmp_path / "skip",
        tmp_path / "skip.ckpt",
    )
    assert _seqs(spark.read.parquet(str(tmp_path / "skip"))) == [s for s in range(1, 21) if s != 10]


# -- over `url` -----------------------------------------------------------------------------------
def test_over_url_batch_stream_and_data_loss(spark: Any, tmp_path: Path) -> None:
    server = start_server(tmp_path / "served")
    try:
        with RemotePubSub(server.url) as remote:
            for i in range(30):
                remote.publish(
                    CHANNELS[i % 3],
                    f"m{i}".encode(),
                    subject=SUBJECTS[i % 2],
                    mode="future",
                    headers={"Content-Type": "text/plain"},
                )

        def read(**options: str) -> Any:
            reader = spark.read.format("dirmq").option("url", server.url)
            for key, value in {"stream": "retained", **options}.items():
                reader = reader.option(key, value)
            return reader.load()

        def stream(**options: str) -> Any:
            reader = spark.readStream.format("dirmq").option("url", server.url)
            for key, value in {"stream": "retained", **options}.items():
                reader = reader.option(key, value)
            return reader.load()

        rows = read(numPartitions="3").orderBy("seq").collect()
        assert [r.seq for r in rows] == list(range(1, 31))
        first = rows[0]
        assert first.body == b"m0" and first.channel == "orders.eu" and first.subject == "created"
        assert first.content_type == "text/plain" and first.published_at is not None
        paid_audit = read(channels="audit, x", subjects="paid")
        assert _seqs(paid_audit) == [s for s in range(1, 31) if (s - 1) % 6 == 5]
        assert _seqs(read(startingOffsets="5", endingOffsets="8")) == [5, 6, 7]

        out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
        query = run_available_now(stream(maxMessagesPerTrigger="7"), out, checkpoint)
        assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [
            7,
            7,
            7,
            7,
            2,
        ]
        assert _seqs(spark.read.parquet(str(out))) == list(range(1, 31))

        # The server's explicit markers carry failOnDataLoss over HTTP.
        os.unlink(PubSubPaths.under(str(server.root)).retained_entry(10))
        with pytest.raises(Exception, match="retained entry 10 is missing"):
            read().collect()
        assert _seqs(read(failOnDataLoss="false")) == [s for s in range(1, 31) if s != 10]
    finally:
        server.stop()


# -- the driver's head probe ----------------------------------------------------------------------
def test_log_head_probes_without_listing(hub: PubSub, monkeypatch: pytest.MonkeyPatch) -> None:
    _publish(hub, 3)
    head = LogHead(PubSubPaths.under(_root(hub)).retained)
    assert head.head == 3
    listings = []
    real_listdir = os.listdir
    monkeypatch.setattr(
        os, "listdir", lambda path: listings.append(path) or real_listdir(path), raising=True
    )
    for _ in range(100):  # idle: a stat or two per call
        assert head.current() == 3
    _publish(hub, 37)
    assert head.current() == 40  # found by galloping from 4
    assert head.current() == 40
    assert listings == []
    # A hole ahead of the head, made while idle: the directory's mtime moved, so it is listed.
    time.sleep(0.05)  # into a later tick of the filesystem's (coarse) clock
    _publish(hub, 5)
    os.unlink(PubSubPaths.under(_root(hub)).retained_entry(41))
    assert head.current() == 45
    assert len(listings) == 1


def test_an_empty_or_missing_log_is_empty(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "bare"
    root.mkdir()
    df = spark.read.format("dirmq").option("path", str(root)).option("stream", "retained").load()
    assert df.count() == 0
    with pytest.raises(Exception, match="not a directory"):
        spark.read.format("dirmq").option("path", str(tmp_path / "nope")).option(
            "stream", "retained"
        ).load().collect()
