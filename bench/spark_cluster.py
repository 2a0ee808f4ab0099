"""A Spark standalone cluster on loopback, and a url-mode run of the dirmq source on it.

A master and N workers are started with `spark-class` (pyspark's own launcher), bound to
127.0.0.1 with small memory, and stopped by PID. The executors reach dirmq only over HTTP (the
source's `url` mode, what a cluster without a shared filesystem uses); they import dirmq from
this checkout's `src` (PYTHONPATH in the workers' environment and `spark.executorEnv`).

`run_on_cluster` drives one run in its own Python process (a driver of its own: a test session's
local SparkSession cannot share the JVM): a batch read (a snapshot of the queue, paged over HTTP)
and a streaming read (Trigger.AvailableNow) into parquet, timed. It is used by
`tests/test_spark_cluster.py` (which checks every message arrived exactly once) and by
`bench.spark --cluster`.

    python -m bench.spark_cluster drive MASTER URL QUEUE OUT CHECKPOINT STATE [MAX_PER_BATCH]
    python -m bench.spark_cluster drive-floor MASTER COUNT OUT

`drive-floor` is the same run with a source that has no queue behind it
(`sparkfloor/dirmq_bench_floor.py`): Spark's own part of a url-mode run. `critical_syscalls`
times, in a bare loop, what dirmq's contracts add to it that nothing can overlap (leasing the
first batch, acknowledging the last): with Spark alone, the benchmark's design floor.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import HOST, REPO
from bench.harness.procs import Processes
from bench.harness.servers import start_dirmq

SRC = REPO / "src"
FLOOR = Path(__file__).resolve().parent / "sparkfloor"  # the queue-less source, for the floor
START_TIMEOUT_S = 90.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _env() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(REPO), str(FLOOR), *([path] if path else [])]),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_HOME": str(spark_home()),
        "SPARK_DAEMON_MEMORY": "256m",
        # No REST submission server (its port is fixed), no daemon web UIs on fixed ports.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    }


@dataclass
class SparkCluster:
    """A master and its workers, each a `spark-class` process we started (stopped by PID)."""

    master_url: str
    processes: list[subprocess.Popen[bytes]]
    logs: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        for proc in reversed(self.processes):  # workers first: they stop their executors
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(
            f"== {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
            for log in self.logs
            if log.exists()
        )


def _spawn(args: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:  # the child keeps its own descriptor
        return subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=_env(),
            start_new_session=True,  # a Ctrl-C of the test run does not reach the JVMs first
        )


def _wait_for(log: Path, pattern: str, proc: subprocess.Popen[bytes]) -> re.Match[str]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    raise RuntimeError(f"{log.name}: no {pattern!r}:\n{log.read_text(errors='replace')[-3000:]}")


def start_cluster(
    workdir: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> SparkCluster:
    """A master on 127.0.0.1 (a free port) and `workers` workers of `cores` cores and `memory`
    each, registered with it."""
    workdir.mkdir(parents=True, exist_ok=True)
    master_log = workdir / "master.log"
    master = _spawn(
        [
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
        ],
        master_log,
        workdir,
    )
    cluster = SparkCluster("", [master], [master_log])
    try:
        port = _wait_for(master_log, r"Starting Spark master at spark://127\.0\.0\.1:(\d+)", master)
        cluster.master_url = f"spark://127.0.0.1:{port.group(1)}"
        for n in range(workers):
            log = workdir / f"worker-{n}.log"
            worker_dir = workdir / f"worker-{n}"
            worker_dir.mkdir(exist_ok=True)
            cluster.logs.append(log)
            cluster.processes.append(
                _spawn(
                    [
                        "org.apache.spark.deploy.worker.Worker",
                        *("--host", "127.0.0.1", "--webui-port", "0"),
                        *("--cores", str(cores), "--memory", memory),
                        *("--work-dir", str(worker_dir)),
                        cluster.master_url,
                    ],
                    log,
                    workdir,
                )
            )
        for proc, log in zip(cluster.processes[1:], cluster.logs[1:], strict=True):
            _wait_for(log, r"Successfully registered with master", proc)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def run_on_cluster(
    cluster: SparkCluster,
    url: str,
    queue: str,
    out: Path,
    workdir: Path,
    timeout_s: float = 600.0,
    max_per_batch: int | None = None,
) -> dict[str, Any]:
    """Run `drive` in a driver process of its own; its timings (JSON). `out`: the parquet sink
    of the streaming read."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = [
        "drive",
        *(cluster.master_url, url, queue, str(out)),
        *(str(workdir / "checkpoint"), str(workdir / "state")),
        *([] if max_per_batch is None else [str(max_per_batch)]),
    ]
    return _run_driver(cluster, args, workdir, timeout_s)


