"""Bad input at the doors (issue 15): each is refused with a clear 4xx (SQS: its own error code)
and loses nothing. Real servers on 127.0.0.1, real boto3, the real CLI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dirmq.wire import jsondoc

from .servers import ServerProcess, sqs_client, start_server

DEEP = b"[" * 50_000  # what made the standard decoder recurse to a 500


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server(tmp_path_factory.mktemp("bad-input"), yaq=True)
    yield process
    process.stop()


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        yield client


# -- JSON nesting (defect 9) ----------------------------------------------------------------------
def test_the_json_decoder_bounds_nesting() -> None:
    assert jsondoc.nesting_depth(b'{"a": [[1], "[[[[", {"b": "\\"]]"}]}') == 3
    assert jsondoc.loads(b"[" * 64 + b"]" * 64) is not None
    with pytest.raises(jsondoc.JsonTooDeep, match="65 levels deep; at most 64"):
        jsondoc.loads("[" * 65 + "]" * 65)
    with pytest.raises(ValueError, match="50000 levels deep"):
        jsondoc.loads(DEEP)
    with pytest.raises(ValueError):  # malformed stays json's own ValueError
        jsondoc.loads(b'{"a": ')


def test_deep_json_in_a_queue_configuration_is_400(http: httpx.Client) -> None:
    response = http.put("/deep-config", content=DEEP)
    assert response.status_code == 400, response.text
    assert "levels deep" in response.json()["message"]
    assert http.get("/deep-config").status_code == 404  # nothing was created


def test_deep_json_in_a_batch_line_is_400_and_stores_nothing(http: httpx.Client) -> None:
    assert http.put("/deep-batch").status_code == 201
    body = b'{"body": "one"}\n' + b'{"body": "two", "headers": ' + DEEP + b"\n"
    response = http.post(
        "/deep-batch/messages", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert response.status_code == 400, response.text
    assert "line 2" in response.json()["message"]
    assert http.get("/deep-batch").json()["stats"]["total"] == 0


def test_deep_json_in_an_sqs_json_body_is_a_serialization_error(server: ServerProcess) -> None:
    response = httpx.post(
        server.url + "/",
        content=b'{"QueueUrl": ' + DEEP,
        headers={
            "X-Amz-Target": "AmazonSQS.SendMessage",
            "Content-Type": "application/x-amz-json-1.0",
        },
    )
    assert response.status_code == 400, response.text
    assert response.json()["__type"].endswith("#SerializationException")
    assert "levels deep" in response.json()["message"]


def test_deep_json_in_an_sqs_attribute_is_invalid(server: ServerProcess) -> None:
    """JSON inside a query-protocol (or JSON-protocol) value: the same bound."""
    deep = "[" * 50_000
    for attribute in ("Policy", "RedrivePolicy", "RedriveAllowPolicy"):
        response = httpx.post(
            server.url + "/",
            data={
                "Action": "CreateQueue",
                "QueueName": "deep-attr",
                "Attribute.1.Name": attribute,
                "Attribute.1.Value": deep,
            },
        )
        assert response.status_code == 400, (attribute, response.text)
        assert b"InternalError" not in response.content
    sqs = sqs_client(server.url)
    with pytest.raises(sqs.exceptions.ClientError) as caught:
        sqs.create_queue(QueueName="deep-attr", Attributes={"RedrivePolicy": deep})
    assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert "deep-attr" not in json.dumps(sqs.list_queues())
