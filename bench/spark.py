"""Spark benchmark: the dirmq data source against Spark's built-in binaryFile source.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.spark                  # full run (200,000 messages): 15-25 min
    .venv/bin/python -m bench.spark --quick          # smoke run, about a minute
    .venv/bin/python -m bench.spark --dir /dev/shm   # queues and files on tmpfs
    .venv/bin/python -m bench.spark --cluster        # url mode on a standalone cluster, ~4 min

It needs the `spark` extra (pyspark 4.x, pyarrow) and Java 17, prints a table and writes JSON
(default `bench/results/spark.json`). One local[2] SparkSession serves every measurement; both
sources are warmed up once before the timed runs, and trials of the subjects alternate.

What is measured, with the same N small messages (~100-byte JSON events) each time:
1. streaming end-to-end into parquet, Trigger.AvailableNow, timed from `start()` to the end of
   the query: dirmq (a queue of N messages, leased, written, acknowledged: the queue is empty at
   the end) against binaryFile (a directory of N files), with Spark's default settings and with
   `spark.sql.files.openCostInBytes` lowered so that small files pack into few partitions; and
   dirmq again with three declared columns (`id`, `body`, `published_at`: what binaryFile's
   `path`, `content` and `modificationTime` are to a file), which spares building the rest;
2. batch reads: `count()` and a parquet write of a dirmq snapshot against binaryFile's `count()`,
   and a batch write of the same rows back into a queue;
3. the ceiling the store sets: two plain Python processes leasing and acknowledging the same N
   messages, no Spark involved: as any consumer does (`get(1000)` + `ack_many`, both processes
   racing for the head of the queue), and as the streaming source does (one listing, each
   process leasing its own slice by name, `claim_named` + `ack_leases`).

N is 200,000 by default: a streaming query pays ~2 s of fixed costs (start-up, the first listing,
the last acknowledgement), and the report gives both the end-to-end rate and the rate inside
micro-batches.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from bench.harness import RESULTS
from bench.harness.rounds import median
from dirmq import Durability, QueueConfig, Store

DEFAULT_JSON = RESULTS / "spark.json"
DEFAULT_CLUSTER_JSON = DEFAULT_JSON.with_name("spark-cluster.json")
TARGET_STREAM = 25_000
TARGET_BATCH = 50_000
CLUSTER_URL_BEFORE = 940  # msg/s, url mode on a standalone cluster before issue 18


def body(i: int) -> bytes:
    return b'{"event": %d, "user": "u%d", "amount": %d.25, "kind": "click", "pad": "%s"}' % (
        i,
        i % 97,
        i % 1000,
        b"x" * 16,
    )


# -- fixtures -------------------------------------------------------------------------------------
def fill_queue(root: Path, count: int) -> None:
    with Store(root) as store:
        queue = store.create_queue("events", QueueConfig(durability=Durability.WRITEBACK))
        for start in range(0, count, 1000):
            queue.put_many([body(i) for i in range(start, min(count, start + 1000))])
    os.sync()


def fill_files(directory: Path, count: int) -> None:
    directory.mkdir(parents=True)
    for i in range(count):
        (directory / f"m{i:09d}").write_bytes(body(i))
    os.sync()


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from dirmq.spark import DirmqDataSource

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("dirmq-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(DirmqDataSource)
    return spark


# -- measurements ---------------------------------------------------------------------------------
NARROW = "id string, body binary, published_at timestamp"  # binaryFile's path, content, mtime


def stream_dirmq(spark: Any, base: Path, count: int, schema: str | None = None) -> dict[str, Any]:
    """`schema`: the columns the query declares (all eight when None)."""
    root = base / "dirmq"
    fill_queue(root, count)
    reader = spark.readStream.format("dirmq")
    if schema is not None:
        reader = reader.schema(schema)
    started = time.perf_counter()
    query = (
        reader.option("path", str(root))
        .option("queue", "events")
        .option("consumer", "bench")
        .load()
        .writeStream.format("parquet")
        .option("path", str(base / "dirmq-out"))
        .option("checkpointLocation", str(base / "dirmq-ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    elapsed = time.perf_counter() - started
    rows = spark.read.parquet(str(base / "dirmq-out")).count()
    with Store(root) as store:
        left = store.queue("events").stats().total
    assert rows == count and left == 0, (rows, left)
    return _result(count, elapsed, query.recentProgress)


def stream_binary_files(
    spark: Any, base: Path, count: int, open_cost: str | None
) -> dict[str, Any]:
    source = base / "files"
    fill_files(source, count)
    default_cost = spark.conf.get("spark.sql.files.openCostInBytes")
    if open_cost is not None:
        spark.conf.set("spark.sql.files.openCostInBytes", open_cost)
    try:
        schema = spark.read.format("binaryFile").load(str(source)).schema
        started = time.perf_counter()
        query = (
            spark.readStream.format("binaryFile")
            .schema(schema)
            .load(str(source))
            .writeStream.format("parquet")
            .option("path", str(base / "files-out"))
            .option("checkpointLocation", str(base / "files-ck"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        elapsed = time.perf_counter() - started
    finally:
        spark.conf.set("spark.sql.files.openCostInBytes", default_cost)
    assert spark.read.parquet(str(base / "files-out")).count() == count
    return _result(count, elapsed, query.recentProgress)


def batch_dirmq(spark: Any, base: Path, count: int) -> dict[str, Any]:
    root = base / "dirmq"
    fill_queue(root, count)
    with Store(root) as store:
        store.create_queue("warm").put_many([body(i) for i in range(1000)])
    # Spark stops Python workers that sat idle (the binaryFile trials use none): the first read
    # after a minute without one ran at half speed (51,000 against 96,000 rows/s measured
    # alone). An untimed read of a small queue starts them, as any running job would have.
    assert (
        spark.read.format("dirmq").option("path", str(root)).option("queue", "warm").load().count()
        == 1000
    )
    reader = spark.read.format("dirmq").option("path", str(root)).option("queue", "events")
    started = time.perf_counter()
    assert reader.load().count() == count
    counted = time.perf_counter() - started
    started = time.perf_counter()
    reader.load().write.parquet(str(base / "snapshot"))
    written = time.perf_counter() - started
    with Store(root) as store:
        assert store.queue("events").stats().ready == count  # nothing consumed
        store.create_queue("copy", QueueConfig(durability=Durability.WRITEBACK))
    bodies = spark.read.parquet(str(base / "snapshot")).select("body").cache()
    bodies.count()
    started = time.perf_counter()
    bodies.write.format("dirmq").option("path", str(root)).option("queue", "copy").mode(
        "append"
    ).save()
    published = time.perf_counter() - started
    bodies.unpersist()
    with Store(root) as store:
        assert store.queue("copy").stats().ready == count
    return {
        "count_rows_per_s": count / counted,
        "parquet_rows_per_s": count / written,
        "write_rows_per_s": count / published,
    }


def batch_binary_files(spark: Any, base: Path, count: int) -> dict[str, Any]:
    source = base / "files"
    fill_files(source, count)
    started = time.perf_counter()
    assert spark.read.format("binaryFile").load(str(source)).count() == count
    return {"count_rows_per_s": count / (time.perf_counter() - started)}


def _consume(root: str) -> int:
    with Store(root) as store:
        queue = store.queue("events")
        done = 0
        for _ in range(10_000_000):  # bounded: far more rounds than messages / 1000
            got = queue.get(1000, visibility_s=600)
            if not got:
                return done
            queue.ack_many([message.receipt or "" for message in got])
            done += len(got)
        return done


def store_ceiling(base: Path, count: int, processes: int) -> dict[str, Any]:
    root = base / "dirmq"
    fill_queue(root, count)
    started = time.perf_counter()
    with get_context("spawn").Pool(processes) as pool:
        done = sum(pool.map(_consume, [str(root)] * processes))
    elapsed = time.perf_counter() - started
    assert done == count
    return {"msgs_per_s": count / elapsed, "seconds": elapsed}


def _consume_named(root: str, names: list[str]) -> int:
    with Store(root) as store:
        queue = store.queue("events")
        done = 0
        for start in range(0, len(names), 1000):
            # `drain`: the whole share, as the source tells it (its acks keep what they free)
            chunk = names[start : start + 1000]
            got = queue.claim_named(chunk, visibility_s=600, drain=len(names))
            assert not queue.ack_leases([lease for lease, _ in got])
            done += len(got)
        return done


def store_ceiling_named(base: Path, count: int, processes: int) -> dict[str, Any]:
    """What the streaming source does, without Spark: one planner lists the ready names, each
    process leases its own slice by name and acknowledges by lease name."""
    root = base / "dirmq"
    fill_queue(root, count)
    started = time.perf_counter()
    with Store(root) as store:
        names = store.queue("events").ready_names()
    slices = [
        names[i * len(names) // processes : (i + 1) * len(names) // processes]
        for i in range(processes)
    ]
    with get_context("spawn").Pool(processes) as pool:
        done = sum(pool.starmap(_consume_named, [(str(root), part) for part in slices]))
    elapsed = time.perf_counter() - started
    assert done == count
    return {"msgs_per_s": count / elapsed, "seconds": elapsed}


def _result(count: int, elapsed: float, progress: list[dict[str, Any]]) -> dict[str, Any]:
    busy = [p for p in progress if p["numInputRows"]]
    in_batches_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in busy)
    return {
        "msgs_per_s": count / elapsed,
        "seconds": elapsed,
        "batches": len(busy),
        "in_batch_msgs_per_s": count / (in_batches_ms / 1000) if in_batches_ms else None,
    }


# -- running --------------------------------------------------------------------------------------
def trial(where: Path, run: Callable[[Path], dict[str, Any]]) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix="dirmq-spark-bench-", dir=where))
    try:
        return run(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def median_at(results: list[dict[str, Any]], key: str) -> float:
    """The median of `key` over the trials that ran it (NaN if none did: --only)."""
    return median(r[key] for r in results if r.get(key) is not None)


def _cluster_summary(result: dict[str, Any]) -> str:
    """One trial of `cluster_main` in a line: the streaming run and where its time went (the
    JSON has each trigger's phases)."""
    phases = result["stream_phases"]
    triggers = ", ".join(
        f"{t['rows']:,} rows {t['ms'].get('triggerExecution', 0) / 1000:.2f} s"
        for t in phases["triggers"]
    )
    return (
        f"streaming {result['stream_s']:.2f} s = {result['stream_msgs_per_s']:,.0f} msg/s "
        f"(first trigger at {phases['before_first_trigger_s']:.2f} s; {triggers}; "
        f"{phases['after_last_trigger_s']:.2f} s after the last); batch count() "
        f"{result['batch_s']:.2f} s; delivered {result['delivered']:,}, duplicates "
        f"{result['duplicates']}, left in the queue {result['left_in_queue']}"
    )


def _design_floor(syscalls: dict[str, Any], count: int, alone: dict[str, Any]) -> dict[str, Any]:
    """The design floor of a url run: Spark alone's run (`alone`) plus the bare syscalls that
    dirmq's contracts put on its critical path (`spark_cluster.critical_syscalls`)."""
    seconds = alone["stream_s"] + syscalls["lease_s"] + syscalls["ack_s"]
    return syscalls | {"stream_s": seconds, "stream_msgs_per_s": count / seconds}


def cluster_main(where: Path, count: int, trials: int, json_path: str) -> int:
    """The url mode on a Spark standalone cluster (`bench.spark_cluster`): a fresh server,
    cluster and driver per trial; the streaming rate is timed from `start()` to the end of the
    AvailableNow query (every message acknowledged), the batch rate is a snapshot `count()`."""
    from bench import spark_cluster as cluster

    results: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    syscalls: list[dict[str, Any]] = []
    for n in range(trials):  # alternating: dirmq, then Spark alone, on fresh clusters
        for subject, measure, into in (
            ("cluster url", cluster.measure, results),
            ("Spark alone", cluster.measure_floor, floors),
        ):
            base = Path(tempfile.mkdtemp(prefix="dirmq-cluster-", dir=where))
            try:
                into.append(measure(base, count))
            finally:
                shutil.rmtree(base, ignore_errors=True)
            print(f"  trial {n + 1} {subject}: {_cluster_summary(into[-1])}", flush=True)
        base = Path(tempfile.mkdtemp(prefix="dirmq-syscalls-", dir=where))
        try:  # on the same disk, right after the Spark-alone trial it completes
            syscalls.append(
                _design_floor(cluster.critical_syscalls(base, count), count, floors[-1])
            )
        finally:
            shutil.rmtree(base, ignore_errors=True)
        last = syscalls[-1]
        print(
            f"  trial {n + 1} design floor: Spark alone + {last['lease_s']:.2f} s leasing the "
            f"first batch ({last['first_batch']:,}) + {last['ack_s']:.2f} s acknowledging the "
            f"last ({last['last_batch']:,}) in a bare loop = {last['stream_s']:.2f} s, "
            f"{last['stream_msgs_per_s']:,.0f} msg/s",
            flush=True,
        )
    stream = median_at(results, "stream_msgs_per_s")
    floor = median_at(floors, "stream_msgs_per_s")
    design = median_at(syscalls, "stream_msgs_per_s")
    once = all(
        r["duplicates"] == 0 and r["delivered"] == count and r["left_in_queue"] == 0
        for r in results + floors
    )
    ratios = ", ".join(
        f"{r['stream_msgs_per_s'] / f['stream_msgs_per_s']:.2f}"
        for r, f in zip(results, floors, strict=True)
    )
    print(
        f"\nurl mode on a standalone cluster, {count:,} messages: streaming {stream:,.0f} msg/s "
        f"end to end ({stream / CLUSTER_URL_BEFORE:.1f}x the {CLUSTER_URL_BEFORE:,} msg/s before "
        f"issue 18), batch count() {median_at(results, 'batch_rows_per_s'):,.0f} rows/s; "
        f"every message delivered exactly once: {once}\n"
        f"Spark alone (the same micro-batches from a source with no queue): {floor:,.0f} msg/s "
        f"({floor / CLUSTER_URL_BEFORE:.1f}x the 940); dirmq / Spark alone per trial: {ratios}\n"
        f"design floor (Spark alone + the critical path's bare syscalls): {design:,.0f} msg/s "
        f"({design / CLUSTER_URL_BEFORE:.1f}x the 940); dirmq / design floor per trial: "
        + ", ".join(
            f"{r['stream_msgs_per_s'] / d['stream_msgs_per_s']:.2f}"
            for r, d in zip(results, syscalls, strict=True)
        )
    )
    out = Path(json_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "messages": count,
        "results": results,
        "spark_alone": floors,
        "design_floor": syscalls,
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"JSON written to {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts, one trial")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where queues/files live")
    parser.add_argument("--messages", type=int, help="messages (and files) per run")
    parser.add_argument(
        "--json",
        help=f"where to write the results (default {DEFAULT_JSON}; with --cluster "
        f"{DEFAULT_CLUSTER_JSON})",
    )
    parser.add_argument(
        "--only", help="comma-separated subjects to run (e.g. batch_dirmq,batch_binaryfile)"
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="only the url mode on a Spark standalone cluster (master + 2 workers on loopback)",
    )
    args = parser.parse_args(argv)
    count = args.messages or (5_000 if args.quick else 200_000)
    trials = 1 if args.quick else 3
    where = Path(args.dir)
    if args.cluster:
        return cluster_main(
            where,
            args.messages or (5_000 if args.quick else 50_000),
            trials,
            args.json or str(DEFAULT_CLUSTER_JSON),
        )

    spark = spark_session()
    print(f"warming up Spark; then {trials} trial(s) of {count} messages under {where}", flush=True)
    # The JVM compiles its hot paths (Arrow intake, the parquet writer) over the first few
    # hundred thousand rows: after a 2,000-row warm-up the first timed dirmq trial ran ~20%
    # slower than the third, and after 50,000 rows still ~10%. So each dirmq subject runs one
    # untimed trial of full size first. binaryFile's trials do not speed up from one to the
    # next (3.3k, 3.0k, 2.8k msg/s in one run): 20,000 files warm it.
    chosen = set(args.only.split(",")) if args.only else None
    warm_ups: list[tuple[str, Callable[[Path], dict[str, Any]]]] = [
        ("stream_dirmq", lambda b: stream_dirmq(spark, b, count)),
        ("stream_dirmq_narrow", lambda b: stream_dirmq(spark, b, count, NARROW)),
        (
            "stream_binaryfile_tuned",
            lambda b: stream_binary_files(spark, b, min(count, 20_000), "8192"),
        ),
        ("batch_dirmq", lambda b: batch_dirmq(spark, b, 2000)),  # the first count(): 19k rows/s
    ]
    for name, warm_up in warm_ups:  # only for the subjects that run (the store's use no Spark)
        if chosen is None or name in chosen:
            trial(where, warm_up)

    results: dict[str, list[dict[str, Any]]] = {
        "stream_dirmq": [],
        "stream_dirmq_narrow": [],
        "stream_binaryfile_tuned": [],
        "stream_binaryfile_default": [],
        "batch_dirmq": [],
        "batch_binaryfile": [],
        "store_ceiling_2proc": [],
        "store_ceiling_named_2proc": [],
    }
    plan: list[tuple[str, Callable[[Path], dict[str, Any]]]] = [
        ("stream_dirmq", lambda b: stream_dirmq(spark, b, count)),
        ("stream_dirmq_narrow", lambda b: stream_dirmq(spark, b, count, NARROW)),
        ("stream_binaryfile_tuned", lambda b: stream_binary_files(spark, b, count, "8192")),
        ("batch_dirmq", lambda b: batch_dirmq(spark, b, count)),
        ("store_ceiling_2proc", lambda b: store_ceiling(b, count, 2)),
        ("store_ceiling_named_2proc", lambda b: store_ceiling_named(b, count, 2)),
    ]
    plan = [(name, run) for name, run in plan if chosen is None or name in chosen]
    for n in range(trials):
        for name, run in plan:
            results[name].append(trial(where, run))
            print(f"  trial {n + 1} {name}: {results[name][-1]}", flush=True)
    once: list[tuple[str, Callable[[Path], dict[str, Any]]]] = [
        ("stream_binaryfile_default", lambda b: stream_binary_files(spark, b, count, None)),
        ("batch_binaryfile", lambda b: batch_binary_files(spark, b, count)),
    ]
    for name, run in once:
        if chosen is not None and name not in chosen:
            continue
        results[name].append(trial(where, run))
        print(f"  {name}: {results[name][-1]}", flush=True)
    spark.stop()

    stream = median_at(results["stream_dirmq"], "msgs_per_s")
    in_batches = median_at(results["stream_dirmq"], "in_batch_msgs_per_s")
    narrow = median_at(results["stream_dirmq_narrow"], "msgs_per_s")
    tuned = median_at(results["stream_binaryfile_tuned"], "msgs_per_s")
    default = median_at(results["stream_binaryfile_default"], "msgs_per_s")
    batch_count = median_at(results["batch_dirmq"], "count_rows_per_s")
    rows = [
        ("streaming into parquet", "dirmq (availableNow, acked)", stream),
        ("", "  of which inside micro-batches", in_batches),
        ("", "dirmq, 3 columns declared", narrow),
        (
            "",
            "  of which inside micro-batches",
            median_at(results["stream_dirmq_narrow"], "in_batch_msgs_per_s"),
        ),
        ("", "binaryFile, openCostInBytes=8192", tuned),
        ("", "binaryFile, Spark defaults", default),
        (
            "store ceiling (no Spark)",
            "2 processes get(1000)+ack_many",
            median_at(results["store_ceiling_2proc"], "msgs_per_s"),
        ),
        (
            "",
            "2 processes, named claims (as Spark)",
            median_at(results["store_ceiling_named_2proc"], "msgs_per_s"),
        ),
        ("batch read", "dirmq count()", batch_count),
        ("", "dirmq -> parquet", median_at(results["batch_dirmq"], "parquet_rows_per_s")),
        ("", "binaryFile count()", median_at(results["batch_binaryfile"], "count_rows_per_s")),
        (
            "batch write",
            "parquet -> dirmq (writeback)",
            median_at(results["batch_dirmq"], "write_rows_per_s"),
        ),
    ]
    print(f"\n{'benchmark':26} {'subject':36} {'msgs/s':>10}")
    for section, subject, value in rows:
        print(f"{section:26} {subject:36} {value:>10,.0f}")
    print(
        f"\nstreaming: {stream:,.0f} msg/s end to end vs target {TARGET_STREAM:,} "
        f"({'met' if stream >= TARGET_STREAM else 'MISSED'}); inside micro-batches "
        f"{in_batches:,.0f} ({'met' if in_batches >= TARGET_STREAM else 'MISSED'}); "
        f"{stream / max(tuned, default):.1f}x the built-in binaryFile source"
    )
    print(
        f"streaming with 3 declared columns ({NARROW}): {narrow:,.0f} msg/s end to end "
        f"({'met' if narrow >= TARGET_STREAM else 'MISSED'})"
    )
    print(
        f"batch read: {batch_count:,.0f} rows/s vs target {TARGET_BATCH:,} "
        f"({'met' if batch_count >= TARGET_BATCH else 'MISSED'})"
    )
    out = Path(args.json or DEFAULT_JSON)
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "dir": str(where),
        "kernel": platform.release(),
    }
    report = {"messages": count, "trials": trials, "machine": machine, "results": results}
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
