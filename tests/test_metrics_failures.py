"""The failure counters of a real `dirmq serve --workers 2`, every request on a connection of its
own (so both workers answer some): nacks at every door (native nack and batch nack, the
stream's nack, SQS ChangeMessageVisibility to 0, single and batch), dead letters by reason
(max-receives by nacks and by expiry, rejected, unreadable), expired leases, redrives, a
killed worker's restart; each exact, and the same whichever worker answers the scrape."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import httpx

from dirmq.client import RemoteStore

from .support.metrics_helpers import matching, value
from .support.servers import ServerProcess, sqs_client, start_server

COUNTERS = (
    "dirmq_messages_nacked_total",
    "dirmq_leases_expired_total",
    "dirmq_worker_restarts_total",
    "dirmq_messages_redriven_total",
)
SETTLE_S = 10.0  # how long a count told after its answer may take to show


def _scrape(server: ServerProcess) -> str:
    """One scrape on a connection of its own (so any worker may answer it)."""
    for _attempt in range(50):
        try:
            response = httpx.get(f"{server.url}/metrics", timeout=30)
        except httpx.TransportError:  # a worker just killed: its connections are reset
            time.sleep(0.1)
            continue
        assert response.status_code == 200, response.text
        return response.text
    raise AssertionError("no worker answered")


def _failures(text: str) -> dict[str, float | None]:
    found: dict[str, float | None] = {name: value(text, name) for name in COUNTERS}
    for labels, number in matching(text, "dirmq_dead_letters_total").items():
        found[f"dead:{dict(labels)['reason']}"] = number
    return found


def _counted(server: ServerProcess, **expected: float) -> dict[str, float | None]:
    """Once the scrape shows `expected` (counts are told just after an answer is sent, and a
    stream's nack is answered by nothing), ten more scrapes show the same counts."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        counts = _failures(_scrape(server))
        if all(counts.get(name) == number for name, number in expected.items()):
            break
        assert time.monotonic() < deadline, (expected, counts)
        time.sleep(0.05)
    for _ in range(10):
        assert _failures(_scrape(server)) == counts
    return counts


def _create(server: ServerProcess, name: str, **config: object) -> None:
    answer = httpx.put(f"{server.url}/{name}", content=json.dumps(config))
    assert answer.status_code == 201, answer.text


def _leased(server: ServerProcess, name: str, count: int, visibility: str = "60s") -> list[str]:
    """Publish `count` messages and lease them all: their receipts."""
    _publish(server, name, count)
    return _lease(server, name, count, visibility)


def _publish(server: ServerProcess, name: str, count: int) -> None:
    lines = b"".join(b'{"body": "m%d"}\n' % i for i in range(count))
    headers = {"Content-Type": "application/x-ndjson"}
    published = httpx.post(f"{server.url}/{name}/messages", content=lines, headers=headers)
    assert published.status_code == 201, published.text


def _lease(server: ServerProcess, name: str, count: int, visibility: str) -> list[str]:
    receipts: list[str] = []
    while len(receipts) < count:
        params = {"max": str(count - len(receipts)), "visibility": visibility}
        got = httpx.get(f"{server.url}/{name}/messages", params=params)
        receipts += re.findall(r"X-Receipt: (\S+)", got.text, flags=re.IGNORECASE)
    assert len(receipts) == count
    return receipts


def _post(server: ServerProcess, path: str, **kwargs: object) -> httpx.Response:
    return httpx.post(f"{server.url}/{path}", **kwargs)  # type: ignore[arg-type]


def _stats(server: ServerProcess, name: str) -> dict[str, int]:
    return dict(httpx.get(f"{server.url}/{name}").json()["stats"])


def _redriven(server: ServerProcess, name: str, **options: str) -> int:
    """Redrive `name`'s dead messages (POST /{queue}/redrive), once its task is over: how
    many it moved."""
    started = _post(server, f"{name}/redrive", json=options)
    assert started.status_code == 202, started.text
    deadline = time.monotonic() + SETTLE_S
    while True:
        task = httpx.get(f"{server.url}{started.headers['location']}").json()
        if task["status"] != "running":
            assert task["status"] == "completed", task
            return int(task["moved"])
        assert time.monotonic() < deadline, task
        time.sleep(0.05)


def _nack_at_every_door(server: ServerProcess) -> int:
    """Nacks by the native routes, the batch route, the stream and SQS: how many took."""
    _create(server, "nacks")
    receipts = _leased(server, "nacks", 20)
    for receipt in receipts[:8]:
        assert _post(server, f"nacks/messages/{receipt}/nack").status_code == 204
    stale = _post(server, f"nacks/messages/{receipts[0]}/nack")  # given back already
    assert stale.status_code >= 400, stale.text
    batch = {"receipts": [*receipts[8:14], receipts[1]]}  # one stale: not a nack
    answer = _post(server, "nacks/messages/nack", json=batch).json()
    assert answer["settled"] == 6 and len(answer["failed"]) == 1, answer
    answer = _post(server, "nacks/messages/nack", json={"receipts": receipts[14:]}).json()
    assert answer["settled"] == 6, answer
    assert _stats(server, "nacks")["ready"] == 20
    nacked = 20

    # The stream: 3 nacked, 2 more held and given back when it closes (not a nack).
    _create(server, "streamed")
    assert _post(server, "streamed/messages", content=b"s").status_code == 201
    remote = RemoteStore(server.url)
    with remote, remote.queue("streamed").consume(prefetch=2) as consumer:
        for n in range(1, 4):
            message = consumer.get(timeout_s=10)
            assert message is not None and message.receive_count == n
            consumer.nack(message)
        held = consumer.get(timeout_s=10)  # the nacked one, delivered again
        assert held is not None and held.receive_count == 4
    nacked += 3

    sqs = sqs_client(server.url)
    url = sqs.create_queue(QueueName="sqs-nacks")["QueueUrl"]
    for n in range(10):
        sqs.send_message(QueueUrl=url, MessageBody=f"sqs {n}")
    handles: list[str] = []
    while len(handles) < 10:
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
        handles += [m["ReceiptHandle"] for m in got.get("Messages", [])]
    for handle in handles[:4]:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    entries = [
        {"Id": str(n), "ReceiptHandle": handle, "VisibilityTimeout": 0}
        for n, handle in enumerate(handles[4:])
    ]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=entries)
    assert len(changed["Successful"]) == 6 and not changed.get("Failed")
    extended = [{**entries[0], "VisibilityTimeout": 30}]  # not a nack
    sqs.change_message_visibility_batch(QueueUrl=url, Entries=extended)
    return nacked + 10


