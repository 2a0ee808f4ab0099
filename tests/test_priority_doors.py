"""Message priorities through every door on a real server (native HTTP, the HTTP client, SQS
with boto3) and the CLI: the same levels, the same order, a 400 for a priority the queue has
not got."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

import dirmq
from dirmq.client import RemoteStore
from dirmq.store.message import OutgoingMessage

from .support.fixtures import http_client, serve
from .support.procs import REPO
from .support.servers import ServerProcess, sqs_client

server = serve()
http = http_client()


def _fresh() -> str:
    return f"p-{uuid.uuid4().hex[:8]}"


def _queue(http: httpx.Client, levels: int = 3) -> str:
    name = _fresh()
    created = http.put(f"/{name}", json={"priority_levels": levels})
    assert created.status_code == 201, created.text
    assert created.json()["config"]["priority_levels"] == levels
    return name


def test_native_publish_by_query_and_header_and_receive_highest_first(
    http: httpx.Client,
) -> None:
    name = _queue(http)
    low = http.post(f"/{name}/messages", content=b"low").json()["id"]
    mid = http.post(f"/{name}/messages", params={"priority": "1"}, content=b"mid").json()["id"]
    high = http.post(f"/{name}/messages", headers={"X-Priority": "2"}, content=b"hi").json()["id"]
    browsed = http.get(f"/{name}/messages", params={"peek": "1", "max": "10"}).json()
    assert {m["id"]: m.get("priority", 0) for m in browsed["messages"]} == {
        low: 0,
        mid: 1,
        high: 2,
    }
    peeked = http.get(f"/{name}/messages/{mid}")  # a message by id says its level too
    assert peeked.status_code == 200 and peeked.headers["x-priority"] == "1"
    assert "x-priority" not in http.get(f"/{name}/messages/{low}").headers
    got = []
    for _ in range(3):
        answer = http.get(f"/{name}/messages")
        assert answer.status_code == 200
        got.append((answer.headers["x-message-id"], answer.headers.get("x-priority", "0")))
    assert got == [(high, "2"), (mid, "1"), (low, "0")]


@pytest.mark.parametrize("bad", ["3", "-1", "x", "1.5", "99999"])
def test_native_a_bad_priority_is_400_saying_the_range(http: httpx.Client, bad: str) -> None:
    name = _queue(http)
    for request in (
        {"params": {"priority": bad}},
        {"headers": {"X-Priority": bad}},
    ):
        answer = http.post(f"/{name}/messages", content=b"x", **request)  # type: ignore[arg-type]
        assert answer.status_code == 400, answer.text
        assert "priority" in answer.text and ("from 0 to" in answer.text), answer.text
    batch = json.dumps({"body": "x", "priority": int(bad) if bad.lstrip("-").isdigit() else bad})
    answer = http.post(
        f"/{name}/messages",
        content=batch.encode(),
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert answer.status_code == 400, answer.text
    assert http.get(f"/{name}").json()["stats"]["total"] == 0  # nothing stored


def test_native_batches_and_config(http: httpx.Client) -> None:
    name = _queue(http, 2)
    lines = b'{"body": "a"}\n{"body": "b", "priority": 1}\n'
    ids = http.post(
        f"/{name}/messages", content=lines, headers={"Content-Type": "application/x-ndjson"}
    ).json()["ids"]
    answer = http.get(f"/{name}/messages")
    assert answer.headers["x-message-id"] == ids[1] and answer.headers["x-priority"] == "1"
    parts = b"--B\r\nX-Priority: 1\r\n\r\np\r\n--B\r\n\r\nq\r\n--B--\r\n"
    multipart = {"Content-Type": "multipart/mixed; boundary=B"}
    ids = http.post(f"/{name}/messages", content=parts, headers=multipart).json()["ids"]
    assert http.get(f"/{name}/messages").headers["x-message-id"] == ids[0]
    bad = parts.replace(b"X-Priority: 1", b"X-Priority: 2")
    refused = http.post(f"/{name}/messages", content=bad, headers=multipart)
    assert refused.status_code == 400 and "from 0 to 1" in refused.text
    assert http.put(f"/{name}", json={"priority_levels": 11}).status_code == 400
    assert http.put(f"/{name}", json={"priority_levels": 0}).status_code == 400
    assert http.put(f"/{name}", json={"priority_levels": "2"}).status_code == 400
    flat = _fresh()
    assert http.put(f"/{flat}").status_code == 201
    refused = http.post(f"/{flat}/messages", params={"priority": "1"}, content=b"x")
    assert refused.status_code == 400 and "one priority level" in refused.text


def test_the_http_client_sends_and_reads_priorities(
    http: httpx.Client, server: ServerProcess
) -> None:
    name = _queue(http)
    with RemoteStore(server.url) as store:
        q = store.queue(name)
        first = q.put(b"low")
        second = q.put(b"high", priority=2)
        batch = q.put_many([OutgoingMessage(b"m", priority=1)])
        got = [(m.id, m.priority) for m in q.get(3)]
        assert got == [(second, 2), (batch[0], 1), (first, 0)]
        with pytest.raises(dirmq.errors.InvalidArgument):
            q.put(b"x", priority=5)


def test_sqs_dirmq_priority_attribute(http: httpx.Client, server: ServerProcess) -> None:
    name = _queue(http)
    sqs: Any = sqs_client(server.url)
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]

    def attribute(value: str, data_type: str = "Number") -> dict[str, Any]:
        return {"DirmqPriority": {"DataType": data_type, "StringValue": value}}

    low = sqs.send_message(QueueUrl=url, MessageBody="low")["MessageId"]
    high = sqs.send_message(QueueUrl=url, MessageBody="high", MessageAttributes=attribute("2"))
    for bad, data_type in (("3", "Number"), ("-1", "Number"), ("1", "String")):
        with pytest.raises(ClientError) as info:
            sqs.send_message(
                QueueUrl=url, MessageBody="x", MessageAttributes=attribute(bad, data_type)
            )
        assert info.value.response["Error"]["Code"] == "InvalidParameterValue"
        assert "priority" in info.value.response["Error"]["Message"]
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])[
        "Messages"
    ]
    assert [m["MessageId"] for m in got] == [high["MessageId"], low]
    assert got[0]["MessageAttributes"]["DirmqPriority"]["StringValue"] == "2"


def test_cli_put_priority_and_queue_levels(tmp_path: Path) -> None:
    root = tmp_path / "root"

    def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "dirmq", args[0], "--root", str(root), *args[1:]]
        return subprocess.run(command, input=stdin, capture_output=True, timeout=60, check=False)

    made = run("create", "jobs", "--priority-levels", "3")
    assert made.returncode == 0, made.stderr
    assert run("put", "jobs", stdin=b"low").returncode == 0
    high = run("put", "jobs", "--priority", "2", stdin=b"high")
    assert high.returncode == 0, high.stderr
    bad = run("put", "jobs", "--priority", "3", stdin=b"x")
    assert bad.returncode != 0 and b"from 0 to 2" in bad.stderr
    got = run("get", "jobs", "--ack", "--json")
    assert got.returncode == 0, got.stderr
    message = json.loads(got.stdout)
    assert (message["body"], message["priority"]) == ("high", 2)


HTTP_CONSUMER = """
import json, sys
import httpx
from dirmq.client.protocol import Answer, received
url, name, out = sys.argv[1:4]
got = []
with httpx.Client(base_url=url, timeout=30) as http:
    while True:
        answer = http.get(f"/{name}/messages", params={"max": "5", "wait": "1s"})
        if answer.status_code == 204:
            break
        assert answer.status_code == 200, answer.text
        headers = [(k.lower(), v) for k, v in answer.headers.multi_items()]
        messages = received(Answer(answer.status_code, headers, answer.content))
        for m in messages:
            got.append([m.id, m.priority])
            assert http.delete(f"/{name}/messages/{m.receipt}").status_code == 204
