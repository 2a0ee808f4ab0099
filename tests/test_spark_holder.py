"""The lease on a streaming consumer name (`dirmq.spark.holder`), without Spark: one holder at a
time, a live holder refused with its details, a released or dead one taken over, a superseded
one told it lost the name. (The same through real Spark queries is in test_spark.py.)"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from dirmq.errors import ConsumerBusy
from dirmq.spark.holder import record_path, take
from dirmq.store.filemodes import PRIVATE, Access
from dirmq.store.processes import ProcessIdentity, current, host_tag

from .support.procs import dead_pid

ACCESS = Access.named(PRIVATE)
LABEL = "consumer 'etl' of queue 'events'"


def _plant(consumer_dir: Path, generation: int, host: str, pid: int, age_s: float) -> None:
    """A holder record as another query would have written it, last renewed `age_s` ago."""
    path = record_path(str(consumer_dir), generation)
    os.makedirs(consumer_dir, exist_ok=True)
    process = ProcessIdentity(host_tag(host), current().pid_ns, pid, 0).token()
    record = {"process": process, "host": host, "pid": pid, "token": "theirs", "timeout_s": 30.0}
    Path(path).write_text(json.dumps(record))
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))


def test_a_held_name_is_refused_with_who_holds_it_and_what_to_do(tmp_path: Path) -> None:
    hold = take(str(tmp_path), LABEL, 30.0, ACCESS)
    with pytest.raises(ConsumerBusy) as refused:
        take(str(tmp_path), LABEL, 30.0, ACCESS, grace_s=0.0)
    message = str(refused.value)
    assert LABEL in message and f"pid {os.getpid()}" in message
    assert "stop that query first" in message and "another `consumer` name" in message
    hold.release()
    again = take(str(tmp_path), LABEL, 30.0, ACCESS)  # released: free at once
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(again.path)]  # older ones removed
    assert again.renew()


def test_a_start_waits_briefly_for_a_holder_on_this_host_that_is_stopping(
    tmp_path: Path,
) -> None:
    hold = take(str(tmp_path), LABEL, 30.0, ACCESS)
    releaser = threading.Timer(0.5, hold.release)  # a query whose stop() is still running
    releaser.start()
    try:
        take(str(tmp_path), LABEL, 30.0, ACCESS, grace_s=60.0)
    finally:
        releaser.join()


def test_a_holder_that_stopped_renewing_is_taken_over(tmp_path: Path) -> None:
    _plant(tmp_path, 7, "elsewhere", 1, age_s=31.0)  # past its 30 s timeout
    hold = take(str(tmp_path), LABEL, 30.0, ACCESS)
    assert hold.path == record_path(str(tmp_path), 8)


def test_a_holder_on_another_host_that_renews_keeps_the_name(tmp_path: Path) -> None:
    _plant(tmp_path, 3, "elsewhere", 1, age_s=5.0)
    with pytest.raises(ConsumerBusy, match="host elsewhere"):
        take(str(tmp_path), LABEL, 30.0, ACCESS)


def test_a_holder_whose_process_is_gone_is_taken_over_at_once(tmp_path: Path) -> None:
    import socket

    _plant(tmp_path, 2, socket.gethostname(), dead_pid(), age_s=0.0)
    take(str(tmp_path), LABEL, 30.0, ACCESS)


def test_a_superseded_holder_learns_it_lost_the_name(tmp_path: Path) -> None:
    hold = take(str(tmp_path), LABEL, 30.0, ACCESS)
    _plant(tmp_path, 2, "elsewhere", 1, age_s=0.0)  # another query judged this one dead
    assert not hold.renew()
    with pytest.raises(ConsumerBusy, match="taken over by another query"):
        hold.check()


def test_of_queries_starting_at_once_exactly_one_takes_the_name(tmp_path: Path) -> None:
    _plant(tmp_path, 1, "elsewhere", 1, age_s=100.0)  # a stale holder, for all of them at once
    barrier = threading.Barrier(8)
    won: list[str] = []
    refused: list[ConsumerBusy] = []

    def start() -> None:
        barrier.wait()
        try:
            won.append(take(str(tmp_path), LABEL, 30.0, ACCESS, grace_s=0.0).path)
        except ConsumerBusy as exc:
            refused.append(exc)

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(refused) == 7


# -- through the stream reader (the driver's side, in this process) -----------------------------
def test_a_stream_reader_takes_the_name_at_start_and_stops_planning_once_it_lost_it(
    tmp_path: Path,
) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    import dirmq
    from dirmq.spark import connect
    from dirmq.spark.options import parse_options
    from dirmq.spark.stream import DirmqStreamReader

    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        store.create_queue("jobs").put_many([b"a", b"b"])
    options = {"path": str(root), "queue": "jobs", "consumer": "c"}
    first = DirmqStreamReader(parse_options(options))
    second = DirmqStreamReader(parse_options(options))
    try:
        start = first.initialOffset()
        with pytest.raises(ConsumerBusy, match="consumer 'c' of queue 'jobs' is held"):
            second.initialOffset()
        hold = first._driver().hold
        generation = int(os.path.basename(hold.path).split(".")[1])
        _plant(Path(os.path.dirname(hold.path)), generation + 1, "elsewhere", 1, age_s=0.0)
        hold.renew()  # the upkeep's next beat finds the newer holder
        with pytest.raises(ConsumerBusy, match="taken over by another query"):
            first.latestOffset(start, ReadAllAvailable())
    finally:
        first.stop()
        second.stop()
        connect.close_all()