def test_failures_are_counted_exactly_whichever_worker_answers(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root", "--workers", "2")
    try:
        start = _counted(server, dirmq_messages_nacked_total=0)
        assert start == {
            "dirmq_messages_nacked_total": 0,
            "dirmq_leases_expired_total": 0,
            "dirmq_worker_restarts_total": 0,
            "dirmq_messages_redriven_total": 0,
            "dead:max-receives": 0,
            "dead:rejected": 0,
            "dead:unreadable": 0,
            "dead:ttl-expired": 0,
        }
        nacked = _nack_at_every_door(server)

        # Leases that run out: a long poll is woken when they fall due and returns them. Two
        # more, of a queue whose messages are received once, leased before them, have run out
        # too by then: the next receive there dead-letters them (max-receives).
        _create(server, "slow")
        _create(server, "poison", max_receives=1)
        _publish(server, "poison", 8)
        _lease(server, "poison", 2, visibility="1s")
        poisoned = _lease(server, "poison", 6, visibility="60s")
        _leased(server, "slow", 5, visibility="1s")
        # Nacked at their last receive: dead letters (max-receives) too.
        for receipt in poisoned[:3]:
            assert _post(server, f"poison/messages/{receipt}/nack").status_code == 204
        answer = _post(server, "poison/messages/nack", json={"receipts": poisoned[3:]}).json()
        assert answer["settled"] == 3, answer
        nacked += 6
        again: list[str] = []
        while len(again) < 5:
            got = httpx.get(
                f"{server.url}/slow/messages", params={"max": "5", "wait": "20s"}, timeout=30
            )
            again += re.findall(r"X-Receipt: (\S+)", got.text, flags=re.IGNORECASE)
        assert all(receipt.endswith(".2") for receipt in again)
        answer = _post(server, "slow/messages/ack", json={"receipts": again}).json()
        assert answer["settled"] == 5
        assert httpx.get(f"{server.url}/poison/messages").status_code == 204
        assert _stats(server, "poison")["dead"] == 8

        # Dead letters a consumer asks for: rejected (with its words or without), unreadable.
        _create(server, "rejects")
        receipts = _leased(server, "rejects", 6)
        for n, receipt in enumerate(receipts[:4]):
            params = {"reason": "bad total"} if n % 2 else {}
            answer = _post(server, f"rejects/messages/{receipt}/dead-letter", params=params)
            assert answer.status_code == 204, answer.text
        for receipt in receipts[4:]:
            params = {"kind": "unreadable"}
            answer = _post(server, f"rejects/messages/{receipt}/dead-letter", params=params)
            assert answer.status_code == 204, answer.text
        stale = _post(server, f"rejects/messages/{receipts[0]}/dead-letter")  # not twice
        assert stale.status_code >= 400, stale.text
        assert _stats(server, "rejects")["dead"] == 6

        # Redrives: the unreadable ones back to their queue, then every dead one of another.
        assert _redriven(server, "rejects", reason="unreadable") == 2
        assert _redriven(server, "poison") == 8
        assert _stats(server, "poison")["dead"] == 0

        counts = _counted(
            server,
            dirmq_messages_nacked_total=nacked,
            dirmq_leases_expired_total=7,
            dirmq_messages_redriven_total=10,
            **{"dead:max-receives": 8, "dead:rejected": 4, "dead:unreadable": 2},
        )
        assert counts["dirmq_worker_restarts_total"] == 0
        assert counts["dead:ttl-expired"] == 0

        # Both workers answered some of it.
        workers = matching(_scrape(server), "dirmq_worker_requests_answered")
        assert len(workers) == 2 and min(workers.values()) > 0, workers

        # kill -9 a worker: the supervisor replaces it and counts it; nothing counted is lost.
        victim = int(dict(next(iter(workers)))["pid"])
        os.kill(victim, signal.SIGKILL)
        died = server.wait_for(lambda line: "died" in line and "restarting" in line)
        assert len(died) == 1, server.output[-2000:]
        after = _counted(server, dirmq_worker_restarts_total=1)
        assert after == {**counts, "dirmq_worker_restarts_total": 1}
    finally:
        assert server.stop() == 0


def test_one_worker_shows_the_failure_counters_at_0(tmp_path: Path) -> None:
    """Without a supervisor the restart counter is there all the same, as is every reason."""
    server = start_server(tmp_path / "root")
    try:
        assert set(_counted(server, dirmq_worker_restarts_total=0).values()) == {0}
        assert len(_counted(server, dirmq_messages_nacked_total=0)) == len(COUNTERS) + 4
    finally:
        assert server.stop() == 0
