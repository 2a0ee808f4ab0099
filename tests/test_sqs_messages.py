"""SQS message actions with boto3 against a real `dirmq serve`: sending (single and batch,
partial failures), receiving (attributes, long polls), deleting, visibility, FIFO queues, dead
letters, AWS's limits and errors, and messages crossing between SQS, the native API and the
library."""

from __future__ import annotations

import base64
import hashlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from botocore.exceptions import ClientError

import dirmq
from dirmq.sqs.md5 import md5_of_attributes

from .support.fixtures import serve
from .support.servers import ServerProcess, sqs_client, start_server

Client = Any  # boto3's SQS client (untyped)
_names = itertools.count()


server = serve()


@pytest.fixture(scope="module")
def sqs(server: ServerProcess) -> Client:
    return sqs_client(server.url)


MakeQueue = Callable[..., str]


@pytest.fixture
def make_queue(sqs: Client) -> MakeQueue:
    def make(fifo: bool = False, **attributes: str) -> str:
        name = f"m{next(_names)}-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
        if fifo:
            attributes["FifoQueue"] = "true"
        return str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])

    return make


def name_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


def error_of(call: Callable[..., Any], **kwargs: Any) -> dict[str, Any]:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    error: dict[str, Any] = info.value.response["Error"]
    return error


def receive_all(sqs: Client, url: str, **kwargs: Any) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, **kwargs
    ).get("Messages", [])
    return messages


def md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8")).hexdigest()


ATTRIBUTES = {
    "Colour": {"DataType": "String", "StringValue": "blue"},
    "Count": {"DataType": "Number", "StringValue": "42"},
    "Blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xfe"},
    "Json": {"DataType": "String.json", "StringValue": '{"a": [1, 2]}'},
    "Lines": {"DataType": "String", "StringValue": "one\ntwo"},
    "Größe": {"DataType": "String", "StringValue": "XL"},
}


def expected_md5(attributes: dict[str, dict[str, Any]]) -> str | None:
    return md5_of_attributes(
        {
            name: (spec["DataType"], spec.get("StringValue", spec.get("BinaryValue", b"")))
            for name, spec in attributes.items()
        }
    )


