"""`/metrics` of a real `dirmq serve`: with `--workers 2` every scrape, whichever worker answers
it, reports the same counts, which never go backwards when a worker is killed and replaced;
every door is counted (SQS by boto3, yaq); the depth gauges say what the queues hold; and a
root of 10,000 queues is scraped without opening any of them (no inotify watch)."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

import dirmq
from dirmq.store.processes import HOST_TAG, current

from .support.metrics_helpers import inotify_watches, make_queues, matching, value
from .support.servers import REPO, ServerProcess, sqs_client, start_server

PUBLISHES = 1000
CONNECTIONS = 40  # each keeps its connection: the kernel spreads them over both workers
POSTED = {"door": "native", "route": "messages", "method": "POST", "status": "201"}


def _scrape(server: ServerProcess, **params: str) -> str:
    """One scrape on a connection of its own (so any worker may answer it)."""
    for _attempt in range(50):
        try:
            response = httpx.get(f"{server.url}/metrics", params=params, timeout=30)
        except httpx.TransportError:  # a worker just killed: its connections are reset
            time.sleep(0.1)
            continue
        assert response.status_code == 200, response.text
        return response.text
    raise AssertionError("no worker answered")


def _workers(text: str) -> dict[str, float]:
    """Live workers' pid -> requests they answered (their own gauge)."""
    return {
        dict(labels)["pid"]: number
        for labels, number in matching(text, "dirmq_worker_requests_answered").items()
    }