def _run_driver(
    cluster: SparkCluster, command: list[str], workdir: Path, timeout_s: float
) -> dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "bench.spark_cluster", *command]
    done = subprocess.run(
        args,
        check=False,
        capture_output=True,
        text=True,
        env=_env(),
        timeout=timeout_s,
        cwd=workdir,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the driver failed ({done.returncode}):\n{done.stderr[-6000:]}\n" + cluster.log_tail()
        )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def measure(base: Path, count: int, max_per_batch: int | None = None) -> dict[str, Any]:
    """One url-mode run on a fresh cluster and server: `count` messages (~100 bytes), a batch
    read and a streaming read of them; the driver's timings, rates, and whether every message
    arrived exactly once and the queue is empty."""
    from dirmq.client import RemoteStore

    procs = Processes()
    cluster = None
    try:
        env = {"PYTHONPATH": _env()["PYTHONPATH"]}  # this checkout's dirmq, as the executors'
        server = start_dirmq(procs, str(base / "root"), 1, "spark-cluster", env=env)
        url = f"http://{HOST}:{server.port}"
        with RemoteStore(url) as remote:
            queue = remote.create_queue("events")
            for start in range(0, count, 1000):
                end = min(count, start + 1000)
                queue.put_many(
                    [b'{"event": %d, "pad": "%s"}' % (i, b"x" * 70) for i in range(start, end)]
                )
            cluster = start_cluster(base / "cluster")
            result = run_on_cluster(
                cluster, url, "events", base / "out", base / "driver", max_per_batch=max_per_batch
            )
            import pyarrow.parquet as pq

            ids = pq.read_table(base / "out", columns=["id"]).column("id").to_pylist()
            result["delivered"] = len(ids)
            result["duplicates"] = len(ids) - len(set(ids))
            result["left_in_queue"] = queue.stats().total
    finally:
        if cluster is not None:
            cluster.stop()
        procs.stop_all()
    result["stream_msgs_per_s"] = count / result["stream_s"]
    result["batch_rows_per_s"] = count / result["batch_s"]
    return result


def measure_floor(base: Path, count: int) -> dict[str, Any]:
    """The same run with no queue behind it (`sparkfloor/dirmq_bench_floor.py`): a fresh
    cluster, a batch read of `count` rows, then a streaming read of them into parquet in the
    micro-batches the dirmq source plans. Spark's own part of a url-mode run."""
    cluster = start_cluster(base / "cluster")
    try:
        result = _run_driver(
            cluster,
            ["drive-floor", cluster.master_url, str(count), str(base / "out")],
            base / "driver",
            600.0,
        )
    finally:
        cluster.stop()
    import pyarrow.parquet as pq

    ids = pq.read_table(base / "out", columns=["id"]).column("id").to_pylist()
    result["delivered"] = len(ids)
    result["duplicates"] = len(ids) - len(set(ids))
    result["left_in_queue"] = 0
    result["stream_msgs_per_s"] = count / result["stream_s"]
    result["batch_rows_per_s"] = count / result["batch_s"]
    return result


def critical_syscalls(base: Path, count: int) -> dict[str, Any]:
    """The least a queue that keeps dirmq's contracts adds to Spark's own run (`measure_floor`):
    the syscalls its critical path cannot overlap, in a bare loop on this filesystem. Before
    the first batch's rows reach Spark each of its messages is leased (a rename into a
    `leased` directory) and read (open, read, close); after Spark commits the last batch each
    of its messages is acknowledged (a rename out of it). One process, as the server; no
    HTTP, index, lock, checksum or record. The batch sizes are the source's plan for `count`
    (`dirmq_bench_floor.batch_sizes`); the files are as large as the run's message files."""
    import shutil

    if str(FLOOR) not in sys.path:
        sys.path.append(str(FLOOR))
    from dirmq_bench_floor import batch_sizes, body

    from dirmq.store import codec

    sizes = batch_sizes(count)
    first, last = sizes[0], sizes[-1]
    directory = base / "syscalls"
    dirs = [directory / d for d in ("ready", "leased", "pool")]
    for d in dirs:
        d.mkdir(parents=True)
    try:
        names = [f"{i:016d}-000000000000" for i in range(first)]
        for i, name in enumerate(names):
            (dirs[0] / name).write_bytes(codec.encode(body(i), {}, message_id=name))
        os.sync()  # the writes' flushing is no part of either loop
        ready, leased, pool = (os.open(d, os.O_RDONLY) for d in dirs)
        try:
            began = time.perf_counter()
            for name in names:
                os.rename(name, name + ".1", src_dir_fd=ready, dst_dir_fd=leased)
                fd = os.open(name + ".1", os.O_RDONLY, dir_fd=leased)
                try:
                    os.read(fd, 64 * 1024)
                finally:
                    os.close(fd)
            leasing = time.perf_counter() - began
            began = time.perf_counter()
            for name in names[:last]:
                os.rename(name + ".1", name, src_dir_fd=leased, dst_dir_fd=pool)
            acking = time.perf_counter() - began
        finally:
            for fd in (ready, leased, pool):
                os.close(fd)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {"first_batch": first, "last_batch": last, "lease_s": leasing, "ack_s": acking}


