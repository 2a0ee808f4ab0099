"""Behaviours recorded against AWS itself (what third-party SQS conformance suites check), each
run with boto3 against a real `dirmq serve`, in both protocols where the protocol matters."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

from dirmq.sqs.protocol_query import query_model_document

from .support.fixtures import serve
from .support.servers import ServerProcess
from .test_sqs_queues import make_client

TRACE = "Root=1-3152b799-8954dae64eda91bc9a23a7e8;Parent=7fa8c0f79203be72;Sampled=1"


server = serve()


@pytest.fixture(scope="module")
def query_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("botocore-data")
    folder = root / "sqs" / "2012-11-05"
    folder.mkdir(parents=True)
    (folder / "service-2.json").write_text(json.dumps(query_model_document()))
    return root


@pytest.fixture(scope="module", params=["json", "query"])
def sqs(request: pytest.FixtureRequest, server: ServerProcess, query_data: Path) -> Iterator[Any]:
    client = make_client(server, query_data if request.param == "query" else None)
    assert client.meta.service_model.protocol == request.param
    yield client
    client.close()


@pytest.fixture
def make_queue(sqs: Any) -> Callable[..., str]:
    def make(fifo: bool = False, **attributes: str) -> str:
        name = f"c-{uuid.uuid4().hex[:12]}" + (".fifo" if fifo else "")
        if fifo:
            attributes["FifoQueue"] = "true"
        return str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])

    return make


def error(call: Callable[..., Any], **params: Any) -> tuple[str, str, int]:
    with pytest.raises(ClientError) as caught:
        call(**params)
    response = caught.value.response
    return (
        response["Error"]["Code"],
        response["Error"]["Message"],
        response["ResponseMetadata"]["HTTPStatusCode"],
    )


# -- message system attributes ----------------------------------------------------------------
def test_trace_header_of_the_request_is_the_aws_trace_header(
    sqs: Any, make_queue: Callable[..., str]
) -> None:
    url = make_queue()

    def add_trace(request: Any, **_kwargs: Any) -> None:
        request.headers["X-Amzn-Trace-Id"] = TRACE

    events = sqs.meta.events
    for event in ("before-send.sqs.SendMessage", "before-send.sqs.SendMessageBatch"):
        events.register(event, add_trace)
    try:
        sent = sqs.send_message(QueueUrl=url, MessageBody="one")
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "two"}])
        given = sqs.send_message(
            QueueUrl=url,
            MessageBody="three",
            MessageSystemAttributes={
                "AWSTraceHeader": {"DataType": "String", "StringValue": "Root=given"}
            },
        )
    finally:
        for event in ("before-send.sqs.SendMessage", "before-send.sqs.SendMessageBatch"):
            events.unregister(event, add_trace)
    assert "MD5OfMessageSystemAttributes" not in sent  # the header is no request attribute
    assert "MD5OfMessageSystemAttributes" in given
    received = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["AWSTraceHeader"]
    )["Messages"]
    traces = {m["Body"]: m.get("Attributes", {}).get("AWSTraceHeader") for m in received}
    assert traces == {"one": TRACE, "two": TRACE, "three": "Root=given"}
    sqs.send_message(QueueUrl=url, MessageBody="four")  # no header: no trace
    (plain,) = sqs.receive_message(QueueUrl=url, AttributeNames=["All"])["Messages"]
    assert "AWSTraceHeader" not in plain["Attributes"]


# -- receipts after the visibility timeout ----------------------------------------------------
def test_fifo_receipt_expires_with_its_visibility_timeout(
    sqs: Any, make_queue: Callable[..., str]
) -> None:
    url = make_queue(fifo=True, VisibilityTimeout="1", ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=url, MessageBody="expires", MessageGroupId="g")
    sqs.send_message(QueueUrl=url, MessageBody="extended", MessageGroupId="h")
    received = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    handles = {m["Body"]: m["ReceiptHandle"] for m in received}
    assert set(handles) == {"expires", "extended"}
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=handles["extended"], VisibilityTimeout=10
    )
    time.sleep(1.3)
    expired = (
        "InvalidParameterValue",
        f"Value {handles['expires']} for parameter ReceiptHandle is invalid. Reason: The "
        "receipt handle has expired.",
        400,
    )
    assert error(sqs.delete_message, QueueUrl=url, ReceiptHandle=handles["expires"]) == expired
    assert (
        error(
            sqs.change_message_visibility,
            QueueUrl=url,
            ReceiptHandle=handles["expires"],
            VisibilityTimeout=10,
        )
        == expired
    )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handles["extended"])  # extended in time
    (again,) = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert again["Body"] == "expires"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])  # deleted: no error


def test_standard_receipt_still_works_after_its_visibility_timeout(
    sqs: Any, make_queue: Callable[..., str]
) -> None:
    url = make_queue(VisibilityTimeout="1")
    sqs.send_message(QueueUrl=url, MessageBody="late")
    (message,) = sqs.receive_message(QueueUrl=url)["Messages"]
    time.sleep(1.3)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=2
    )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    counters = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert counters == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


# -- FIFO deduplication -----------------------------------------------------------------------
def test_purge_forgets_fifo_deduplication_ids(sqs: Any, make_queue: Callable[..., str]) -> None:
    url = make_queue(fifo=True)
    ids = {"MessageGroupId": "g", "MessageDeduplicationId": "same"}
    first = sqs.send_message(QueueUrl=url, MessageBody="before", **ids)
    duplicate = sqs.send_message(QueueUrl=url, MessageBody="duplicate", **ids)
    assert duplicate["MessageId"] == first["MessageId"]
    assert duplicate["SequenceNumber"] == first["SequenceNumber"]
    sqs.purge_queue(QueueUrl=url)
    after = sqs.send_message(QueueUrl=url, MessageBody="after", **ids)
    assert after["MessageId"] != first["MessageId"]
    assert int(after["SequenceNumber"]) > int(first["SequenceNumber"])
    again = sqs.send_message(QueueUrl=url, MessageBody="after again", **ids)
    assert again["MessageId"] == after["MessageId"]  # deduplicated again from the purge on
    (message,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)["Messages"]
    assert message["Body"] == "after"


# -- the query protocol at a queue's URL -------------------------------------------------------
@pytest.mark.parametrize("action", ["CreateQueue", "ListQueues"])
def test_account_actions_are_invalid_at_a_queue_url(
    sqs: Any, make_queue: Callable[..., str], action: str
) -> None:
    url = make_queue()
    answer = httpx.get(url, params={"Action": action, "QueueName": "x", "Version": "2012-11-05"})
    assert answer.status_code == 400
    assert "<Type>Sender</Type>" in answer.text
    assert "<Code>InvalidAction</Code>" in answer.text
    assert f"<Message>The action {action} is not valid for this endpoint.</Message>" in answer.text


def test_queue_url_parameter_wins_over_the_url_posted_to(
    sqs: Any, make_queue: Callable[..., str]
) -> None:
    first, second = make_queue(), make_queue()
    other_name = second.rsplit("/", 1)[1]
    answer = httpx.get(
        first,
        params={
            "Action": "GetQueueAttributes",
            "QueueUrl": second,
            "AttributeName.1": "QueueArn",
        },
    )
    assert answer.status_code == 200
    assert f"<Value>arn:aws:sqs:us-east-1:000000000000:{other_name}</Value>" in answer.text
    answer = httpx.get(first, params={"Action": "GetQueueUrl", "QueueName": other_name})
    assert answer.status_code == 200
    assert f"<QueueUrl>{second}</QueueUrl>" in answer.text


# -- permissions and tags ---------------------------------------------------------------------
def test_add_permission_limits(sqs: Any, make_queue: Callable[..., str]) -> None:
    url = make_queue()

    def add(actions: list[str], accounts: list[str] | None = None) -> tuple[str, str, int]:
        return error(
            sqs.add_permission,
            QueueUrl=url,
            Label="share",
            AWSAccountIds=["111111111111"] if accounts is None else accounts,
            Actions=actions,
        )

    assert add(["SendMessage"] * 8) == (
        "OverLimit",
        "8 Actions were found, maximum allowed is 7.",
        403,
    )
    assert add(["CreateQueue"]) == (
        "InvalidParameterValue",
        "Value SQS:CreateQueue for parameter ActionName is invalid. Reason: Only the queue owner "
        "is allowed to invoke this action.",
        400,
    )
    assert add(["Juggle"])[1] == (
        "Value SQS:Juggle for parameter ActionName is invalid. Reason: Please refer to the "
        "appropriate WSDL for a list of valid actions."
    )
    assert add(["SendMessage"], accounts=[]) == (
        "InvalidParameterValue",
        "Value [] for parameter PrincipalId is invalid. Reason: Unable to verify.",
        400,
    )
    sqs.add_permission(
        QueueUrl=url,
        Label="share",
        AWSAccountIds=["111111111111"],
        Actions=["SendMessage", "ReceiveMessage", "*"],
    )


def test_too_many_tags(sqs: Any, make_queue: Callable[..., str]) -> None:
    url = make_queue()
    name = url.rsplit("/", 1)[1]
    sqs.tag_queue(QueueUrl=url, Tags={f"k{i}": "v" for i in range(50)})
    assert error(sqs.tag_queue, QueueUrl=url, Tags={"one-more": "v"}) == (
        "InvalidParameterValue",
        f"Too many tags added for queue {name}.",
        400,
    )
    sqs.tag_queue(QueueUrl=url, Tags={"k0": "overwritten"})  # not a new tag: allowed
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"]["k0"] == "overwritten"
