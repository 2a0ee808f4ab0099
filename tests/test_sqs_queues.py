"""SQS queue actions against a real `dirmq serve`, through boto3 speaking each protocol (AWS
JSON 1.0, as boto3 does, and the query protocol, as older and other SDKs do), through the AWS
CLI, and next to the native API and the library on the same root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.session
import httpx
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

import dirmq
from dirmq.sqs import attributes as sqs_attributes
from dirmq.sqs.protocol_query import query_model_document

from .support.fixtures import serve
from .support.servers import ServerProcess, start_server

ACCOUNT = "000000000000"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "anything",
    "AWS_SECRET_ACCESS_KEY": "anything",
    "AWS_DEFAULT_REGION": "us-east-1",
}
NO_QUEUE = "AWS.SimpleQueueService.NonExistentQueue"


server = serve()


def make_client(server: ServerProcess, data_path: Path | None = None) -> Any:
    session = botocore.session.get_session()
    if data_path is not None:  # the query protocol: botocore reads our query model first
        session.get_component("data_loader").search_paths.insert(0, str(data_path))
    return boto3.Session(botocore_session=session).client(
        "sqs",
        endpoint_url=server.url,
        region_name="us-east-1",
        aws_access_key_id="anything",
        aws_secret_access_key="anything",
        config=Config(retries={"max_attempts": 1}),
    )


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
def name() -> str:
    return f"q-{uuid.uuid4().hex[:16]}"


def error(call: Callable[..., Any], **params: Any) -> tuple[str, str, int]:
    with pytest.raises(ClientError) as caught:
        call(**params)
    response = caught.value.response
    return (
        response["Error"]["Code"],
        response["Error"]["Message"],
        response["ResponseMetadata"]["HTTPStatusCode"],
    )


def attributes_of(sqs: Any, url: str, *names: str) -> dict[str, str]:
    return dict(
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(names or ["All"])).get(
            "Attributes", {}
        )
    )


def store_config(server: ServerProcess, name: str) -> dirmq.QueueConfig:
    with dirmq.Store(server.root) as store:
        return store.queue(name).config


def arn(name: str) -> str:
    return f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}"


# -- create, get URL, list, delete -----------------------------------------------------------------
def test_create_queue_with_sqs_defaults(sqs: Any, server: ServerProcess, name: str) -> None:
    before = int(time.time())
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert url == f"{server.url}/{ACCOUNT}/{name}"
    got = attributes_of(sqs, url)
    created = int(got.pop("CreatedTimestamp"))
    modified = int(got.pop("LastModifiedTimestamp"))
    assert before <= created <= modified <= int(time.time())
    assert got == {
        "QueueArn": arn(name),
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
        "ApproximateNumberOfMessagesDelayed": "0",
        "VisibilityTimeout": "30",
        "MaximumMessageSize": "1048576",
        "MessageRetentionPeriod": "345600",
        "DelaySeconds": "0",
        "ReceiveMessageWaitTimeSeconds": "0",
        "SqsManagedSseEnabled": "true",
    }
    config = store_config(server, name)
    assert (config.visibility_timeout_s, config.retention_s, config.max_message_bytes) == (
        30.0,
        345600.0,
        1048576,
    )
    assert sqs.get_queue_url(QueueName=name)["QueueUrl"] == url
    assert (
        sqs.get_queue_url(QueueName=name, QueueOwnerAWSAccountId="123456789012")["QueueUrl"] == url
    )


def test_create_queue_is_idempotent_only_for_the_same_attributes(sqs: Any, name: str) -> None:
    first = {"ReceiveMessageWaitTimeSeconds": "1", "DelaySeconds": "1"}
    url = sqs.create_queue(QueueName=name, Attributes=first)["QueueUrl"]
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
    assert sqs.create_queue(QueueName=name, Attributes={"DelaySeconds": "1"})["QueueUrl"] == url
    assert (
        sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "30"})["QueueUrl"] == url
    )
    assert error(sqs.create_queue, QueueName=name, Attributes={**first, "DelaySeconds": "2"}) == (
        "QueueAlreadyExists",
        "A queue already exists with the same name and a different value for attribute "
        "DelaySeconds",
        400,
    )
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "2"})
    assert (
        sqs.create_queue(QueueName=name, Attributes={**first, "DelaySeconds": "2"})["QueueUrl"]
        == url
    )
    code, _, _ = error(sqs.create_queue, QueueName=name, Attributes=first)
    assert code == "QueueAlreadyExists"


def test_json_errors_carry_the_query_compatible_codes(server: ServerProcess, name: str) -> None:
    client = make_client(server)
    try:
        client.create_queue(QueueName=name, Attributes={"DelaySeconds": "1"})
        with pytest.raises(ClientError) as caught:
            client.create_queue(QueueName=name, Attributes={"DelaySeconds": "2"})
        assert caught.value.response["Error"]["QueryErrorCode"] == "QueueNameExists"
        assert caught.value.response["Error"]["Type"] == "Sender"
        with pytest.raises(client.exceptions.QueueDoesNotExist) as missing:
            client.get_queue_url(QueueName=name + "-none")
        assert missing.value.response["Error"] == {
            "Code": NO_QUEUE,
            "Message": "The specified queue does not exist.",
            "QueryErrorCode": "QueueDoesNotExist",
            "Type": "Sender",
        }
    finally:
        client.close()


@pytest.mark.parametrize(
    ("queue_name", "attributes", "message"),
    [
        (
            "bad name",
            {},
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ),
        (
            "x" * 81,
            {},
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ),
        (
            "dot.ted",
            {},
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ),
        (
            "plain.fifo",
            {},
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        ),
        (
            "nosuffix",
            {"FifoQueue": "true"},
            "The name of a FIFO queue can only include "
            "alphanumeric characters, hyphens, or underscores, must end with .fifo suffix and be 1 "
            "to 80 in length.",
        ),
    ],
)
def test_create_queue_name_rules(
    sqs: Any, queue_name: str, attributes: dict[str, str], message: str
) -> None:
    assert error(sqs.create_queue, QueueName=queue_name, Attributes=attributes) == (
        "InvalidParameterValue",
        message,
        400,
    )


def test_names_up_to_80_characters(sqs: Any) -> None:
    longest = f"n{uuid.uuid4().hex}".ljust(80, "x")
    fifo = f"f{uuid.uuid4().hex}".ljust(75, "y") + ".fifo"
    assert sqs.create_queue(QueueName=longest)["QueueUrl"].endswith(longest)
    url = sqs.create_queue(QueueName=fifo, Attributes={"FifoQueue": "true"})["QueueUrl"]
    assert url.endswith(fifo)


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"FifoQueue": "false"}, "Unknown Attribute FifoQueue."),
        ({"ContentBasedDeduplication": "false"}, "Unknown Attribute ContentBasedDeduplication."),
        (
            {"DeduplicationScope": "queue"},
            "You can specify the DeduplicationScope only when FifoQueue is set to true.",
        ),
        (
            {"FifoThroughputLimit": "perQueue"},
            "You can specify the FifoThroughputLimit only when FifoQueue is set to true.",
        ),
        ({"Colour": "blue"}, "Unknown Attribute Colour."),
        ({"QueueArn": "arn:aws:sqs:us-east-1:1:x"}, "Unknown Attribute QueueArn."),
        ({"ApproximateNumberOfMessages": "1"}, "Unknown Attribute ApproximateNumberOfMessages."),
    ],
)
def test_attribute_names_a_standard_queue_refuses(
    sqs: Any, name: str, attributes: dict[str, str], message: str
) -> None:
    assert error(sqs.create_queue, QueueName=name, Attributes=attributes) == (
        "InvalidAttributeName",
        message,
        400,
    )
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes=attributes) == (
        "InvalidAttributeName",
        message,
        400,
    )


RANGES = [
    ("VisibilityTimeout", 0, 43200),
    ("DelaySeconds", 0, 900),
    ("MaximumMessageSize", 1024, 1048576),
    ("MessageRetentionPeriod", 60, 1209600),
    ("ReceiveMessageWaitTimeSeconds", 0, 20),
    ("KmsDataKeyReusePeriodSeconds", 60, 86400),
]


@pytest.mark.parametrize(("attribute", "low", "high"), RANGES)
def test_attribute_ranges(sqs: Any, name: str, attribute: str, low: int, high: int) -> None:
    for bad in (str(low - 1), str(high + 1), "ten", "1.5", ""):
        expected = ("InvalidAttributeValue", f"Invalid value for the parameter {attribute}.", 400)
        assert error(sqs.create_queue, QueueName=name, Attributes={attribute: bad}) == expected
    url = sqs.create_queue(QueueName=name, Attributes={attribute: str(low)})["QueueUrl"]
    extra = {"KmsMasterKeyId": "alias/aws/sqs"} if attribute.startswith("Kms") else {}
    for good in (low, high):
        sqs.set_queue_attributes(QueueUrl=url, Attributes={attribute: str(good), **extra})
        if attribute == "KmsDataKeyReusePeriodSeconds" and good == 300:
            continue
        assert attributes_of(sqs, url, attribute) == {attribute: str(good)}
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={attribute: str(high + 1)}) == (
        "InvalidAttributeValue",
        f"Invalid value for the parameter {attribute}.",
        400,
    )


def test_set_queue_attributes_reach_the_store(sqs: Any, server: ServerProcess, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    created = int(attributes_of(sqs, url, "CreatedTimestamp")["CreatedTimestamp"])
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "VisibilityTimeout": "45",
            "DelaySeconds": "5",
            "MessageRetentionPeriod": "120",
            "MaximumMessageSize": "2048",
            "ReceiveMessageWaitTimeSeconds": "7",
        },
    )
    config = store_config(server, name)
    assert config.visibility_timeout_s == 45.0
    assert config.delay_s == 5.0
    assert config.retention_s == 120.0
    assert config.max_message_bytes == 2048
    assert sqs_attributes.receive_wait_default(config) == 7
    got = attributes_of(sqs, url)
    assert int(got["CreatedTimestamp"]) == created <= int(got["LastModifiedTimestamp"])
    assert got["ReceiveMessageWaitTimeSeconds"] == "7"
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={})[0] == "MissingParameter"


def test_get_queue_attributes_selection(sqs: Any, name: str) -> None:
    url = sqs.create_queue(QueueName=name, Attributes={"DelaySeconds": "3"})["QueueUrl"]
    assert attributes_of(sqs, url, "DelaySeconds", "QueueArn") == {
        "DelaySeconds": "3",
        "QueueArn": arn(name),
    }
    # FIFO attributes of a standard queue, a policy that is not set: left out
    assert attributes_of(sqs, url, "FifoQueue", "Policy", "RedrivePolicy") == {}
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url)
    assert error(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["Nope"]) == (
        "InvalidAttributeName",
        "Unknown Attribute Nope.",
        400,
    )


def test_approximate_counters(sqs: Any, server: ServerProcess, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with dirmq.Store(server.root) as store:
        queue = store.queue(name)
        queue.put_many([dirmq.OutgoingMessage(b"a"), dirmq.OutgoingMessage(b"b")])
        queue.put(b"later", delay_s=300)
        queue.put(b"taken")
        assert queue.get_one() is not None
    got = attributes_of(
        sqs,
        url,
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    )
    assert got == {
        "ApproximateNumberOfMessages": "2",
        "ApproximateNumberOfMessagesNotVisible": "1",
        "ApproximateNumberOfMessagesDelayed": "1",
    }


def test_list_queues_prefix_and_pages(sqs: Any, server: ServerProcess) -> None:
    prefix = f"ls{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i}" for i in range(5)]
    for queue_name in names:
        sqs.create_queue(QueueName=queue_name)
    urls = [f"{server.url}/{ACCOUNT}/{n}" for n in names]
    everything = sqs.list_queues(QueueNamePrefix=prefix)
    assert everything["QueueUrls"] == urls and "NextToken" not in everything
    page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2)
    assert page["QueueUrls"] == urls[:2]
    page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, NextToken=page["NextToken"])
    assert page["QueueUrls"] == urls[2:4]
    page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=2, NextToken=page["NextToken"])
    assert page["QueueUrls"] == urls[4:] and "NextToken" not in page
    paged = sqs.get_paginator("list_queues").paginate(
        QueueNamePrefix=prefix, PaginationConfig={"PageSize": 3}
    )
    assert [u for p in paged for u in p["QueueUrls"]] == urls
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix=f"{prefix}-none")
    for bad in (0, 1001):
        code, message, _ = error(sqs.list_queues, MaxResults=bad)
        assert (
            code == "InvalidParameterValue" and f"Value {bad} for parameter MaxResults" in message
        )
    assert error(sqs.list_queues, MaxResults=1, NextToken="garbage")[0] == "InvalidParameterValue"


def test_delete_queue(sqs: Any, server: ServerProcess, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    with dirmq.Store(server.root) as store:
        assert not store.exists(name)
    assert error(sqs.get_queue_url, QueueName=name)[0] == NO_QUEUE
    assert error(sqs.delete_queue, QueueUrl=url)[0] == NO_QUEUE
    assert error(sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["All"])[0] == NO_QUEUE
    assert error(sqs.purge_queue, QueueUrl=url)[0] == NO_QUEUE
    assert error(sqs.list_queue_tags, QueueUrl=url)[0] == NO_QUEUE
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={"DelaySeconds": "1"})[0] == (
        NO_QUEUE
    )
    assert error(sqs.get_queue_url, QueueName="not a name")[0] == NO_QUEUE


def test_queue_urls_are_matched_by_name(sqs: Any, name: str) -> None:
    sqs.create_queue(QueueName=name)
    for url in (f"http://elsewhere:1/{ACCOUNT}/{name}", f"https://sqs.example/123456789012/{name}"):
        assert attributes_of(sqs, url, "QueueArn") == {"QueueArn": arn(name)}


# -- purge ----------------------------------------------------------------------------------------
def test_purge_queue_once_a_minute(sqs: Any, server: ServerProcess, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    with dirmq.Store(server.root) as store:
        store.queue(name).put_many([dirmq.OutgoingMessage(b"x")] * 3)
    sqs.purge_queue(QueueUrl=url)
    with dirmq.Store(server.root) as store:
        assert store.queue(name).stats().total == 0
    assert error(sqs.purge_queue, QueueUrl=url) == (
        "AWS.SimpleQueueService.PurgeQueueInProgress",
        f"Only one PurgeQueue operation on {name} is allowed every 60 seconds.",
        403,
    )


# -- tags -----------------------------------------------------------------------------------------
def test_tags(sqs: Any, name: str) -> None:
    url = sqs.create_queue(QueueName=name, tags={"team": "core", "cost": "1"})["QueueUrl"]
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "core", "cost": "1"}
    sqs.tag_queue(QueueUrl=url, Tags={"team": "edge", "empty": "", "odd": "<&>\r\n"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {
        "team": "edge",
        "cost": "1",
        "empty": "",
        "odd": "<&>\r\n",
    }
    sqs.untag_queue(QueueUrl=url, TagKeys=["cost", "absent"])
    assert set(sqs.list_queue_tags(QueueUrl=url)["Tags"]) == {"team", "empty", "odd"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team", "empty", "odd"])
    assert "Tags" not in sqs.list_queue_tags(QueueUrl=url)
    too_many = {f"k{i}": "v" for i in range(51)}
    assert error(sqs.tag_queue, QueueUrl=url, Tags=too_many)[0] == "InvalidParameterValue"
    assert error(sqs.tag_queue, QueueUrl=url, Tags={"k" * 129: "v"})[0] == "InvalidParameterValue"
    assert error(sqs.tag_queue, QueueUrl=url, Tags={})[0] == "MissingParameter"
    assert error(sqs.untag_queue, QueueUrl=url, TagKeys=[])[0] == "MissingParameter"


# -- FIFO -----------------------------------------------------------------------------------------
def test_fifo_queue_attributes(sqs: Any, server: ServerProcess) -> None:
    name = f"f-{uuid.uuid4().hex[:12]}.fifo"
    url = sqs.create_queue(
        QueueName=name, Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "true"}
    )["QueueUrl"]
    got = attributes_of(sqs, url)
    assert {k: got[k] for k in sqs_attributes.FIFO_ONLY} == {
        "FifoQueue": "true",
        "ContentBasedDeduplication": "true",
        "DeduplicationScope": "queue",
        "FifoThroughputLimit": "perQueue",
    }
    config = store_config(server, name)
    assert sqs_attributes.is_fifo(config) and sqs_attributes.content_based_dedup(config)
    assert error(
        sqs.create_queue,
        QueueName=name,
        Attributes={"FifoQueue": "true", "ContentBasedDeduplication": "false"},
    ) == (
        "QueueAlreadyExists",
        "A queue already exists with the same name and a different value for attribute "
        "ContentBasedDeduplication",
        400,
    )
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"FifoQueue": "true"})
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={"FifoQueue": "false"}) == (
        "InvalidAttributeValue",
        "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is not supported.",
        400,
    )
    code, _, _ = error(
        sqs.set_queue_attributes,
        QueueUrl=url,
        Attributes={"FifoThroughputLimit": "perMessageGroupId"},
    )
    assert code == "InvalidAttributeValue"
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={
            "DeduplicationScope": "messageGroup",
            "FifoThroughputLimit": "perMessageGroupId",
        },
    )
    assert attributes_of(sqs, url, "DeduplicationScope", "FifoThroughputLimit") == {
        "DeduplicationScope": "messageGroup",
        "FifoThroughputLimit": "perMessageGroupId",
    }
    assert sqs_attributes.dedup_scope(store_config(server, name)) == "messageGroup"
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={"DeduplicationScope": "x"})[
        0
    ] == ("InvalidAttributeValue")


# -- dead-letter queues ---------------------------------------------------------------------------
def test_redrive_policy_maps_to_the_dead_letter_settings(
    sqs: Any, server: ServerProcess, name: str
) -> None:
    dlq = f"{name}-dlq"
    sqs.create_queue(QueueName=dlq)
    policy = json.dumps({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": "4"})
    url = sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": policy})["QueueUrl"]
    config = store_config(server, name)
    assert (config.dead_letter_queue, config.max_receives) == (dlq, 4)
    assert json.loads(attributes_of(sqs, url, "RedrivePolicy")["RedrivePolicy"]) == {
        "deadLetterTargetArn": arn(dlq),
        "maxReceiveCount": 4,
    }
    # the same policy, written differently, is the same attribute
    same = json.dumps({"maxReceiveCount": 4, "deadLetterTargetArn": arn(dlq)})
    assert sqs.create_queue(QueueName=name, Attributes={"RedrivePolicy": same})["QueueUrl"] == url
    dlq_url = sqs.get_queue_url(QueueName=dlq)["QueueUrl"]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == [url]
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": ""})
    config = store_config(server, name)
    assert (config.dead_letter_queue, config.max_receives) == (None, None)
    assert "RedrivePolicy" not in attributes_of(sqs, url)
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url).get("queueUrls", []) == []


def test_redrive_policy_errors(sqs: Any, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    fifo = f"{name}-dlq.fifo"
    sqs.create_queue(QueueName=fifo, Attributes={"FifoQueue": "true"})
    cases = {
        "not json": "Redrive policy is not a valid JSON map.",
        json.dumps({"maxReceiveCount": 3}): "Dead-letter target ARN is missing.",
        json.dumps({"deadLetterTargetArn": arn(name + "-none"), "maxReceiveCount": 3}): (
            "Dead letter target does not exist."
        ),
        json.dumps({"deadLetterTargetArn": arn(name), "maxReceiveCount": 0}): (
            "Invalid value for maxReceiveCount: 0, valid values are from 1 to 1000 both inclusive."
        ),
        json.dumps({"deadLetterTargetArn": arn(name), "maxReceiveCount": 1001}): (
            "Invalid value for maxReceiveCount: 1001, valid values are from 1 to 1000 both "
            "inclusive."
        ),
        json.dumps({"deadLetterTargetArn": arn(fifo), "maxReceiveCount": 3}): (
            "Dead-letter queue must be same type of queue as the source."
        ),
        json.dumps({"deadLetterTargetArn": "nope", "maxReceiveCount": 3}): (
            "Invalid value for deadLetterTargetArn."
        ),
    }
    for policy, reason in cases.items():
        assert error(
            sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedrivePolicy": policy}
        ) == (
            "InvalidParameterValue",
            f"Value {policy} for parameter RedrivePolicy is invalid. Reason: {reason}",
            400,
        )


def test_redrive_allow_policy(sqs: Any, name: str) -> None:
    dlq = f"{name}-dlq"
    dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": 2})
    deny = json.dumps({"redrivePermission": "denyAll"})
    sqs.set_queue_attributes(QueueUrl=dlq_url, Attributes={"RedriveAllowPolicy": deny})
    assert attributes_of(sqs, dlq_url, "RedriveAllowPolicy") == {
        "RedriveAllowPolicy": '{"redrivePermission":"denyAll"}'
    }
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={"RedrivePolicy": policy})[
        0
    ] == ("InvalidParameterValue")
    by_queue = json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [arn(name)]})
    sqs.set_queue_attributes(QueueUrl=dlq_url, Attributes={"RedriveAllowPolicy": by_queue})
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"RedrivePolicy": policy})
    for bad in (
        "nope",
        json.dumps({"redrivePermission": "some"}),
        json.dumps({"redrivePermission": "byQueue"}),
        json.dumps({"redrivePermission": "allowAll", "sourceQueueArns": [arn(name)]}),
        json.dumps({"redrivePermission": "byQueue", "sourceQueueArns": [arn(name)] * 11}),
    ):
        code, message, _ = error(
            sqs.set_queue_attributes, QueueUrl=dlq_url, Attributes={"RedriveAllowPolicy": bad}
        )
        assert code == "InvalidParameterValue"
        assert message.startswith(f"Value {bad} for parameter RedriveAllowPolicy is invalid.")


def test_list_dead_letter_source_queues_pages(sqs: Any, server: ServerProcess, name: str) -> None:
    dlq = f"{name}-dlq"
    dlq_url = sqs.create_queue(QueueName=dlq)["QueueUrl"]
    policy = json.dumps({"deadLetterTargetArn": arn(dlq), "maxReceiveCount": 5})
    sources = [f"{name}-src{i}" for i in range(3)]
    for source in sources:
        sqs.create_queue(QueueName=source, Attributes={"RedrivePolicy": policy})
    urls = [f"{server.url}/{ACCOUNT}/{s}" for s in sources]
    assert sqs.list_dead_letter_source_queues(QueueUrl=dlq_url)["queueUrls"] == urls
    page = sqs.list_dead_letter_source_queues(QueueUrl=dlq_url, MaxResults=2)
    assert page["queueUrls"] == urls[:2]
    page = sqs.list_dead_letter_source_queues(
        QueueUrl=dlq_url, MaxResults=2, NextToken=page["NextToken"]
    )
    assert page["queueUrls"] == urls[2:] and "NextToken" not in page
    assert error(sqs.list_dead_letter_source_queues, QueueUrl=dlq_url + "-none")[0] == NO_QUEUE


# -- encryption and policy attributes (kept, not enforced) ----------------------------------------
def test_sse_attributes(sqs: Any, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.set_queue_attributes(
        QueueUrl=url,
        Attributes={"KmsMasterKeyId": "testKeyId", "KmsDataKeyReusePeriodSeconds": "6000"},
    )
    got = attributes_of(sqs, url)
    assert (got["KmsMasterKeyId"], got["KmsDataKeyReusePeriodSeconds"]) == ("testKeyId", "6000")
    assert got["SqsManagedSseEnabled"] == "false"
    sqs.set_queue_attributes(
        QueueUrl=url, Attributes={"KmsMasterKeyId": "", "KmsDataKeyReusePeriodSeconds": "300"}
    )
    got = attributes_of(sqs, url)
    assert "KmsMasterKeyId" not in got and "KmsDataKeyReusePeriodSeconds" not in got
    assert got["SqsManagedSseEnabled"] == "false"
    assert error(
        sqs.set_queue_attributes,
        QueueUrl=url,
        Attributes={"KmsMasterKeyId": "k", "SqsManagedSseEnabled": "true"},
    ) == (
        "InvalidAttributeName",
        "You can use one type of server-side encryption (SSE) at one time. You can either enable "
        "KMS SSE or SQS SSE.",
        400,
    )


def test_policy_and_permissions(sqs: Any, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    document = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "sqs:*"}]}
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": json.dumps(document)})
    assert json.loads(attributes_of(sqs, url, "Policy")["Policy"]) == document
    assert error(sqs.set_queue_attributes, QueueUrl=url, Attributes={"Policy": "{"}) == (
        "InvalidAttributeValue",
        "Invalid value for the parameter Policy.",
        400,
    )
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"Policy": ""})
    assert attributes_of(sqs, url, "Policy") == {}
    sqs.add_permission(
        QueueUrl=url, Label="alice", AWSAccountIds=["111122223333"], Actions=["SendMessage"]
    )
    statement = json.loads(attributes_of(sqs, url, "Policy")["Policy"])["Statement"][0]
    assert statement["Sid"] == "alice" and statement["Action"] == "SQS:SendMessage"
    assert error(
        sqs.add_permission, QueueUrl=url, Label="alice", AWSAccountIds=["1"], Actions=["*"]
    ) == (
        "InvalidParameterValue",
        "Value alice for parameter Label is invalid. Reason: Already exists.",
        400,
    )
    sqs.remove_permission(QueueUrl=url, Label="alice")
    assert attributes_of(sqs, url, "Policy") == {}
    assert error(sqs.remove_permission, QueueUrl=url, Label="alice") == (
        "InvalidParameterValue",
        "Value alice for parameter Label is invalid. Reason: can't find label.",
        400,
    )


# -- the same queues as the native API and the library -------------------------------------------
def test_sqs_queues_are_store_queues(sqs: Any, server: ServerProcess, name: str) -> None:
    url = sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "12"})["QueueUrl"]
    with dirmq.Store(server.root) as store:
        queue = store.queue(name)
        assert queue.config.visibility_timeout_s == 12.0
        queue.put(b"from the library")
    native = httpx.get(f"{server.url}/{name}", timeout=10).json()
    assert native["config"]["visibility_timeout_s"] == 12.0
    assert native["stats"]["ready"] == 1
    assert attributes_of(sqs, url, "ApproximateNumberOfMessages") == {
        "ApproximateNumberOfMessages": "1"
    }


def test_store_queues_are_sqs_queues(sqs: Any, server: ServerProcess, name: str) -> None:
    with dirmq.Store(server.root) as store:
        store.create_queue(name, dirmq.QueueConfig(visibility_timeout_s=12.5, delay_s=2))
        store.create_queue(f"{name}/nested")
    assert httpx.put(f"{server.url}/{name}-native", timeout=10).status_code == 201
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    got = attributes_of(sqs, url)
    assert (got["VisibilityTimeout"], got["DelaySeconds"]) == ("12", "2")
    assert got["MessageRetentionPeriod"] == "1209600"  # no retention: SQS's longest
    assert got["MaximumMessageSize"] == "1048576"  # the store allows more; SQS does not
    assert "FifoQueue" not in got and int(got["CreatedTimestamp"]) > 0
    listed = sqs.list_queues(QueueNamePrefix=name)["QueueUrls"]
    assert listed == [url, f"{server.url}/{ACCOUNT}/{name}-native"]  # not the nested one
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
    sqs.tag_queue(QueueUrl=url, Tags={"made": "natively"})
    with dirmq.Store(server.root) as store:
        config = store.queue(name).config
    assert config.visibility_timeout_s == 12.5  # tagging changed nothing else
    assert config.metadata["sqs"]["tags"] == {"made": "natively"}


# -- the AWS CLI ----------------------------------------------------------------------------------
def aws(server: ServerProcess, tmp_path: Path, *args: str) -> Any:
    env = {
        **os.environ,
        **CREDENTIALS,
        "AWS_CONFIG_FILE": str(tmp_path / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_PAGER": "",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "awscli",
            "sqs",
            *args,
            "--endpoint-url",
            server.url,
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout) if done.stdout.strip() else None


def test_aws_cli(server: ServerProcess, tmp_path: Path) -> None:
    name = f"cli-{uuid.uuid4().hex[:12]}"
    created = aws(
        server, tmp_path, "create-queue", "--queue-name", name, "--attributes", "DelaySeconds=3"
    )
    url = created["QueueUrl"]
    assert url == f"{server.url}/{ACCOUNT}/{name}"
    assert aws(server, tmp_path, "list-queues", "--queue-name-prefix", name) == {"QueueUrls": [url]}
    got = aws(
        server, tmp_path, "get-queue-attributes", "--queue-url", url, "--attribute-names", "All"
    )
    assert got["Attributes"]["DelaySeconds"] == "3"
    assert got["Attributes"]["QueueArn"] == arn(name)


def test_queue_deleted_recently_when_asked_for(tmp_path: Path, name: str) -> None:
    """With --sqs-delay-recently-deleted, CreateQueue of a name deleted less than 60 s ago is
    refused with AWS's error, by every worker (the deletion is a file under the root); once
    the minute is over it succeeds. Without the flag (the module's server) it succeeds at once."""
    root = tmp_path / "root"
    srv = start_server(root, "--sqs-delay-recently-deleted", "--workers", "2")
    try:
        client = make_client(srv)
        url = client.create_queue(QueueName=name)["QueueUrl"]
        client.delete_queue(QueueUrl=url)
        for _ in range(6):  # on either worker
            with pytest.raises(ClientError) as refused:
                client.create_queue(QueueName=name)
            error = refused.value.response["Error"]
            assert error["Code"] == "AWS.SimpleQueueService.QueueDeletedRecently"
            assert error["Message"] == (
                "You must wait 60 seconds after deleting a queue before you can create another "
                "with the same name."
            )
        other = client.create_queue(QueueName=f"{name}-other")["QueueUrl"]
        assert other.endswith(f"/{name}-other")
        marker = root / "@sqs" / "deleted" / name
        minute_ago = time.time() - 61
        os.utime(marker, (minute_ago, minute_ago))
        assert client.create_queue(QueueName=name)["QueueUrl"] == url
        assert not marker.exists()
        assert (
            subprocess.run(
                [sys.executable, "-m", "dirmq", "fsck", "--root", str(root)],
                capture_output=True,
                check=False,
            ).returncode
            == 0
        ), "fsck knows @sqs"
        client.close()
    finally:
        assert srv.stop() == 0


def test_a_deleted_queue_can_be_created_again_at_once_by_default(sqs: Any, name: str) -> None:
    url = sqs.create_queue(QueueName=name)["QueueUrl"]
    sqs.delete_queue(QueueUrl=url)
    assert sqs.create_queue(QueueName=name)["QueueUrl"] == url