def stream_phases(progress: list[dict[str, Any]], began: float, ended: float) -> dict[str, Any]:
    """Where a streaming run's time went, from the query's progress reports: each trigger's
    `durationMs` (Spark's phases: latestOffset, getBatch, queryPlanning, walCommit, addBatch,
    commitOffsets, triggerExecution), the time from `start()` to the first trigger, and from
    the end of the last trigger to the end of the query. `began`, `ended`: epoch seconds."""
    from datetime import datetime

    triggers = []
    for p in progress:
        at = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
        triggers.append(
            {
                "batch": p["batchId"],
                "rows": p["numInputRows"],
                "starts_s": round(at - began, 3),
                "ms": p["durationMs"],
            }
        )
    first = triggers[0]["starts_s"] if triggers else None
    last_end = (
        triggers[-1]["starts_s"] + triggers[-1]["ms"].get("triggerExecution", 0) / 1000
        if triggers
        else None
    )
    return {
        "before_first_trigger_s": first,
        "after_last_trigger_s": None if last_end is None else round(ended - began - last_end, 3),
        "triggers": triggers,
    }


def _session(master: str, source: type) -> tuple[Any, dict[str, Any]]:
    """A session on the cluster at `master` with the data source `source` registered, and the
    result so far (how long the session took to start)."""
    from pyspark.sql import SparkSession

    started = time.perf_counter()
    spark = (
        SparkSession.builder.master(master)
        .appName("dirmq-cluster")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", os.environ["PYTHONPATH"])
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(source)
    return spark, {"startup_s": time.perf_counter() - started}


def _timed_runs(snapshot: Any, stream: Any, out: str, checkpoint: str) -> dict[str, Any]:
    """A batch `count()` of `snapshot`, then `stream` into parquet at `out` (AvailableNow),
    timed from `start()` to the end of `awaitTermination()`."""
    result: dict[str, Any] = {}
    began = time.perf_counter()
    row = snapshot.selectExpr("count(*) AS n", "count(DISTINCT id) AS ids").collect()[0]
    result |= {"batch_rows": row.n, "batch_ids": row.ids}
    result["batch_s"] = time.perf_counter() - began
    began = time.perf_counter()
    began_wall = time.time()
    query = (
        stream.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    result["stream_s"] = time.perf_counter() - began
    result["stream_batches"] = len(query.recentProgress)
    result["stream_rows"] = sum(p["numInputRows"] for p in query.recentProgress)
    ended_wall = time.time()
    result["stream_phases"] = stream_phases(query.recentProgress, began_wall, ended_wall)
    result["stream_wall"] = [began_wall, ended_wall]
    return result


def drive(
    master: str,
    url: str,
    queue: str,
    out: str,
    checkpoint: str,
    state: str,
    max_per_batch: str | None = None,
) -> dict[str, Any]:
    """The driver: a batch read of the whole queue (count and distinct ids), then a streaming
    read of it into parquet at `out` (AvailableNow; `max_per_batch`: the source's
    maxMessagesPerBatch, else its default)."""
    from dirmq.spark import DirmqDataSource

    spark, result = _session(master, DirmqDataSource)
    try:
        snapshot = spark.read.format("dirmq").option("url", url).option("queue", queue).load()
        stream = (
            spark.readStream.format("dirmq")
            .option("url", url)
            .option("queue", queue)
            .option("consumer", "cluster")
            .option("stateDir", state)
            .options(**({} if max_per_batch is None else {"maxMessagesPerBatch": max_per_batch}))
            .load()
        )
        result |= _timed_runs(snapshot, stream, out, checkpoint)
    finally:
        spark.stop()
    return result


def drive_floor(master: str, count: str, out: str) -> dict[str, Any]:
    """`drive` with the queue-less source (`dirmq_bench_floor`) in place of dirmq's."""
    from dirmq_bench_floor import FloorDataSource

    spark, result = _session(master, FloorDataSource)
    try:
        snapshot = spark.read.format("dirmqfloor").option("messages", count).load()
        stream = spark.readStream.format("dirmqfloor").option("messages", count).load()
        result |= _timed_runs(snapshot, stream, out, out + ".checkpoint")
    finally:
        spark.stop()
    return result


if __name__ == "__main__":
    if len(sys.argv) in (8, 9) and sys.argv[1] == "drive":
        print(json.dumps(drive(*sys.argv[2:])), flush=True)
    elif len(sys.argv) == 5 and sys.argv[1] == "drive-floor":
        print(json.dumps(drive_floor(*sys.argv[2:])), flush=True)
    else:
        sys.exit(__doc__)