# -- send, receive, delete ---------------------------------------------------------------------
def test_send_receive_delete_with_attributes(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="Zoë ☃ 🐍",
        MessageAttributes=ATTRIBUTES,
        MessageSystemAttributes={"AWSTraceHeader": {"DataType": "String", "StringValue": trace}},
    )
    assert sent["MD5OfMessageBody"] == md5("Zoë ☃ 🐍")
    assert sent["MD5OfMessageAttributes"] == expected_md5(ATTRIBUTES)
    assert sent["MD5OfMessageSystemAttributes"] == "5ae4d5d7636402d80f4eb6d213245a88"  # AWS's
    assert "SequenceNumber" not in sent
    uuid.UUID(sent["MessageId"])

    (message,) = receive_all(
        sqs, url, MessageAttributeNames=["All"], MessageSystemAttributeNames=["All"]
    )
    assert message["MessageId"] == sent["MessageId"]
    assert message["Body"] == "Zoë ☃ 🐍"
    assert message["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert message["MessageAttributes"] == ATTRIBUTES
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    system = message["Attributes"]
    assert set(system) == {
        "SenderId",
        "SentTimestamp",
        "ApproximateReceiveCount",
        "ApproximateFirstReceiveTimestamp",
        "AWSTraceHeader",
    }
    assert system["ApproximateReceiveCount"] == "1"
    assert system["AWSTraceHeader"] == trace
    assert abs(int(system["SentTimestamp"]) - time.time() * 1000) < 60_000
    assert int(system["ApproximateFirstReceiveTimestamp"]) >= int(system["SentTimestamp"])

    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert receive_all(sqs, url) == []
    # Deleting again succeeds, as on AWS.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])


def test_message_attribute_filters(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(VisibilityTimeout="0")
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="msg",
        MessageAttributes={
            "Help.Me": {"DataType": "String", "StringValue": "Me"},
            "Hello": {"DataType": "String", "StringValue": "There"},
            "General": {"DataType": "String", "StringValue": "Kenobi"},
        },
    )
    assert sent["MD5OfMessageAttributes"] == "4c360f3fdafd970e05fae2f149d997f5"  # AWS's

    def received(names: list[str]) -> dict[str, Any]:
        (message,) = receive_all(sqs, url, MessageAttributeNames=names)
        return message

    assert "MessageAttributes" not in received([])
    assert "MD5OfMessageAttributes" not in received([])
    for everything in (["All"], [".*"], ["*"]):
        assert set(received(everything)["MessageAttributes"]) == {"Help.Me", "Hello", "General"}
    assert "MessageAttributes" not in received(["Foo", "Help"])
    only = received(["Hello", "General"])
    assert set(only["MessageAttributes"]) == {"Hello", "General"}
    assert only["MD5OfMessageAttributes"] == "fca026605781cb4126a1e9044df24232"  # AWS's
    assert received(["Foo", "Hello"])["MD5OfMessageAttributes"] == (
        "a311262e065454b75da111d535b8dacd"
    )
    prefixed = received(["Hel.*"])
    assert set(prefixed["MessageAttributes"]) == {"Hello", "Help.Me"}
    assert prefixed["MD5OfMessageAttributes"] == "83fee93c1bcd8b9a5a923ffacdc636c7"


def test_system_attribute_filters(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(VisibilityTimeout="0")
    sqs.send_message(QueueUrl=url, MessageBody="msg")
    (message,) = receive_all(sqs, url)
    assert "Attributes" not in message
    (message,) = receive_all(sqs, url, AttributeNames=["SenderId", "SequenceNumber"])
    assert message["Attributes"] == {"SenderId": "000000000000"}
    (message,) = receive_all(
        sqs,
        url,
        AttributeNames=["SentTimestamp"],
        MessageSystemAttributeNames=["ApproximateReceiveCount"],
    )
    assert set(message["Attributes"]) == {"SentTimestamp", "ApproximateReceiveCount"}
    assert message["Attributes"]["ApproximateReceiveCount"] == "3"


def test_send_message_batch_partial_failures(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    entries: list[dict[str, Any]] = [{"Id": f"ok{i}", "MessageBody": f"m{i}"} for i in range(7)]
    entries.append({"Id": "badchar", "MessageBody": "bell\x07"})
    entries.append(
        {
            "Id": "emptyattr",
            "MessageBody": "x",
            "MessageAttributes": {"E": {"DataType": "String", "StringValue": ""}},
        }
    )
    entries.append(
        {
            "Id": "withattr",
            "MessageBody": "y",
            "DelaySeconds": 0,
            "MessageAttributes": {"N": {"DataType": "Number", "StringValue": "1.5"}},
        }
    )
    result = sqs.send_message_batch(QueueUrl=url, Entries=entries)
    assert {s["Id"] for s in result["Successful"]} == {*(f"ok{i}" for i in range(7)), "withattr"}
    failed = {f["Id"]: f for f in result["Failed"]}
    assert set(failed) == {"badchar", "emptyattr"}
    assert failed["badchar"]["Code"] == "InvalidMessageContents"
    assert failed["badchar"]["SenderFault"] is True
    assert "#x7" in failed["badchar"]["Message"]
    assert failed["emptyattr"]["Code"] == "InvalidParameterValue"
    by_id = {s["Id"]: s for s in result["Successful"]}
    assert by_id["ok3"]["MD5OfMessageBody"] == md5("m3")
    assert by_id["withattr"]["MD5OfMessageAttributes"] == expected_md5(
        {"N": {"DataType": "Number", "StringValue": "1.5"}}
    )
    bodies = []
    for _ in range(5):
        bodies += [m["Body"] for m in receive_all(sqs, url)]
        if len(bodies) == 8:
            break
    assert sorted(bodies) == sorted([f"m{i}" for i in range(7)] + ["y"])


def test_batch_request_errors(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    send = sqs.send_message_batch
    assert error_of(send, QueueUrl=url, Entries=[])["Code"] == (
        "AWS.SimpleQueueService.EmptyBatchRequest"
    )
    eleven = [{"Id": str(i), "MessageBody": "x"} for i in range(11)]
    error = error_of(send, QueueUrl=url, Entries=eleven)
    assert error["Code"] == "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
    assert error["Message"] == "Maximum number of entries per request are 10. You have sent 11."
    for bad_id in ("a b", "x" * 81, "é", ""):
        error = error_of(send, QueueUrl=url, Entries=[{"Id": bad_id, "MessageBody": "x"}])
        assert error["Code"] == "AWS.SimpleQueueService.InvalidBatchEntryId"
    twice = [{"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}]
    error = error_of(send, QueueUrl=url, Entries=twice)
    assert error["Code"] == "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
    half = "x" * (512 * 1024)
    too_long = [{"Id": "a", "MessageBody": half}, {"Id": "b", "MessageBody": half + "y"}]
    error = error_of(send, QueueUrl=url, Entries=too_long)
    assert error["Code"] == "AWS.SimpleQueueService.BatchRequestTooLong"
    assert error["Message"] == (
        "Batch requests cannot be longer than 1048576 bytes. You have sent 1048577 bytes."
    )
    for batch_call, entry in (
        (sqs.delete_message_batch, {"ReceiptHandle": "x"}),
        (sqs.change_message_visibility_batch, {"ReceiptHandle": "x", "VisibilityTimeout": 1}),
    ):
        assert error_of(batch_call, QueueUrl=url, Entries=[])["Code"] == (
            "AWS.SimpleQueueService.EmptyBatchRequest"
        )
        many = [{"Id": str(i), **entry} for i in range(11)]
        assert error_of(batch_call, QueueUrl=url, Entries=many)["Code"] == (
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"
        )
        dup = [{"Id": "d", **entry}, {"Id": "d", **entry}]
        assert error_of(batch_call, QueueUrl=url, Entries=dup)["Code"] == (
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"
        )
        bad = [{"Id": "no.dots", **entry}]
        assert error_of(batch_call, QueueUrl=url, Entries=bad)["Code"] == (
            "AWS.SimpleQueueService.InvalidBatchEntryId"
        )
    assert receive_all(sqs, url) == []


def test_delete_and_change_visibility_batches(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"b{i}"} for i in range(4)]
    )
    messages: list[dict[str, Any]] = []
    while len(messages) < 4:
        messages += receive_all(sqs, url, VisibilityTimeout=30)
    handles = [m["ReceiptHandle"] for m in messages]
    changed = sqs.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "zero", "ReceiptHandle": handles[0], "VisibilityTimeout": 0},
            {"Id": "long", "ReceiptHandle": handles[1], "VisibilityTimeout": 600},
            {"Id": "garbage", "ReceiptHandle": "garbage", "VisibilityTimeout": 5},
            {"Id": "toolong", "ReceiptHandle": handles[2], "VisibilityTimeout": 43201},
        ],
    )
    assert {s["Id"] for s in changed["Successful"]} == {"zero", "long"}
    failed = {f["Id"]: f for f in changed["Failed"]}
    assert failed["garbage"]["Code"] == "ReceiptHandleIsInvalid"
    assert failed["toolong"]["Code"] == "InvalidParameterValue"
    (again,) = receive_all(sqs, url)  # only the one made visible
    assert again["Body"] == messages[0]["Body"]
    deleted = sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[
            {"Id": "a", "ReceiptHandle": again["ReceiptHandle"]},
            {"Id": "b", "ReceiptHandle": handles[1]},
            {"Id": "c", "ReceiptHandle": handles[2]},
            {"Id": "d", "ReceiptHandle": handles[3]},
            {"Id": "bad", "ReceiptHandle": "not-a-receipt"},
        ],
    )
    assert {s["Id"] for s in deleted["Successful"]} == {"a", "b", "c", "d"}
    assert [(f["Id"], f["Code"]) for f in deleted["Failed"]] == [("bad", "ReceiptHandleIsInvalid")]
    stats = httpx.get(f"{sqs.meta.endpoint_url}/{name_of(url)}").json()["stats"]
    assert stats["total"] == 0


