"""Metrics in one process: the census that the depth gauges read (no queue opened, the counts
`Queue.stats` gives), prometheus-client's multiprocess mode across forked workers (counts
summed, never lost with a worker, live gauges dropped with it), bounded labels and series."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import QueueNotFound
from dirmq.server.contract import Request
from dirmq.server.metrics import MAX_ROUTES, Metrics, worker_restarts
from dirmq.server.multiprocess import MetricsFiles
from dirmq.store.census import census, queue_depth
from dirmq.store.events import DEAD_REASONS
from dirmq.store.processes import HOST_TAG, ProcessIdentity, current

from .support.metrics_helpers import inotify_watches, make_queues, matching, value


def _request(door: str, route: str, method: str = "GET") -> Request:
    request = Request(method, "/x", {}, {}, b"", True)
    request.door, request.route = door, route
    return request


def test_the_census_counts_what_stats_counts_without_opening_the_queue(tmp_path: Path) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root) as store:
        queue = store.create_queue("a/b")
        store.create_queue("a")  # a queue with a child queue
        store.create_queue("empty")
        for body in (b"1", b"2", b"3", b"4", b"5", b"6"):
            queue.put(body)
        queue.put(b"later", delay_s=3600)
        queue.put(b"due", delay_s=0.05)
        held = queue.get(1, visibility_s=3600)  # in flight
        assert len(queue.get(1, visibility_s=0.05)) == 1  # its lease runs out: ready again
        (dead,) = queue.get(1, visibility_s=3600)
        queue.dead_letter(dead.receipt or "")
        assert held
        time.sleep(0.2)
        expected = queue.stats()
    assert (expected.ready, expected.in_flight, expected.delayed, expected.dead) == (5, 1, 1, 1)

    watches = inotify_watches()
    depths = {d.name: d.stats for d in census(root)}
    assert inotify_watches() == watches  # nothing watched, nothing left behind
    assert sorted(depths) == ["a", "a/b", "empty"]
    got = depths["a/b"]
    assert (got.ready, got.in_flight, got.delayed, got.dead) == (5, 1, 1, 1)
    assert expected.oldest_ready_age_s is not None and got.oldest_ready_age_s is not None
    assert abs(got.oldest_ready_age_s - expected.oldest_ready_age_s) < 1.0
    empty = depths["empty"]
    assert (empty.ready, empty.dead, empty.oldest_ready_age_s) == (0, 0, None)
    one = queue_depth(root, "a/b")
    assert (one.ready, one.in_flight, one.delayed, one.dead) == (5, 1, 1, 1)
    with pytest.raises(QueueNotFound):
        queue_depth(root, "absent")


def test_workers_counts_add_up_and_a_dead_workers_counts_stay(
    tmp_path: Path, metrics_files: MetricsFiles
) -> None:
    """Two forked workers bump their own files and exit; a scrape anywhere sums them, and
    marking them dead drops their live gauges, never their counts."""
    root = tmp_path / "root"
    dirmq.Store(root).close()
    pids = []
    for worker in (1, 2):
        pid = os.fork()
        if pid == 0:  # a worker: count, then die without any cleanup
            code = 1
            try:
                metrics = Metrics(metrics_files, str(root), worker=worker)
                for _ in range(100 * worker):
                    metrics.observe(_request("sqs", "SendMessage", "POST"), 200, 10, 0.001)
                metrics.published(7)
                metrics.quarantined("q")
                metrics.pubsub_attached.inc()
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    scraper = Metrics(metrics_files, str(root))
    text = scraper.render().decode()
    labels = {"door": "sqs", "route": "SendMessage", "method": "POST", "status": "200"}
    assert value(text, "dirmq_http_requests_total", **labels) == 300
    assert value(text, "dirmq_messages_published_total") == 14
    assert value(text, "dirmq_messages_corrupt_total", queue="q") == 2
    assert value(text, "dirmq_pubsub_attached_subscriptions") == 2
    histogram = {"door": "sqs", "route": "SendMessage", "method": "POST"}
    assert value(text, "dirmq_http_request_duration_seconds_count", **histogram) == 300
    assert value(text, "dirmq_http_request_duration_seconds_bucket", le="0.001", **histogram) == 300
    for pid in pids:
        metrics_files.process_dead(pid)
    text = scraper.render().decode()
    assert value(text, "dirmq_pubsub_attached_subscriptions") == 0
    assert value(text, "dirmq_http_requests_total", **labels) == 300  # never backwards
    assert value(text, "dirmq_messages_published_total") == 14


def test_failures_of_every_worker_and_the_supervisors_restarts_add_up(
    tmp_path: Path, metrics_files: MetricsFiles
) -> None:
    """Forked workers count nacks and what their Store tells them (dead letters by reason,
    expired leases, redrives); the parent, as the supervisor does, counts restarts in its own
    file, made before the fork. A scrape in any process reads the sums."""
    root = tmp_path / "root"
    dirmq.Store(root).close()
    restarts = worker_restarts()  # the supervisor's, before it forks its workers
    pids = []
    for worker in (1, 2):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                metrics = Metrics(metrics_files, str(root), worker=worker)
                events = metrics.events()
                assert events.dead_lettered and events.leases_expired and events.redriven
                metrics.nacked(3 * worker)
                for reason in DEAD_REASONS:
                    events.dead_lettered("q", reason)
                events.dead_lettered("q", "max-receives")
                events.dead_lettered("q", "no such reason")  # a bounded label all the same
                events.leases_expired("q", 5)
                events.redriven("q", 4 * worker)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    scraper = Metrics(metrics_files, str(root))
    text = scraper.render().decode()
    assert value(text, "dirmq_worker_restarts_total") == 0  # shown before any restart
    restarts.inc()
    restarts.inc()
    for pid in pids:
        metrics_files.process_dead(pid)
    text = scraper.render().decode()
    assert value(text, "dirmq_messages_nacked_total") == 9
    assert value(text, "dirmq_dead_letters_total", reason="max-receives") == 4
    for reason in ("rejected", "unreadable", "ttl-expired"):
        assert value(text, "dirmq_dead_letters_total", reason=reason) == 2
    assert value(text, "dirmq_dead_letters_total", reason="other") == 2
    assert len(matching(text, "dirmq_dead_letters_total")) == len(DEAD_REASONS) + 1
    assert value(text, "dirmq_leases_expired_total") == 10
    assert value(text, "dirmq_messages_redriven_total") == 12
    assert value(text, "dirmq_worker_restarts_total") == 2


def test_metrics_refuse_to_start_outside_multiprocess_mode(tmp_path: Path) -> None:
    files = MetricsFiles(str(tmp_path))  # never activated
    with pytest.raises(RuntimeError, match="MetricsFiles"):
        Metrics(files, str(tmp_path))


def test_request_labels_stay_bounded(tmp_path: Path, metrics_files: MetricsFiles) -> None:
    dirmq.Store(tmp_path / "root").close()
    metrics = Metrics(metrics_files, str(tmp_path / "root"))
    for n in range(MAX_ROUTES + 10):
        metrics.observe(_request("sqs", f"Action{n}"), 200, 0, 0.0)
    metrics.observe(_request("", "", "-"), 400, 0, 0.0)  # refused before any dialect saw it
    metrics.observe(_request("yaq", "dequeue", "PROPFIND"), 405, 0, 0.0)
    text = metrics.render().decode()
    routes = matching(text, "dirmq_http_requests_total", door="sqs")
    assert len(routes) == MAX_ROUTES + 1
    other = {"door": "sqs", "route": "other", "method": "GET", "status": "200"}
    assert value(text, "dirmq_http_requests_total", **other) == 10
    refused = {"door": "none", "route": "none", "method": "other", "status": "400"}
    assert value(text, "dirmq_http_requests_total", **refused) == 1
    webdav = {"door": "yaq", "route": "dequeue", "method": "other", "status": "405"}
    assert value(text, "dirmq_http_requests_total", **webdav) == 1


def test_the_depth_series_are_capped_and_any_queue_is_there_on_demand(
    tmp_path: Path, metrics_files: MetricsFiles
) -> None:
    root = tmp_path / "root"
    names = [f"q{n:02d}" for n in range(30)]
    make_queues(root, names)
    with dirmq.Store(root) as store:
        for n in (3, 17, 25):  # the deepest: n messages each
            store.queue(f"q{n:02d}").put_many([b"m"] * n, durability="writeback")
    metrics = Metrics(metrics_files, str(root), max_queues=5)
    text = metrics.render().decode()
    assert value(text, "dirmq_queues") == 30
    assert value(text, "dirmq_queues_omitted") == 25
    assert value(text, "dirmq_queues_messages", state="ready") == 45
    shown = {
        dict(labels)["queue"] for labels in matching(text, "dirmq_queue_messages", state="ready")
    }
    # The three deep ones, then the first empty ones by name.
    assert shown == {"q03", "q17", "q25", "q00", "q01"}
    assert value(text, "dirmq_queue_messages", queue="q25", state="ready") == 25
    assert value(text, "dirmq_queues_oldest_ready_age_seconds") is not None

    one = metrics.render("q29").decode()
    assert value(one, "dirmq_queue_messages", queue="q29", state="ready") == 0
    assert len(matching(one, "dirmq_queue_messages")) == 4
    assert value(one, "dirmq_queues") is None  # that queue's series, nothing else
    with pytest.raises(QueueNotFound):
        metrics.render("absent")

    none = Metrics(metrics_files, str(root), max_queues=0).render().decode()
    assert matching(none, "dirmq_queue_messages") == {}
    assert value(none, "dirmq_queues_omitted") == 30


def test_a_runs_metrics_directory_is_private_and_goes_with_it(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    killed = ProcessIdentity(HOST_TAG, current().pid_ns, dead.pid, 0)
    left = tmp_path / f"dirmq-metrics.{killed.token()}.killed"  # a server killed with -9 left it
    left.mkdir()
    (left / "counter_1.db").write_bytes(b"")
    alive = tmp_path / f"dirmq-metrics.{current().token()}.running"  # a live server's
    alive.mkdir()
    with MetricsFiles.create(str(tmp_path)) as files:
        path = Path(files.path)
        assert path.stat().st_mode & 0o777 == 0o700
        assert list(path.iterdir()) == []
        assert os.environ["PROMETHEUS_MULTIPROC_DIR"] == files.path
        assert not left.exists() and alive.exists()
    assert not path.exists()
    assert "PROMETHEUS_MULTIPROC_DIR" not in os.environ