with open(out, "w") as f:
    json.dump(got, f)
"""


def test_eight_http_consumer_processes_highest_first_each_once(
    http: httpx.Client, server: ServerProcess, tmp_path: Path
) -> None:
    name = _queue(http, 4)
    sent: dict[str, int] = {}
    lines = [json.dumps({"body": str(i), "priority": (i * 3) % 4}) for i in range(800)]
    for start in range(0, 800, 200):
        body = "\n".join(lines[start : start + 200]).encode()
        ids = http.post(
            f"/{name}/messages", content=body, headers={"Content-Type": "application/x-ndjson"}
        ).json()["ids"]
        for i, message_id in enumerate(ids):
            sent[message_id] = ((start + i) * 3) % 4
    outs = [tmp_path / f"h{n}.json" for n in range(8)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    children = [
        subprocess.Popen(
            [sys.executable, "-c", HTTP_CONSUMER, server.url, name, str(out)], env=env, cwd=REPO
        )
        for out in outs
    ]
    for child in children:
        assert child.wait(timeout=300) == 0
    seen: list[str] = []
    for out in outs:
        got = json.loads(out.read_text())
        seen += [message_id for message_id, _level in got]
        levels = [level for _id, level in got]
        assert levels == sorted(levels, reverse=True)  # higher levels first, in each consumer
        for level in range(4):  # FIFO within a level
            ids = [message_id for message_id, lv in got if lv == level]
            assert ids == sorted(ids)
        assert all(sent[message_id] == level for message_id, level in got)
    assert sorted(seen) == sorted(sent)  # every message exactly once, none lost