# -- visibility --------------------------------------------------------------------------------
def test_change_message_visibility(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="v")
    (first,) = receive_all(sqs, url, VisibilityTimeout=1)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=30
    )
    time.sleep(1.2)
    assert receive_all(sqs, url) == []  # extended past the original second
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    (second,) = receive_all(sqs, url, VisibilityTimeout=30)  # visible again at once
    assert second["MessageId"] == first["MessageId"]
    assert second["ReceiptHandle"] != first["ReceiptHandle"]
    # A standard queue applies an old handle to the message as it is now (AWS does).
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    (third,) = receive_all(sqs, url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=third["ReceiptHandle"])
    error = error_of(
        sqs.change_message_visibility,
        QueueUrl=url,
        ReceiptHandle=third["ReceiptHandle"],
        VisibilityTimeout=5,
    )
    assert error["Code"] == "InvalidParameterValue"
    assert error["Message"] == (
        f"Value {third['ReceiptHandle']} for parameter ReceiptHandle is invalid. Reason: Message "
        "does not exist or is not available for visibility timeout change."
    )
    error = error_of(
        sqs.change_message_visibility, QueueUrl=url, ReceiptHandle="INVALID", VisibilityTimeout=5
    )
    assert error["Code"] == "ReceiptHandleIsInvalid"


def test_message_not_inflight(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="n")
    (message,) = receive_all(sqs, url, VisibilityTimeout=30)
    handle = message["ReceiptHandle"]
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    # Back in the queue, not in flight: making it visible is a no-op, hiding it is refused.
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=0)
    error = error_of(
        sqs.change_message_visibility, QueueUrl=url, ReceiptHandle=handle, VisibilityTimeout=10
    )
    assert error["Code"] == "AWS.SimpleQueueService.MessageNotInflight"
    # On a standard queue an old handle still deletes the message (AWS does too).
    sqs.delete_message(QueueUrl=url, ReceiptHandle=handle)
    assert receive_all(sqs, url) == []


def test_receipt_handle_errors(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    error = error_of(sqs.delete_message, QueueUrl=url, ReceiptHandle="garbage")
    assert error["Code"] == "ReceiptHandleIsInvalid"
    assert error["Message"] == 'The input receipt handle "garbage" is not a valid receipt handle.'
    error = error_of(
        sqs.delete_message, QueueUrl=url, ReceiptHandle="1795295446534027-347c48f9d13c"
    )
    assert error["Code"] == "ReceiptHandleIsInvalid"
    # A well-formed receipt of a message that is not there: already deleted, which succeeds.
    sqs.delete_message(QueueUrl=url, ReceiptHandle="1795295446534027-347c48f9d13c.1")


# -- receiving -----------------------------------------------------------------------------------
def test_receive_limits_and_long_poll(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    for count in (0, 11):
        error = error_of(sqs.receive_message, QueueUrl=url, MaxNumberOfMessages=count)
        assert error["Code"] == "InvalidParameterValue"
        assert error["Message"] == (
            f"Value {count} for parameter MaxNumberOfMessages is invalid. Reason: Must be "
            "between 1 and 10, if provided."
        )
    error = error_of(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=21)
    assert error["Message"] == (
        "Value 21 for parameter WaitTimeSeconds is invalid. Reason: Must be >= 0 and <= 20, "
        "if provided."
    )
    error = error_of(sqs.receive_message, QueueUrl=url, VisibilityTimeout=43201)
    assert error["Code"] == "InvalidParameterValue"
    started = time.monotonic()
    assert receive_all(sqs, url, WaitTimeSeconds=1) == []
    assert 0.9 < time.monotonic() - started < 5
    sqs.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(10)]
    )
    got: list[dict[str, Any]] = []
    while len(got) < 10:
        batch = receive_all(sqs, url)
        assert 1 <= len(batch) <= 10
        got += batch
    assert sorted(m["Body"] for m in got) == [str(i) for i in range(10)]


