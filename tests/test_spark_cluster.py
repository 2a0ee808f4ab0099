"""The Spark source's `url` mode on a real Spark standalone cluster: a master and two workers
on loopback (`bench.spark_cluster`), executors that reach the queue only through a real
`dirmq serve`. A batch read sees all of a 26,000-message queue (more than 1000: paged), and a
streaming read delivers every message exactly once and empties the queue (over 25,000: two
partitions; over 10,000: the first micro-batch takes at most half).

The driver runs in a process of its own (the suite's local SparkSession holds this process's
JVM). Heavy (six JVMs): about a minute on 2 busy cores.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")  # an install without the `spark` extra skips this module

import pyarrow.parquet as pq
from bench import spark_cluster

from dirmq.client import RemoteStore

from .support.servers import start_server

MESSAGES = 26_000  # see the docstring: each number it is above is a path taken


@pytest.mark.timeout(300)
def test_url_mode_on_a_standalone_cluster_delivers_every_message_once(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root")
    cluster = None
    try:
        with RemoteStore(server.url) as remote:
            queue = remote.create_queue("events")
            ids: list[str] = []
            for start in range(0, MESSAGES, 1000):
                ids += queue.put_many([b'{"n": %d}' % n for n in range(start, start + 1000)])
            cluster = spark_cluster.start_cluster(tmp_path / "cluster")
            began = time.monotonic()
            result = spark_cluster.run_on_cluster(
                cluster, server.url, "events", tmp_path / "out", tmp_path / "driver"
            )
            elapsed = time.monotonic() - began
            print(f"cluster run {elapsed:.1f} s: {result}")  # shown with -s: the msg/s reached
            assert result["batch_rows"] == MESSAGES
            assert result["batch_ids"] == MESSAGES
            delivered = pq.read_table(tmp_path / "out", columns=["id", "body"])
            delivered_ids = delivered.column("id").to_pylist()
            assert len(delivered_ids) == MESSAGES  # no duplicates
            assert set(delivered_ids) == set(ids)  # none missing, none foreign
            bodies = set(delivered.column("body").to_pylist())
            assert bodies == {b'{"n": %d}' % n for n in range(MESSAGES)}
            stats = queue.stats()
            assert stats.total == 0, stats  # every message acknowledged
    finally:
        if cluster is not None:
            cluster.stop()
        server.stop()


def test_the_design_floor_times_the_plans_first_lease_and_last_ack_in_a_bare_loop(
    tmp_path: Path,
) -> None:
    """`python -m bench.spark --cluster`'s design floor: the syscalls of leasing the source's first
    batch and acknowledging its last, for the plan of the run's size, and nothing left behind."""
    result = spark_cluster.critical_syscalls(tmp_path, 4_000)
    assert (result["first_batch"], result["last_batch"]) == (2_000, 1_000)
    assert result["lease_s"] > 0 and result["ack_s"] > 0
    assert list(tmp_path.iterdir()) == []
