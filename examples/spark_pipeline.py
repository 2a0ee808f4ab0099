"""A real pipeline on dirmq and Spark, in one command:

    .venv/bin/python examples/spark_pipeline.py [--root DIR] [--events N]

1. A producer publishes N JSON click events to the queue `shop/events` (the plain dirmq API).
2. A Structured Streaming query (availableNow) reads the queue as the consumer `clicks`, and for
   each micro-batch:
   - parses the JSON and writes the events to parquet, `<root>/lake/events/batch=<id>/` (written
     with overwrite, so a retried batch replaces its own output instead of adding to it);
   - counts clicks and sums amounts per 1-minute event-time window and page, and publishes one
     JSON message per (window, page) to the queue `shop/window-stats`, each with a dedup id made
     of the batch id, window and page (a retried batch does not publish twice).
   Messages are acknowledged on the `shop/events` queue once Spark has committed their batch.
3. A downstream consumer takes the results from `shop/window-stats` and adds up the partial
   counts per window (one per micro-batch that saw events of that window).

Run it again with the same `--root`: the events already consumed are not seen again.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import dirmq

PAGES = ("home", "search", "product", "cart", "checkout")
EVENT_SCHEMA = "event_id LONG, page STRING, amount DOUBLE, ts DOUBLE"


def produce(store: dirmq.Store, count: int) -> None:
    """Publish `count` click events spread over the last five minutes of event time."""
    events = store.create_queue("shop/events")
    now = time.time()
    rng = random.Random()
    batch = []
    for i in range(count):
        event = {
            "event_id": i,
            "page": rng.choice(PAGES),
            "amount": round(rng.uniform(1, 100), 2),
            "ts": now - 300 + 300 * i / count,
        }
        headers = {"Content-Type": "application/json"}
        batch.append(dirmq.OutgoingMessage(json.dumps(event).encode(), headers))
        if len(batch) == 500 or i == count - 1:
            events.put_many(batch)
            batch = []


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from dirmq.spark import DirmqDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dirmq-pipeline")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DirmqDataSource)
    return spark


def run_pipeline(spark: Any, root: Path) -> int:
    """The streaming query; returns how many events it processed."""
    from pyspark.sql import functions as f

    mq = str(root / "mq")

    def each_batch(batch: Any, batch_id: int) -> None:
        # The batch feeds two writes: cached, its messages are read from the queue once (else
        # each write reads them again, and Spark counts every input row twice).
        batch.persist()
        try:
            publish_batch(batch, batch_id)
        finally:
            batch.unpersist()

    def publish_batch(batch: Any, batch_id: int) -> None:
        events = batch.select(
            f.col("id").alias("message_id"),
            f.from_json(f.col("body").cast("string"), EVENT_SCHEMA).alias("e"),
        ).select(
            "message_id",
            "e.event_id",
            "e.page",
            "e.amount",
            f.col("e.ts").cast("timestamp").alias("event_time"),
        )
        events.write.mode("overwrite").parquet(str(root / "lake" / "events" / f"batch={batch_id}"))
        stats = events.groupBy(f.window("event_time", "1 minute"), "page").agg(
            f.count("*").alias("clicks"), f.round(f.sum("amount"), 2).alias("amount")
        )
        start = f.col("window.start").cast("string")
        stats.select(
            f.to_json(f.struct(start.alias("window_start"), "page", "clicks", "amount")).alias(
                "body"
            ),
            f.create_map(f.lit("X-Attr-Page"), f.col("page")).alias("headers"),
            f.lit("application/json").alias("content_type"),
            f.concat_ws("/", f.lit(str(batch_id)), start, f.col("page")).alias("dedup_id"),
        ).write.format("dirmq").option("path", mq).option("queue", "shop/window-stats").option(
            "createQueue", "true"
        ).mode("append").save()

    query = (
        spark.readStream.format("dirmq")
        .option("path", mq)
        .option("queue", "shop/events")
        .option("consumer", "clicks")
        .option("maxMessagesPerTrigger", "5000")
        .load()
        .writeStream.foreachBatch(each_batch)
        .option("checkpointLocation", str(root / "checkpoints" / "clicks"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return sum(p["numInputRows"] for p in query.recentProgress)


def consume(store: dirmq.Store) -> dict[tuple[str, str], list[float]]:
    """The downstream service: take every partial result, add them up per (window, page)."""
    results = store.queue("shop/window-stats")
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    for _ in range(100_000):  # bounded; stops at the first empty get
        got = results.get(100)
        if not got:
            break
        for message in got:
            row = json.loads(message.body)
            total = totals[row["window_start"], row["page"]]
            total[0] += row["clicks"]
            total[1] += row["amount"]
            results.ack(message.receipt or "")
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description="dirmq + Spark pipeline example")
    parser.add_argument(
        "--root", help="working directory, kept (default: a temp directory, removed at the end)"
    )
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    if args.root:
        return run(Path(args.root).resolve(), args.events)
    with tempfile.TemporaryDirectory(prefix="dirmq-pipeline-") as temp:
        return run(Path(temp), args.events)


def run(root: Path, event_count: int) -> int:
    print(f"working under {root}")
    started = time.perf_counter()
    with dirmq.Store(root / "mq") as store:
        produce(store, event_count)
        print(f"published {event_count} events to shop/events")
        spark = spark_session()
        try:
            processed = run_pipeline(spark, root)
            lake = spark.read.parquet(str(root / "lake" / "events")).count()
        finally:
            spark.stop()
        print(f"processed {processed} events; the parquet lake holds {lake} events")
        print(f"left in shop/events: {store.queue('shop/events').stats().total}")
        totals = consume(store)
    print(f"{len(totals)} (window, page) results from shop/window-stats:")
    for (window, page), (clicks, amount) in sorted(totals.items())[:10]:
        print(f"  {window}  {page:9} {int(clicks):6} clicks  {amount:>12,.2f}")
    if len(totals) > 10:
        print(f"  ... and {len(totals) - 10} more")
    print(f"clicks in all windows: {int(sum(c for c, _ in totals.values()))}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