def test_queue_wait_time_is_the_default_long_poll(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(ReceiveMessageWaitTimeSeconds="1")
    started = time.monotonic()
    assert receive_all(sqs, url) == []
    assert 0.9 < time.monotonic() - started < 5
    started = time.monotonic()
    assert receive_all(sqs, url, WaitTimeSeconds=0) == []
    assert time.monotonic() - started < 0.9


def _receive_in_background(sqs: Client, url: str) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        out.append(
            sqs.receive_message(
                QueueUrl=url, WaitTimeSeconds=10, MessageAttributeNames=["All"]
            ).get("Messages", [])
        )

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)  # let it start waiting
    return thread, out


def test_long_poll_woken_by_native_publish(
    sqs: Client, make_queue: MakeQueue, server: ServerProcess
) -> None:
    url = make_queue()
    thread, out = _receive_in_background(sqs, url)
    started = time.monotonic()
    response = httpx.post(
        f"{server.url}/{name_of(url)}/messages",
        content=b"from the native API",
        headers={"X-Attr-Colour": "blue", "Content-Type": "text/plain"},
    )
    assert response.status_code == 201
    thread.join(10)
    assert time.monotonic() - started < 5
    (message,) = out[0]
    assert message["Body"] == "from the native API"
    assert message["MessageAttributes"] == {"Colour": {"DataType": "String", "StringValue": "blue"}}
    assert message["MessageId"] == dirmq_to_sqs_id(response.json()["id"])


def dirmq_to_sqs_id(message_id: str) -> str:
    from dirmq.sqs.ids import sqs_message_id

    return sqs_message_id(message_id)


def test_long_poll_woken_by_the_library(
    sqs: Client, make_queue: MakeQueue, server: ServerProcess
) -> None:
    url = make_queue()
    thread, out = _receive_in_background(sqs, url)
    started = time.monotonic()
    with dirmq.Store(server.root) as store:
        store.queue(name_of(url)).put(b"from the library", {"X-Attr-Colour": "blue"})
    thread.join(10)
    assert time.monotonic() - started < 5
    (message,) = out[0]
    assert message["Body"] == "from the library"
    assert message["MessageAttributes"] == {"Colour": {"DataType": "String", "StringValue": "blue"}}
    assert message["MD5OfMessageAttributes"] == expected_md5(
        {"Colour": {"DataType": "String", "StringValue": "blue"}}
    )


def test_sent_over_sqs_read_by_the_library(
    sqs: Client, make_queue: MakeQueue, server: ServerProcess
) -> None:
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="to the library", MessageAttributes=ATTRIBUTES)
    with dirmq.Store(server.root) as store:
        (message,) = store.queue(name_of(url)).get(1)
        assert message.body == b"to the library"
        headers = message.headers
        assert headers["X-Attr-Colour"] == "blue"
        assert headers["X-Sqs-Attr-Count"] == "Number;" + base64.b64encode(b"42").decode()
        assert headers["X-Sqs-Attr-Blob"] == "Binary;" + base64.b64encode(b"\x00\x01\xfe").decode()
        # The library's receipt works over SQS (and the other way round).
        assert message.receipt is not None
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message.receipt)
        assert store.queue(name_of(url)).stats().total == 0


def test_binary_library_body_is_delivered_as_text(
    sqs: Client, make_queue: MakeQueue, server: ServerProcess
) -> None:
    url = make_queue()
    with dirmq.Store(server.root) as store:
        store.queue(name_of(url)).put(b"caf\xe9")  # Latin-1, not UTF-8
    (message,) = receive_all(sqs, url)
    assert message["Body"] == "caf\ufffd"
    assert message["MD5OfBody"] == md5("caf\ufffd")


