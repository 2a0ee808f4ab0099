"""SQS tags follow the rule of message bodies: a lone surrogate (a query-protocol byte that was
not UTF-8, or a JSON escape) or a control character is InvalidParameterValue, and nothing of the
request is stored, over the query protocol (raw) and the JSON protocol (boto3 and raw)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .support.fixtures import serve
from .support.servers import ServerProcess, sqs_client

BAD_TEXT = ["\udcff", "tab\tok but bell\x07", "nul\x00"]


server = serve()


@pytest.fixture(scope="module")
def sqs(server: ServerProcess) -> Any:
    return sqs_client(server.url)


def query(server: ServerProcess, form: str) -> httpx.Response:
    """A query-protocol request, its percent-escapes sent exactly as written."""
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    return httpx.post(server.url + "/", content=form.encode("ascii"), headers=headers, timeout=30)


def json_call(server: ServerProcess, target: str, document: dict[str, Any]) -> httpx.Response:
    """A JSON-protocol request; `json.dumps` escapes a lone surrogate as `\\udcff`."""
    headers = {
        "X-Amz-Target": f"AmazonSQS.{target}",
        "Content-Type": "application/x-amz-json-1.0",
    }
    return httpx.post(server.url + "/", content=json.dumps(document), headers=headers, timeout=30)


@pytest.mark.parametrize("bad", BAD_TEXT)
@pytest.mark.parametrize("where", ["key", "value"])
def test_tag_queue_refuses_text_that_is_not_valid(
    server: ServerProcess, sqs: Any, bad: str, where: str
) -> None:
    url = sqs.create_queue(QueueName="tagged", tags={"team": "core"})["QueueUrl"]
    tags = {bad: "v"} if where == "key" else {"k": bad}
    with pytest.raises(sqs.exceptions.ClientError) as caught:
        sqs.tag_queue(QueueUrl=url, Tags=tags)
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
    assert f"in a tag {where}" in caught.value.response["Error"]["Message"]
    raw = json_call(server, "TagQueue", {"QueueUrl": url, "Tags": tags})
    assert raw.status_code == 400, raw.text
    assert raw.json()["__type"] == "com.amazonaws.sqs#InvalidParameterValueException"
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core"}


@pytest.mark.parametrize("where", ["Key", "Value"])
@pytest.mark.parametrize("escaped", ["%FF%FE", "%07", "caf%E9"])
def test_query_protocol_tags_not_valid_are_refused(
    server: ServerProcess, sqs: Any, where: str, escaped: str
) -> None:
    name = f"tagged-{where}-{escaped.replace('%', '')}"  # a queue of its own: tags add up
    url = sqs.create_queue(QueueName=name, tags={"team": "core"})["QueueUrl"]
    tag = {"Key": "k", "Value": "v", where: escaped}
    form = f"Action=TagQueue&QueueUrl={url}&Tag.1.Key={tag['Key']}&Tag.1.Value={tag['Value']}"
    response = query(server, form)
    assert response.status_code == 400, response.text
    assert "<Code>InvalidParameterValue</Code>" in response.text
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core"}
    # Valid UTF-8, percent-encoded, is a tag like any other.
    ok = query(server, f"Action=TagQueue&QueueUrl={url}&Tag.1.Key=caf%C3%A9&Tag.1.Value=ok")
    assert ok.status_code == 200, ok.text
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core", "café": "ok"}


@pytest.mark.parametrize("bad", BAD_TEXT)
def test_create_queue_with_tags_not_valid_creates_nothing(
    server: ServerProcess, sqs: Any, bad: str
) -> None:
    with pytest.raises(sqs.exceptions.ClientError) as caught:
        sqs.create_queue(QueueName="never-json", tags={"k": bad})
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
    response = query(server, "Action=CreateQueue&QueueName=never-query&Tag.1.Key=%FF&Tag.1.Value=v")
    assert response.status_code == 400, response.text
    assert "<Code>InvalidParameterValue</Code>" in response.text
    names = sqs.list_queues(QueueNamePrefix="never").get("QueueUrls", [])
    assert names == []
