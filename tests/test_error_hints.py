"""Errors that say what to do, on every door (a real server, real CLI runs, boto3): a missing
queue says how to create it, a message too large the limit, its size and how to raise the limit,
and SQS says when a queue exists under a name it cannot spell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

import dirmq
from dirmq.cli import exits
from dirmq.client import RemoteStore

from .support.fixtures import http_client, serve
from .support.servers import ServerProcess, sqs_client

NO_QUEUE = "AWS.SimpleQueueService.NonExistentQueue"


# A server limit of 2kB (a size with a unit, as every size option takes one).
server = serve("--max-body-bytes", "2kB")


http = http_client()


def dirmq_cli(root: Path, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "dirmq", args[0], "--root", str(root), *args[1:]]
    return subprocess.run(
        command, input=stdin.decode(), capture_output=True, text=True, timeout=60, check=False
    )


# -- a queue that does not exist -------------------------------------------------------------
def test_the_store_says_create_it_first_and_names_the_queue(store: dirmq.Store) -> None:
    with pytest.raises(dirmq.QueueNotFound) as missing:
        store.queue("nope")
    assert str(missing.value) == "queue 'nope' does not exist: create it first"
    assert missing.value.queue == "nope"


def test_the_cli_says_dirmq_create(tmp_path: Path) -> None:
    root = tmp_path / "root"
    assert dirmq_cli(root, "create", "other").returncode == 0
    for args in (("get", "nope"), ("stats", "nope"), ("purge", "nope"), ("configure", "nope")):
        done = dirmq_cli(root, *args)
        assert done.returncode == exits.NO_QUEUE, args
        assert done.stderr == (
            "dirmq: error: queue 'nope' does not exist: `dirmq create nope` creates it\n"
        )
    put = dirmq_cli(root, "put", "nope", stdin=b"x")
    assert put.returncode == exits.NO_QUEUE
    assert put.stderr == (
        "dirmq: error: queue 'nope' does not exist: `dirmq create nope` creates it, or publish "
        "with `put --create`\n"
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/nope"), ("POST", "/nope/messages"), ("GET", "/nope/messages"), ("DELETE", "/nope")],
)
def test_the_native_api_says_put(http: httpx.Client, method: str, path: str) -> None:
    answer = http.request(method, path, content=b"x" if method == "POST" else None)
    assert answer.status_code == 404
    assert answer.json() == {
        "error": "QueueNotFound",
        "message": "queue 'nope' does not exist: PUT /nope creates it",
    }


def test_the_http_client_raises_the_servers_words(server: ServerProcess) -> None:
    with RemoteStore(server.url) as remote, pytest.raises(dirmq.QueueNotFound) as missing:
        remote.queue("deep/nope").put(b"x")
    assert str(missing.value) == "queue 'deep/nope' does not exist: PUT /deep/nope creates it"


# -- a message too large ------------------------------------------------------------------------
def test_the_queue_limit_says_how_to_raise_it(http: httpx.Client, store: dirmq.Store) -> None:
    said = (
        "message is 5 bytes; queue 'small' accepts at most 4: raise its max_message_bytes "
        '(`dirmq configure small --max-bytes SIZE`, or PUT /small {"max_message_bytes": N})'
    )
    assert http.put("/small", json={"max_message_bytes": 4}).status_code == 201
    refused = http.post("/small/messages", content=b"12345")  # refused before it is read
    assert refused.status_code == 413
    assert refused.json() == {"error": "MessageTooLarge", "message": said}
    local = store.create_queue("small", dirmq.QueueConfig(max_message_bytes=4))
    with pytest.raises(dirmq.MessageTooLarge) as too_large:
        local.put(b"12345")
    assert str(too_large.value) == said


def test_the_server_limit_says_which_option_raises_it(http: httpx.Client) -> None:
    assert http.put("/big").status_code == 201
    assert http.post("/big/messages", content=b"x" * 2000).status_code == 201
    refused = http.post("/big/messages", content=b"x" * 2001)
    assert refused.status_code == 413
    assert refused.json()["message"] == (
        "body of 2001 bytes over the server's limit of 2000 bytes (its operator raises it with "
        "`dirmq serve --max-body-bytes SIZE`)"
    )


# -- SQS: a queue whose name SQS cannot spell -----------------------------------------------
NOT_SQS = (
    "The queue {!r} exists, but its name is not a valid SQS queue name (1-80 characters of A-Z, "
    "a-z, 0-9, _ and -, and a .fifo suffix for a FIFO queue), so SQS cannot reach it: use "
    "dirmq's native API for it, or a queue whose name SQS can spell."
)


def sqs_error(call: Any, **params: Any) -> tuple[str, str]:
    with pytest.raises(ClientError) as caught:
        call(**params)
    error = caught.value.response["Error"]
    return error["Code"], error["Message"]


@pytest.mark.parametrize("name", ["deep/jobs", "dotted.jobs"])
def test_sqs_says_the_queue_exists_but_not_under_an_sqs_name(
    http: httpx.Client, server: ServerProcess, name: str
) -> None:
    assert http.put(f"/{name}").status_code == 201
    sqs = sqs_client(server.url)
    try:
        # The code stays QueueDoesNotExist, which boto3 callers catch by name.
        with pytest.raises(sqs.exceptions.QueueDoesNotExist) as caught:
            sqs.get_queue_url(QueueName=name)
        assert caught.value.response["Error"]["Code"] == NO_QUEUE
        assert caught.value.response["Error"]["Message"] == NOT_SQS.format(name)
        url = f"{server.url}/000000000000/{name}"
        assert sqs_error(sqs.send_message, QueueUrl=url, MessageBody="x") == (
            NO_QUEUE,
            NOT_SQS.format(name),
        )
        # One that does not exist at all keeps AWS's words.
        assert sqs_error(sqs.get_queue_url, QueueName=name + "-none") == (
            NO_QUEUE,
            "The specified queue does not exist.",
        )
        gone = f"{server.url}/000000000000/{name}-none"
        assert sqs_error(sqs.send_message, QueueUrl=gone, MessageBody="x") == (
            NO_QUEUE,
            "The specified queue does not exist.",
        )
    finally:
        sqs.close()