# -- sending limits --------------------------------------------------------------------------------
def test_send_limits(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    send = sqs.send_message
    assert "MessageId" in send(QueueUrl=url, MessageBody="x" * (1024 * 1024))
    error = error_of(send, QueueUrl=url, MessageBody="x" * (1024 * 1024 + 1))
    assert error["Code"] == "InvalidParameterValue"
    assert error["Message"] == (
        "One or more parameters are invalid. Reason: Message must be shorter than 1048576 bytes."
    )
    # Attributes count towards the size.
    attribute = {"A": {"DataType": "String", "StringValue": "v"}}  # 1 + 6 + 1 bytes
    error = error_of(
        send, QueueUrl=url, MessageBody="x" * (1024 * 1024 - 7), MessageAttributes=attribute
    )
    assert error["Code"] == "InvalidParameterValue"
    error = error_of(send, QueueUrl=url, MessageBody="")
    assert error["Code"] == "MissingParameter"
    for body, char in (("a\x00b", "#x0"), ("\x08", "#x8"), ("\ufffe", "#xFFFE")):
        error = error_of(send, QueueUrl=url, MessageBody=body)
        assert error["Code"] == "InvalidMessageContents"
        assert f"'{char}'" in error["Message"]
    for delay in (-1, 901):
        error = error_of(send, QueueUrl=url, MessageBody="x", DelaySeconds=delay)
        assert error["Code"] == "InvalidParameterValue"
    eleven = {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)}
    error = error_of(send, QueueUrl=url, MessageBody="x", MessageAttributes=eleven)
    assert error["Message"] == "Number of message attributes [11] exceeds the allowed maximum [10]."
    for name in ("AWS.x", "Amazon.y", ".a", "a.", "a..b", "bad name", "x" * 257):
        error = error_of(
            send,
            QueueUrl=url,
            MessageBody="x",
            MessageAttributes={name: {"DataType": "String", "StringValue": "v"}},
        )
        assert error["Code"] == "InvalidParameterValue", name
    for spec in (
        {"DataType": "String", "StringValue": ""},
        {"DataType": "String", "StringValue": "\x0b"},
        {"DataType": "Number", "StringValue": "twelve"},
        {"DataType": "Decimal", "StringValue": "1"},
        {"DataType": "Binary", "BinaryValue": b""},
    ):
        error = error_of(send, QueueUrl=url, MessageBody="x", MessageAttributes={"a": spec})
        assert error["Code"] == "InvalidParameterValue", spec
    error = error_of(
        send,
        QueueUrl=url,
        MessageBody="x",
        MessageAttributes={"a": {"DataType": "String", "StringListValues": ["a"]}},
    )
    assert error["Code"] == "AWS.SimpleQueueService.UnsupportedOperation"
    error = error_of(send, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert error["Code"] == "InvalidParameterValue"
    messages = receive_all(sqs, url)
    assert len(messages) == 1 and len(messages[0]["Body"]) == 1024 * 1024


def test_queue_maximum_message_size(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(MaximumMessageSize="1024")
    sqs.send_message(QueueUrl=url, MessageBody="x" * 1024)
    error = error_of(sqs.send_message, QueueUrl=url, MessageBody="x" * 1025)
    assert error["Message"] == (
        "One or more parameters are invalid. Reason: Message must be shorter than 1024 bytes."
    )


def test_delay_seconds(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
    sqs.send_message(QueueUrl=url, MessageBody="now")
    assert [m["Body"] for m in receive_all(sqs, url)] == ["now"]
    (later,) = receive_all(sqs, url, WaitTimeSeconds=3)
    assert later["Body"] == "later"


def test_standard_queue_message_group_is_an_attribute(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    sent = sqs.send_message(QueueUrl=url, MessageBody="tenant", MessageGroupId="tenant-1")
    assert "SequenceNumber" not in sent
    sqs.send_message(QueueUrl=url, MessageBody="tenant too", MessageGroupId="tenant-1")
    # Fair queues: a standard queue does not hold back the group's second message.
    got = receive_all(sqs, url, AttributeNames=["All"])
    assert len(got) == 2
    assert {m["Attributes"]["MessageGroupId"] for m in got} == {"tenant-1"}
    assert all("SequenceNumber" not in m["Attributes"] for m in got)


# -- FIFO ------------------------------------------------------------------------------------
def test_fifo_order_and_groups_in_flight(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True)
    sequence: dict[str, list[int]] = {"a": [], "b": []}
    for i in range(3):
        for group in ("a", "b"):
            sent = sqs.send_message(
                QueueUrl=url,
                MessageBody=f"{group}{i}",
                MessageGroupId=group,
                MessageDeduplicationId=f"{group}{i}",
            )
            assert len(sent["SequenceNumber"]) == 20
            sequence[group].append(int(sent["SequenceNumber"]))
    assert all(s == sorted(s) and len(set(s)) == 3 for s in sequence.values())

    first = sqs.receive_message(
        QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=30, AttributeNames=["All"]
    )["Messages"]
    # In sending order: a group's messages in a row, groups interleaved.
    assert [m["Body"] for m in first] == ["a0", "b0", "a1"]
    for message in first:
        attributes = message["Attributes"]
        group, n = message["Body"][0], int(message["Body"][1])
        assert attributes["MessageGroupId"] == group
        assert attributes["MessageDeduplicationId"] == message["Body"]
        assert attributes["SequenceNumber"] == str(sequence[group][n])
    assert receive_all(sqs, url) == []  # both groups have messages in flight
    a0, b0, a1 = first
    sqs.delete_message(QueueUrl=url, ReceiptHandle=a0["ReceiptHandle"])
    assert receive_all(sqs, url) == [], "a1 is still in flight"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=a1["ReceiptHandle"])
    (a2,) = receive_all(sqs, url, VisibilityTimeout=30)
    assert a2["Body"] == "a2"
    # Returning b0 puts it back first in its group, ahead of the rest of the group.
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=b0["ReceiptHandle"], VisibilityTimeout=0
    )
    assert [m["Body"] for m in receive_all(sqs, url)] == ["b0", "b1", "b2"]


def _send_groups(sqs: Client, url: str, order: str) -> None:
    """One message per letter of `order`, in its group; bodies g0, h0, g1..."""
    sent: dict[str, int] = {}
    for group in order:
        n = sent.get(group, 0)
        sent[group] = n + 1
        sqs.send_message(
            QueueUrl=url,
            MessageBody=f"{group}{n}",
            MessageGroupId=group,
            MessageDeduplicationId=f"{group}{n}",
        )


def test_fifo_receive_returns_several_messages_of_a_group(
    sqs: Client, make_queue: MakeQueue
) -> None:
    url = make_queue(fifo=True)
    _send_groups(sqs, url, "ghghg")
    got = receive_all(sqs, url, VisibilityTimeout=2)
    bodies = [m["Body"] for m in got]
    assert bodies == ["g0", "h0", "g1", "h1", "g2"]
    assert [b for b in bodies if b[0] == "g"] == ["g0", "g1", "g2"]
    assert receive_all(sqs, url) == [], "every group is in flight"
    again = receive_all(sqs, url, WaitTimeSeconds=5)  # the visibility timeout passes
    assert [m["Body"] for m in again] == bodies, "back in their order"
    assert {m["MessageId"] for m in again} == {m["MessageId"] for m in got}
    sqs.delete_message_batch(
        QueueUrl=url,
        Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(again)],
    )
    assert receive_all(sqs, url) == []


def test_fifo_group_is_held_until_all_of_a_receive_is_deleted(
    sqs: Client, make_queue: MakeQueue
) -> None:
    url = make_queue(fifo=True)
    _send_groups(sqs, url, "ggg")
    first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=30)
    g0, g1 = first["Messages"]
    assert [g0["Body"], g1["Body"]] == ["g0", "g1"]
    assert receive_all(sqs, url) == []
    sqs.delete_message(QueueUrl=url, ReceiptHandle=g0["ReceiptHandle"])
    assert receive_all(sqs, url) == [], "g1 is still in flight"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=g1["ReceiptHandle"])
    assert [m["Body"] for m in receive_all(sqs, url)] == ["g2"]