def _publish_many(server: ServerProcess) -> None:
    def publisher(n: int) -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            for i in range(PUBLISHES // CONNECTIONS):
                assert client.post("/counted/messages", content=f"{n}-{i}").status_code == 201

    with ThreadPoolExecutor(CONNECTIONS) as pool:
        list(pool.map(publisher, range(CONNECTIONS)))


def test_two_workers_count_every_publish_once_in_every_scrape(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root", "--workers", "2", yaq=True)
    try:
        assert httpx.put(f"{server.url}/counted").status_code == 201
        _publish_many(server)
        time.sleep(1.5)  # each worker's own gauge is brought up to date every second
        text = _scrape(server)
        workers = _workers(text)
        assert len(workers) == 2
        assert sum(workers.values()) >= PUBLISHES + 1
        assert min(workers.values()) >= 2 * PUBLISHES // CONNECTIONS, workers  # both served
        for _ in range(20):
            text = _scrape(server)
            assert value(text, "dirmq_messages_published_total") == PUBLISHES
            assert value(text, "dirmq_http_requests_total", **POSTED) == PUBLISHES
            latency = {k: v for k, v in POSTED.items() if k != "status"}
            count = value(text, "dirmq_http_request_duration_seconds_count", **latency)
            assert count == PUBLISHES
            assert value(text, "dirmq_queue_messages", queue="counted", state="ready") == 1000
        scraped = {"door": "native", "route": "metrics", "method": "GET", "status": "200"}
        scrapes = value(text, "dirmq_http_requests_total", **scraped)
        assert scrapes is not None and scrapes >= 20  # the earlier scrapes, all counted

        # kill -9 a worker: the supervisor replaces it; nothing it counted is lost.
        victim = min(workers)
        os.kill(int(victim), signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            text = _scrape(server)
            now = _workers(text)
            if victim not in now and len(now) == 2:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"the killed worker was not replaced: {now}")
        assert value(text, "dirmq_messages_published_total") == PUBLISHES
        assert value(text, "dirmq_http_requests_total", **POSTED) == PUBLISHES
        later = value(text, "dirmq_http_requests_total", **scraped)
        assert later is not None and later >= scrapes  # never backwards

        # Every door is counted, with its name.
        sqs = sqs_client(server.url)
        url = sqs.create_queue(QueueName="by-sqs")["QueueUrl"]
        for n in range(3):
            sqs.send_message(QueueUrl=url, MessageBody=f"sqs {n}")
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=3)["Messages"]
        for message in got:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
        assert server.yaq_url is not None
        assert httpx.post(f"{server.yaq_url}/by-yaq", content=b"yaq").status_code == 200
        assert httpx.get(f"{server.yaq_url}/by-yaq").content == b"yaq"
        time.sleep(0.3)  # yaq acknowledges once its answer is out
        text = _scrape(server)
        sent = {"door": "sqs", "route": "SendMessage", "method": "POST", "status": "200"}
        assert value(text, "dirmq_http_requests_total", **sent) == 3
        deleted = {**sent, "route": "DeleteMessage"}
        assert value(text, "dirmq_http_requests_total", **deleted) == len(got)
        enqueued = {"door": "yaq", "route": "enqueue", "method": "POST", "status": "200"}
        assert value(text, "dirmq_http_requests_total", **enqueued) == 1
        dequeued = {"door": "yaq", "route": "dequeue", "method": "GET", "status": "200"}
        assert value(text, "dirmq_http_requests_total", **dequeued) == 1
        assert value(text, "dirmq_messages_published_total") == PUBLISHES + 3 + 1
        assert value(text, "dirmq_messages_delivered_total") == len(got) + 1
        assert value(text, "dirmq_messages_acked_total") == len(got) + 1
        documented = (REPO / "docs" / "operations.md").read_text()
        for family in text_string_to_metric_families(text):
            shown = family.name + ("_total" if family.type == "counter" else "")
            assert f"| `{shown}` |" in documented, f"{shown} is not in operations.md#metrics"
    finally:
        assert server.stop() == 0
    if os.path.isdir("/dev/shm"):  # the run's metrics files went with it
        mine = f"dirmq-metrics.{HOST_TAG}.{current().pid_ns}.{server.proc.pid}."
        assert not [name for name in os.listdir("/dev/shm") if name.startswith(mine)]


def test_depth_gauges_say_what_a_queue_holds(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root")
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.put("/depth").status_code == 201
            for n in range(5):
                assert http.post("/depth/messages", content=f"{n}").status_code == 201
            for _ in range(2):
                later = http.post("/depth/messages", params={"delay": "1h"}, content=b"d")
                assert later.status_code == 201
            held = http.get("/depth/messages", params={"visibility": "1h"})
            dead = http.get("/depth/messages", params={"visibility": "1h"})
            receipt = dead.headers["X-Receipt"]
            assert http.post(f"/depth/messages/{receipt}/dead-letter").status_code == 204
            assert held.status_code == 200
            time.sleep(0.3)
            for text in (_scrape(server), _scrape(server, queue="depth")):
                depth = {
                    dict(labels)["state"]: number
                    for labels, number in matching(
                        text, "dirmq_queue_messages", queue="depth"
                    ).items()
                }
                assert depth == {"ready": 3, "in_flight": 1, "delayed": 2, "dead": 1}
                age = value(text, "dirmq_queue_oldest_ready_age_seconds", queue="depth")
                assert age is not None and 0.3 <= age < 60
            absent = http.get("/metrics", params={"queue": "absent"})
            assert absent.status_code == 404 and absent.json()["error"] == "QueueNotFound"
            assert http.get("/metrics", params={"queue": "a//b"}).status_code == 400
    finally:
        assert server.stop() == 0


def test_a_root_of_10000_queues_scrapes_without_opening_them(tmp_path: Path) -> None:
    root = tmp_path / "root"
    names = [f"t{n // 100:02d}/q{n % 100:02d}" for n in range(10_000)]
    make_queues(root, names)
    with dirmq.Store(root) as store:
        store.queue("t42/q07").put_many([b"x"] * 7, durability="writeback")
        store.queue("t99/q99").put_many([b"y"] * 3, durability="writeback")
    server = start_server(root)
    try:
        pid = server.proc.pid
        started = time.monotonic()
        text = _scrape(server)
        took_s = time.monotonic() - started
        assert value(text, "dirmq_queues") == 10_000
        assert value(text, "dirmq_queues_omitted") == 9_000  # the default cap: 1000
        assert len(matching(text, "dirmq_queue_messages", state="ready")) == 1000
        assert value(text, "dirmq_queues_messages", state="ready") == 10
        assert value(text, "dirmq_queue_messages", queue="t42/q07", state="ready") == 7
        assert value(text, "dirmq_queue_messages", queue="t99/q99", state="ready") == 3
        one = _scrape(server, queue="t77/q77")
        assert value(one, "dirmq_queue_messages", queue="t77/q77", state="ready") == 0
        assert inotify_watches(pid) == 0, "a scrape watches queues"
        print(f"scrape of 10,000 queues: {took_s:.2f} s, {len(text)} bytes")  # not asserted
    finally:
        assert server.stop() == 0
