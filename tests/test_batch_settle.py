"""Settling many receipts in one request, against a real `dirmq serve`: the native API's
`POST /{queue}/messages/ack|nack|extend`, its answers and refusals (bad bodies lose nothing:
their messages stay leased and come back), the Python clients' `ack_many` and `extend_many`
in requests of 1000, and SQS DeleteMessageBatch / ChangeMessageVisibilityBatch with boto3."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time
import uuid
from typing import Any

import httpx
import pytest

import dirmq
from dirmq.client import AsyncRemoteStore, RemoteStore

from .support.fixtures import http_client, serve
from .support.servers import ServerProcess, sqs_client

server = serve()


http = http_client()


@pytest.fixture
def queue(http: httpx.Client) -> str:
    name = f"b{uuid.uuid4().hex[:8]}/work"
    assert http.put(f"/{name}").status_code == 201
    return name


def leased(http: httpx.Client, queue: str, count: int, visibility: str = "60s") -> list[str]:
    """Publish `count` messages and lease them all: their receipts."""
    body = b"".join(b'{"body": "m%d"}\n' % i for i in range(count))
    published = http.post(
        f"/{queue}/messages", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert published.status_code == 201, published.text
    receipts: list[str] = []
    while len(receipts) < count:
        got = http.get(f"/{queue}/messages", params={"max": "1000", "visibility": visibility}).text
        receipts += re.findall(r"X-Receipt: (\S+)", got, flags=re.IGNORECASE)
    assert len(receipts) == count
    return receipts


def stats(http: httpx.Client, queue: str) -> dict[str, int]:
    return dict(http.get(f"/{queue}").json()["stats"])


def acked_total(http: httpx.Client) -> float:
    text = http.get("/metrics").text
    return float(re.search(r"^dirmq_messages_acked_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]


# -- the native API ---------------------------------------------------------------------------
def test_ack_many_in_one_request(http: httpx.Client, queue: str) -> None:
    receipts = leased(http, queue, 1000)
    before = acked_total(http)
    answer = http.post(f"/{queue}/messages/ack", json={"receipts": receipts})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/json"
    assert answer.json() == {"settled": 1000, "failed": []}
    assert stats(http, queue)["total"] == 0
    assert acked_total(http) - before == 1000  # counted as single acks are
    again = http.post(f"/{queue}/messages/ack", json={"receipts": receipts[:2]}).json()
    assert again["settled"] == 0
    assert [(f["receipt"], f["error"]) for f in again["failed"]] == [
        (receipts[0], "StaleReceipt"),
        (receipts[1], "StaleReceipt"),
    ]
    assert "stale" in again["failed"][0]["message"]


def test_partial_failures_are_reported_by_receipt(http: httpx.Client, queue: str) -> None:
    good = leased(http, queue, 3)
    message_id = good[0].rsplit(".", 1)[0]
    hostile = "../../etc/passwd\x00\r\n\ud800" + "é" * 50
    receipts = [good[0], "nonsense", message_id, good[1], good[0], hostile, good[2]]
    document = json.dumps({"receipts": receipts})  # \ud800 escaped: no UTF-8 holds it
    answer = http.post(f"/{queue}/messages/ack", content=document).json()
    assert answer["settled"] == 3  # a duplicate is settled once, and is no failure
    failed = {f["receipt"]: f for f in answer["failed"]}
    assert set(failed) == {"nonsense", message_id, hostile}
    assert {f["error"] for f in failed.values()} == {"InvalidArgument"}
    assert failed["nonsense"]["message"] == "not a dirmq receipt: 'nonsense'"
    assert stats(http, queue)["total"] == 0


def test_an_empty_batch_settles_nothing(http: httpx.Client, queue: str) -> None:
    for action, extra in (("ack", {}), ("nack", {"delay": 1}), ("extend", {"visibility": "1s"})):
        answer = http.post(f"/{queue}/messages/{action}", json={"receipts": [], **extra})
        expected: dict[str, object] = {"settled": 0, "failed": []}
        if action == "nack":  # a nack says which it dead-lettered instead (none here)
            expected["dead_lettered"] = []
        assert (answer.status_code, answer.json()) == (200, expected)


def test_extend_many_keeps_the_leases(http: httpx.Client, queue: str) -> None:
    receipts = leased(http, queue, 5, visibility="0.5s")
    answer = http.post(
        f"/{queue}/messages/extend", json={"receipts": receipts, "visibility": "1m"}
    ).json()
    assert answer == {"settled": 5, "failed": []}
    time.sleep(0.7)
    assert http.get(f"/{queue}/messages").status_code == 204, "extended past the half second"
    seconds = http.post(f"/{queue}/messages/extend", json={"receipts": receipts, "visibility": 90})
    assert seconds.json() == {"settled": 5, "failed": []}  # a number is seconds
    acked = http.post(f"/{queue}/messages/ack", json={"receipts": receipts}).json()
    assert acked["settled"] == 5, "the receipts stayed valid"


def test_nack_many_returns_messages_at_once_or_later(http: httpx.Client, queue: str) -> None:
    receipts = leased(http, queue, 4)
    now = http.post(f"/{queue}/messages/nack", json={"receipts": receipts[:2]}).json()
    assert now == {"settled": 2, "failed": [], "dead_lettered": []}
    later = http.post(f"/{queue}/messages/nack", json={"receipts": receipts[2:], "delay": "1h"})
    assert later.json() == {"settled": 2, "failed": [], "dead_lettered": []}
    counts = stats(http, queue)
    assert (counts["ready"], counts["in_flight"], counts["delayed"]) == (2, 0, 2)
    again = http.get(f"/{queue}/messages", params={"max": "10"}).text
    assert re.findall(r"X-Receive-Count: (\d+)", again, flags=re.IGNORECASE) == ["2", "2"]


@pytest.mark.parametrize(
    ("action", "body", "says"),
    [
        ("ack", b"", "must be a JSON object"),
        ("ack", b"not json", "must be a JSON object"),
        ("ack", b"\xff\xfe", "must be a JSON object"),
        ("ack", b"[]", "must be a JSON object"),
        ("ack", b'{"receipts": "r.1"}', '"receipts" must be a list'),
        ("ack", b'{"receipts": null}', '"receipts" must be a list'),
        ("ack", b'{"receipt": []}', "unknown key 'receipt'"),
        ("ack", b'{"receipts": [], "visibility": 5}', "unknown key 'visibility'"),
        ("ack", b'{"receipts": [1]}', "a receipt must be a string"),
        ("ack", b'{"receipts": [["x"]]}', "a receipt must be a string"),
        ("ack", b'{"receipts": [{"a": 1}]}', "a receipt must be a string"),
        ("ack", b'{"receipts": [' + b"[" * 100 + b"]" * 100 + b"]}", "nested"),
        ("extend", b'{"receipts": []}', 'extend needs "visibility"'),
        ("extend", b'{"receipts": [], "visibility": "-1s"}', "visibility"),
        ("extend", b'{"receipts": [], "visibility": "2y"}', "visibility"),
        ("extend", b'{"receipts": [], "visibility": true}', "visibility"),
        ("extend", b'{"receipts": [], "visibility": 1e400}', "visibility"),
        ("extend", b'{"receipts": [], "visibility": 99999999999999999999999}', "visibility"),
        ("nack", b'{"receipts": [], "delay": -1}', "delay"),
        ("nack", b'{"receipts": [], "delay": [1]}', "delay"),
    ],
)
def test_bad_bodies_are_400_and_touch_nothing(
    http: httpx.Client, queue: str, action: str, body: bytes, says: str
) -> None:
    (receipt,) = leased(http, queue, 1)
    sent = body.replace(b"[]", b'["%s"]' % receipt.encode()) if b"[]}" in body else body
    answer = http.post(f"/{queue}/messages/{action}", content=sent)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "InvalidArgument"
    assert says in answer.json()["message"]
    assert stats(http, queue)["in_flight"] == 1, "still leased"
    settled = http.post(f"/{queue}/messages/ack", json={"receipts": [receipt]}).json()
    assert settled == {"settled": 1, "failed": []}, "the receipt is as valid as before"


def test_a_refused_batch_leaves_its_messages_to_come_back(http: httpx.Client, queue: str) -> None:
    receipts = leased(http, queue, 3, visibility="0.5s")
    refused = http.post(f"/{queue}/messages/ack", json={"receipts": [*receipts, 7]})
    assert refused.status_code == 400
    time.sleep(0.6)
    again = http.get(f"/{queue}/messages", params={"max": "10"}).text
    assert re.findall(r"X-Receive-Count: (\d+)", again, flags=re.IGNORECASE) == ["2"] * 3


def test_more_than_1000_receipts_are_refused_whole(http: httpx.Client, queue: str) -> None:
    receipts = leased(http, queue, 3)
    too_many = receipts + [f"{uuid.uuid4().hex}.1" for _ in range(998)]
    answer = http.post(f"/{queue}/messages/ack", json={"receipts": too_many})
    assert answer.status_code == 400
    assert answer.json() == {
        "error": "InvalidArgument",
        "message": "1001 receipts in one request; at most 1000: split the batch",
    }
    assert stats(http, queue)["in_flight"] == 3, "none was acknowledged"


def test_routes_query_parameters_and_missing_queues(http: httpx.Client, queue: str) -> None:
    for action in ("ack", "nack", "extend"):
        refused = http.get(f"/{queue}/messages/{action}")
        assert (refused.status_code, refused.headers["allow"]) == (405, "POST")
        assert http.delete(f"/{queue}/messages/{action}").status_code == 405
        missing = http.post(f"/nowhere/q/messages/{action}", json={"receipts": []})
        assert missing.status_code == 404 and missing.json()["error"] == "QueueNotFound"
    unknown = http.post(f"/{queue}/messages/ack", params={"visibility": "1s"}, json={})
    assert unknown.status_code == 400 and "visibility" in unknown.json()["message"]
    # The single-receipt actions and `DELETE .../{receipt}` are what they were.
    (receipt,) = leased(http, queue, 1)
    assert http.post(f"/{queue}/messages/{receipt}/extend?visibility=1m").status_code == 204
    assert http.delete(f"/{queue}/messages/{receipt}").status_code == 204


def test_pipelined_single_acks_are_answered_in_order(
    server: ServerProcess, http: httpx.Client, queue: str
) -> None:
    """`DELETE /{queue}/messages/{receipt}` (answered without a Task, through the queue's ack
    line), pipelined with the general kinds of ack: each gets its own answer, in order."""
    receipts = leased(http, queue, 40)
    message_id = receipts[1].rsplit(".", 1)[0]
    paths = [f"/{queue}/messages/{r}" for r in receipts]
    paths[1] = f"/{queue}/messages/{message_id}"  # by id: the general way
    paths[2] = f"/{queue}/messages/{message_id}?receipt={receipts[2]}"  # not its receipt: 400
    paths[3] = f"/{queue}/messages/{receipts[0]}"  # acked just before: stale
    paths.append(f"/nowhere/q/messages/{receipts[4]}")
    requests = b"".join(f"DELETE {p} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for p in paths)
    requests += b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(requests)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    statuses = [int(s) for s in re.findall(rb"^HTTP/1\.1 (\d+)", answer, re.M)]
    assert statuses == [204, 204, 400, 409, *[204] * 36, 404, 200]
    assert b'"error": "StaleReceipt"' in answer and b'"error": "QueueNotFound"' in answer
    counts = stats(http, queue)
    assert (counts["total"], counts["in_flight"]) == (2, 2), "the 400's and the 409's are left"


# -- the Python clients ---------------------------------------------------------------------
def test_remote_ack_many_and_extend_many_in_requests_of_1000(
    server: ServerProcess, http: httpx.Client, queue: str
) -> None:
    receipts = leased(http, queue, 2100, visibility="0.5s")
    with RemoteStore(server.url) as store:
        q = store.queue(queue)
        failures = q.extend_many([*receipts, "nonsense"], 60)
        assert list(failures) == ["nonsense"]
        assert isinstance(failures["nonsense"], dirmq.InvalidArgument)
        time.sleep(0.6)
        assert stats(http, queue)["in_flight"] == 2100, "extended in three requests"
        stale = q.ack_many(receipts[:5])
        assert stale == {}
        failures = q.ack_many(receipts)
        assert set(failures) == set(receipts[:5])
        assert all(isinstance(f, dirmq.StaleReceipt) for f in failures.values())
        assert stats(http, queue)["total"] == 0
        assert q.ack_many([]) == {}
        with pytest.raises(dirmq.InvalidArgument):
            q.extend_many(receipts, -1)


def test_async_ack_many_and_extend_many(
    server: ServerProcess, http: httpx.Client, queue: str
) -> None:
    receipts = leased(http, queue, 1500)

    async def settle() -> tuple[dict[str, Exception], dict[str, Exception]]:
        async with AsyncRemoteStore(server.url) as store:
            q = await store.queue(queue)
            extended = await q.extend_many(receipts, 120)
            return extended, await q.ack_many([*receipts, "nonsense"])

    extended, acked = asyncio.run(settle())
    assert extended == {}
    assert list(acked) == ["nonsense"] and isinstance(acked["nonsense"], dirmq.InvalidArgument)
    assert stats(http, queue)["total"] == 0


def test_client_errors_of_a_whole_request_are_raised(server: ServerProcess) -> None:
    with RemoteStore(server.url) as store:
        q = store.create_queue(f"b{uuid.uuid4().hex[:8]}/gone")
        store.delete_queue(q.name)
        with pytest.raises(dirmq.QueueNotFound):
            q.ack_many(["0000000000000001-000000000000.1"])


# -- SQS ------------------------------------------------------------------------------------
def test_sqs_batches_settle_through_one_store_call(server: ServerProcess) -> None:
    sqs: Any = sqs_client(server.url)
    url = sqs.create_queue(QueueName=f"b{uuid.uuid4().hex[:8]}")["QueueUrl"]
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"s{i}"} for i in range(6)]
    )
    got: list[dict[str, Any]] = []
    while len(got) < 6:
        got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=1).get(
            "Messages", []
        )
    old = got[5]["ReceiptHandle"]
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            *(
                {"Id": f"e{i}", "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 60}
                for i, m in enumerate(got[:4])
            ),
            {"Id": "zero", "ReceiptHandle": got[4]["ReceiptHandle"], "VisibilityTimeout": 0},
            {"Id": "bad", "ReceiptHandle": "bad", "VisibilityTimeout": 5},
        ],
    )
    assert [s["Id"] for s in changed["Successful"]] == ["e0", "e1", "e2", "e3", "zero"]
    assert [f["Code"] for f in changed["Failed"]] == ["ReceiptHandleIsInvalid"]
    time.sleep(1.1)  # got[5]'s lease is over: it is received again, its old handle is stale
    again: list[dict[str, Any]] = []
    while len(again) < 2:
        again += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    assert sorted(m["Body"] for m in again) == ["s4", "s5"], "the extended ones stayed leased"
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            *({"Id": f"d{i}", "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(got[:4])),
            {"Id": "same", "ReceiptHandle": got[0]["ReceiptHandle"]},  # a handle twice
            {"Id": "old", "ReceiptHandle": old},  # deletes the message all the same (standard)
            {
                "Id": "new",
                "ReceiptHandle": next(m for m in again if m["Body"] == "s4")["ReceiptHandle"],
            },
            {"Id": "junk", "ReceiptHandle": "junk"},
        ],
    )
    assert [s["Id"] for s in deleted["Successful"]] == [
        "d0",
        "d1",
        "d2",
        "d3",
        "same",
        "old",
        "new",
    ]
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("junk", "ReceiptHandleIsInvalid")]
    name = url.rsplit("/", 1)[1]
    assert httpx.get(f"{server.url}/{name}").json()["stats"]["total"] == 0