def test_concurrent_fifo_receives_never_share_a_group(sqs: Client, make_queue: MakeQueue) -> None:
    """Receives that arrive together each lease on their own: one gets the group's run, the
    others nothing (merged into one lease and split, they could share it)."""
    url = make_queue(fifo=True)
    _send_groups(sqs, url, "g" * 10)
    results: list[list[str]] = []
    barrier = threading.Barrier(6)

    def receive() -> None:
        barrier.wait()
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=2, VisibilityTimeout=30)
        results.append([m["Body"] for m in got.get("Messages", [])])

    threads = [threading.Thread(target=receive) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(results, key=len) == [[], [], [], [], [], ["g0", "g1"]]


def test_fifo_long_poll_wakes_when_the_group_is_released(
    sqs: Client, make_queue: MakeQueue
) -> None:
    url = make_queue(fifo=True)
    _send_groups(sqs, url, "gg")
    (g0,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=30)["Messages"]
    waited: list[list[dict[str, Any]]] = []
    poll = threading.Thread(target=lambda: waited.append(receive_all(sqs, url, WaitTimeSeconds=10)))
    started = time.monotonic()
    poll.start()
    time.sleep(0.5)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=g0["ReceiptHandle"])
    poll.join(15)
    assert [m["Body"] for m in waited[0]] == ["g1"]
    assert time.monotonic() - started < 5


def test_fifo_deduplication(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True)
    first = sqs.send_message(
        QueueUrl=url, MessageBody="one", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    repeat = sqs.send_message(
        QueueUrl=url, MessageBody="one again", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    assert repeat["MessageId"] == first["MessageId"]
    assert repeat["SequenceNumber"] == first["SequenceNumber"]
    batch = sqs.send_message_batch(
        QueueUrl=url,
        Entries=[
            {
                "Id": "x",
                "MessageBody": "two",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "d2",
            },
            {
                "Id": "y",
                "MessageBody": "dup",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "d2",
            },
            {
                "Id": "z",
                "MessageBody": "old",
                "MessageGroupId": "g",
                "MessageDeduplicationId": "d1",
            },
        ],
    )
    ids = {s["Id"]: s["MessageId"] for s in batch["Successful"]}
    assert ids["x"] == ids["y"] and ids["z"] == first["MessageId"]
    got = receive_all(sqs, url)
    assert [m["Body"] for m in got] == ["one", "two"]
    for message in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    assert receive_all(sqs, url) == []
    # Deleted messages still deduplicate for the interval (SQS keeps the id, so does dirmq).
    sqs.send_message(
        QueueUrl=url, MessageBody="one", MessageGroupId="g", MessageDeduplicationId="d1"
    )
    assert receive_all(sqs, url) == []


def test_fifo_content_based_deduplication(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True, ContentBasedDeduplication="true")
    first = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="g")
    again = sqs.send_message(QueueUrl=url, MessageBody="same", MessageGroupId="other")
    assert again["MessageId"] == first["MessageId"]
    explicit = sqs.send_message(
        QueueUrl=url, MessageBody="same", MessageGroupId="g", MessageDeduplicationId="mine"
    )
    assert explicit["MessageId"] != first["MessageId"]
    got = receive_all(sqs, url, AttributeNames=["MessageDeduplicationId"])
    assert got[0]["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"same").hexdigest()


def test_fifo_deduplication_scope_message_group(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True, DeduplicationScope="messageGroup")
    one = sqs.send_message(
        QueueUrl=url, MessageBody="1", MessageGroupId="g1", MessageDeduplicationId="d"
    )
    two = sqs.send_message(
        QueueUrl=url, MessageBody="2", MessageGroupId="g2", MessageDeduplicationId="d"
    )
    assert one["MessageId"] != two["MessageId"]


def test_fifo_errors(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True)
    send = sqs.send_message
    error = error_of(send, QueueUrl=url, MessageBody="x", MessageDeduplicationId="d")
    assert (error["Code"], error["Message"]) == (
        "MissingParameter",
        "The request must contain the parameter MessageGroupId.",
    )
    error = error_of(send, QueueUrl=url, MessageBody="x", MessageGroupId="g")
    assert error["Message"] == (
        "The queue should either have ContentBasedDeduplication enabled or "
        "MessageDeduplicationId provided explicitly"
    )
    error = error_of(
        send,
        QueueUrl=url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="d",
        DelaySeconds=2,
    )
    assert error["Message"] == (
        "Value 2 for parameter DelaySeconds is invalid. Reason: The request include parameter "
        "that is not valid for this queue type."
    )
    for parameter in ("MessageGroupId", "MessageDeduplicationId"):
        for value in ("group 123", "a" * 129, "é"):
            kwargs = {"MessageGroupId": "g", "MessageDeduplicationId": "d", parameter: value}
            error = error_of(send, QueueUrl=url, MessageBody="x", **kwargs)
            assert error["Message"] == (
                f"Value {value} for parameter {parameter} is invalid. Reason: {parameter} can "
                "only include alphanumeric and punctuation characters. 1 to 128 in length."
            )
    batch = sqs.send_message_batch
    error = error_of(batch, QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x"}])
    assert (error["Code"], error["Message"]) == (
        "InvalidParameterValue",
        "The request must contain the parameter MessageGroupId.",
    )
    error = error_of(
        batch, QueueUrl=url, Entries=[{"Id": "a", "MessageBody": "x", "MessageGroupId": "g"}]
    )
    assert error["Code"] == "InvalidParameterValue"
    # DelaySeconds=0 is the queue's delay, allowed.
    send(
        QueueUrl=url,
        MessageBody="x",
        MessageGroupId="g",
        MessageDeduplicationId="z",
        DelaySeconds=0,
    )


def test_fifo_expired_receipt(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True, ContentBasedDeduplication="true")
    sqs.send_message(QueueUrl=url, MessageBody="e", MessageGroupId="g")
    (first,) = receive_all(sqs, url, VisibilityTimeout=30)
    sqs.change_message_visibility(
        QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=0
    )
    (second,) = receive_all(sqs, url, VisibilityTimeout=30)
    for call, extra in (
        (sqs.delete_message, {}),
        (sqs.change_message_visibility, {"VisibilityTimeout": 10}),
    ):
        error = error_of(call, QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], **extra)
        assert error["Code"] == "InvalidParameterValue"
        assert error["Message"] == (
            f"Value {first['ReceiptHandle']} for parameter ReceiptHandle is invalid. Reason: The "
            "receipt handle has expired."
        )
    sqs.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])


def test_receive_request_attempt_id(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue(fifo=True, ContentBasedDeduplication="true")
    for i in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=f"r{i}", MessageGroupId=f"g{i}")
    first = receive_all(sqs, url, ReceiveRequestAttemptId="attempt-1", VisibilityTimeout=30)
    assert len(first) == 3
    retry = receive_all(sqs, url, ReceiveRequestAttemptId="attempt-1", VisibilityTimeout=30)
    assert [(m["MessageId"], m["ReceiptHandle"]) for m in retry] == [
        (m["MessageId"], m["ReceiptHandle"]) for m in first
    ]
    # Another attempt id receives afresh: everything is in flight.
    assert receive_all(sqs, url, ReceiveRequestAttemptId="attempt-2") == []
    # A retry after one of its messages was deleted returns the others.
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0]["ReceiptHandle"])
    retry = receive_all(sqs, url, ReceiveRequestAttemptId="attempt-1", VisibilityTimeout=30)
    assert [m["MessageId"] for m in retry] == [m["MessageId"] for m in first[1:]]
    error = error_of(sqs.receive_message, QueueUrl=url, ReceiveRequestAttemptId="has space")
    assert error["Code"] == "InvalidParameterValue"


def test_attributes_may_take_most_of_the_mebibyte(sqs: Client, make_queue: MakeQueue) -> None:
    """AWS counts attributes with the body against the 1 MiB limit; dirmq stores them as
    headers and takes as much (binary ones are stored as base64, a third larger)."""
    url = make_queue()
    text = "t" * (500 * 1024)
    blob = bytes(range(256)) * (1024 + 512)  # 384 KiB, 512 KiB as base64
    sent = sqs.send_message(
        QueueUrl=url,
        MessageBody="small",
        MessageAttributes={
            "Text": {"DataType": "String", "StringValue": text},
            "Blob": {"DataType": "Binary", "BinaryValue": blob},
        },
    )
    (message,) = receive_all(sqs, url, MessageAttributeNames=["All"])
    assert message["MessageAttributes"]["Text"]["StringValue"] == text
    assert message["MessageAttributes"]["Blob"]["BinaryValue"] == blob
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    over = {"Text": {"DataType": "String", "StringValue": "t" * (1024 * 1024)}}
    error = error_of(sqs.send_message, QueueUrl=url, MessageBody="x", MessageAttributes=over)
    assert error["Code"] == "InvalidParameterValue"
    assert "Message must be shorter than 1048576 bytes." in error["Message"]


def test_a_receive_attempt_survives_a_restart_and_spans_workers(tmp_path: Path) -> None:
    """The attempt record is a file under the root: a retry that reaches another worker, or a
    server restarted since, gets the same messages and receipts."""
    root = tmp_path / "root"
    first_server = start_server(root, "--workers", "2")
    try:
        client = sqs_client(first_server.url)
        url = client.create_queue(
            QueueName="attempts.fifo",
            Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"},
        )["QueueUrl"]
        for i in range(4):
            client.send_message(QueueUrl=url, MessageBody=f"a{i}", MessageGroupId=f"g{i % 2}")
        first = receive_all(client, url, ReceiveRequestAttemptId="lost", VisibilityTimeout=60)
        assert len(first) == 4
        handles = [(m["MessageId"], m["ReceiptHandle"]) for m in first]
        for _ in range(4):  # new connections: either worker answers
            fresh = sqs_client(first_server.url)
            again = receive_all(fresh, url, ReceiveRequestAttemptId="lost", VisibilityTimeout=60)
            assert [(m["MessageId"], m["ReceiptHandle"]) for m in again] == handles
            fresh.close()
    finally:
        assert first_server.stop() == 0
    second_server = start_server(root)
    try:
        client = sqs_client(second_server.url)
        url = client.get_queue_url(QueueName="attempts.fifo")["QueueUrl"]
        again = receive_all(client, url, ReceiveRequestAttemptId="lost", VisibilityTimeout=60)
        assert [(m["MessageId"], m["ReceiptHandle"]) for m in again] == handles
        client.delete_queue(QueueUrl=url)
        assert not (root / "@sqs" / "attempts" / "attempts.fifo").exists()
    finally:
        assert second_server.stop() == 0


# -- dead letters ----------------------------------------------------------------------------
def test_dead_letter_queue_after_max_receive_count(sqs: Client, make_queue: MakeQueue) -> None:
    dlq = make_queue()
    dlq_arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    url = make_queue()
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "RedrivePolicy": f'{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"2"}}'
        },
    )
    sent = sqs.send_message(
        QueueUrl=url, MessageBody="poison", MessageAttributes={"Colour": ATTRIBUTES["Colour"]}
    )
    for count in (1, 2):
        (message,) = receive_all(sqs, url, VisibilityTimeout=0, AttributeNames=["All"])
        assert message["Attributes"]["ApproximateReceiveCount"] == str(count)
    assert receive_all(sqs, url) == []  # the third receive moved it to the dead-letter queue
    (dead,) = receive_all(sqs, dlq, MessageAttributeNames=["All"])
    assert dead["MessageId"] == sent["MessageId"]
    assert dead["Body"] == "poison"
    provenance = {k: v for k, v in dead["MessageAttributes"].items() if k.startswith("dirmq.")}
    assert dead["MessageAttributes"] == {"Colour": ATTRIBUTES["Colour"], **provenance}
    assert provenance["dirmq.DeadReason"] == {"DataType": "String", "StringValue": "max-receives"}
    assert provenance["dirmq.DeadReceiveCount"] == {"DataType": "Number", "StringValue": "2"}


def test_unknown_queue(sqs: Client, server: ServerProcess) -> None:
    url = f"{server.url}/000000000000/no-such-queue"
    for call, kwargs in (
        (sqs.send_message, {"MessageBody": "x"}),
        (sqs.receive_message, {}),
        (sqs.delete_message, {"ReceiptHandle": "1795295446534027-347c48f9d13c.1"}),
    ):
        error = error_of(call, QueueUrl=url, **kwargs)
        assert error["Code"] == "AWS.SimpleQueueService.NonExistentQueue"


def test_md5_checked_like_the_sdks_do(sqs: Client, make_queue: MakeQueue) -> None:
    """What Java's MessageMD5ChecksumHandler (and .NET's, Go v1's) verify, end to end."""
    url = make_queue()
    attributes = {
        "timestamp": {"DataType": "Number", "StringValue": "1493147359900"},
        "attr1": {
            "DataType": "Binary",
            "BinaryValue": b"traceparent\x1e00-774062d6c37081a5a0b9b5b88e30627c-"
            b"2d2482211f6489da-01",
        },
    }
    sent = sqs.send_message(QueueUrl=url, MessageBody="test", MessageAttributes=attributes)
    assert sent["MD5OfMessageBody"] == "098f6bcd4621d373cade4e832627b4f6"
    (message,) = receive_all(sqs, url, MessageAttributeNames=["All"])
    assert message["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    received = {
        n: (v["DataType"], v.get("StringValue", v.get("BinaryValue")))
        for n, v in message["MessageAttributes"].items()
    }
    assert md5_of_attributes(received) == sent["MD5OfMessageAttributes"]


def test_full_queue_throttles(sqs: Client, make_queue: MakeQueue, server: ServerProcess) -> None:
    url = make_queue()
    response = httpx.put(f"{server.url}/{name_of(url)}", json={"capacity": 1})
    assert response.status_code == 200
    sqs.send_message(QueueUrl=url, MessageBody="fits")
    error = error_of(sqs.send_message, QueueUrl=url, MessageBody="does not")
    assert error["Code"] == "RequestThrottled"
    (message,) = receive_all(sqs, url)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
    sqs.send_message(QueueUrl=url, MessageBody="fits now")


def test_first_receive_timestamp_is_remembered(sqs: Client, make_queue: MakeQueue) -> None:
    url = make_queue()
    sqs.send_message(QueueUrl=url, MessageBody="t")
    before = time.time() * 1000
    (first,) = receive_all(sqs, url, VisibilityTimeout=0)  # no attributes asked for
    after = time.time() * 1000
    time.sleep(0.05)
    (second,) = receive_all(sqs, url, AttributeNames=["All"])
    stamp = int(second["Attributes"]["ApproximateFirstReceiveTimestamp"])
    assert before - 1 <= stamp <= after + 1
    assert second["Attributes"]["ApproximateReceiveCount"] == "2"
    assert first["MessageId"] == second["MessageId"]
