"""The two SQS wire protocols: the query protocol (form-encoded requests, XML answers) checked
against botocore's own query serializer and parser for every operation of the SQS model, then
both protocols end to end against a real server, with raw HTTP (what other SDKs and a conformance
suite send), including their error answers."""

from __future__ import annotations

import base64
import copy
import json
import uuid
import xml.etree.ElementTree as ET
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from botocore.loaders import create_loader
from botocore.model import ServiceModel
from botocore.parsers import create_parser
from botocore.serialize import create_serializer

from dirmq.server.contract import Request
from dirmq.sqs import protocol_json, protocol_query
from dirmq.sqs.errors import SqsError

from .support.fixtures import http_client, serve
from .support.servers import ServerProcess

NS = {"sqs": protocol_query.XMLNS}
TRICKY = "v <&> \"'\r\n\tdé😀"  # escaping, XML line-end normalisation, non-ASCII


# -- samples of any shape --------------------------------------------------------------------------
def sample(shape: Any, depth: int = 0) -> Any:
    """A value for `shape` as a botocore client takes it (blobs as bytes)."""
    kind = shape.type_name
    if kind == "structure":
        return {name: sample(member, depth + 1) for name, member in shape.members.items()}
    if kind == "list":
        return [sample(shape.member, depth + 1), sample(shape.member, depth + 1)]
    if kind == "map":
        return {f"k{i}.{TRICKY}": sample(shape.value, depth + 1) for i in range(2)}
    if kind in ("integer", "long"):
        return 42
    if kind == "boolean":
        return True
    if kind == "blob":
        return b"\x00\xff blob \r\n"
    if kind in ("float", "double"):
        return 1.5
    if shape.enum:
        return shape.enum[-1]
    return TRICKY


def as_json(shape: Any, value: Any) -> Any:
    """`value` as the JSON protocol carries it (blobs as base64 text)."""
    kind = shape.type_name
    if kind == "structure":
        return {k: as_json(shape.members[k], v) for k, v in value.items()}
    if kind == "list":
        return [as_json(shape.member, v) for v in value]
    if kind == "map":
        return {k: as_json(shape.value, v) for k, v in value.items()}
    if kind == "blob":
        return base64.b64encode(value).decode()
    return value


def form_request(
    body: dict[str, Any], path: str = "/", query: dict[str, str] | None = None
) -> Request:
    encoded = urlencode(body).encode()
    headers = {"content-type": "application/x-www-form-urlencoded; charset=utf-8", "host": "h:1"}
    return Request("POST", path, query or {}, headers, encoded, True)


MODEL = protocol_query.query_model()
OPERATIONS = sorted(MODEL.operation_names)


# -- the query protocol against botocore's query serializer and parser ----------------------------
@pytest.mark.parametrize("action", OPERATIONS)
def test_every_input_shape_parses_as_botocore_serializes_it(action: str) -> None:
    operation = MODEL.operation_model(action)
    params = sample(operation.input_shape)
    serialized = create_serializer("query").serialize_to_request(params, operation)
    assert serialized["body"]["Action"] == action
    parsed_action, parsed = protocol_query.parse(form_request(serialized["body"]))
    assert parsed_action == action
    assert parsed == as_json(operation.input_shape, params)


@pytest.mark.parametrize(
    "action", [a for a in OPERATIONS if MODEL.operation_model(a).output_shape is not None]
)
def test_every_output_shape_renders_as_botocore_parses_it(action: str) -> None:
    operation = MODEL.operation_model(action)
    value = sample(operation.output_shape)
    response = protocol_query.render(action, as_json(operation.output_shape, value), "rid-1")
    assert response.status == 200
    parsed = create_parser("query").parse(
        {"body": response.body, "headers": dict(response.headers), "status_code": 200},
        operation.output_shape,
    )
    assert parsed.pop("ResponseMetadata")["RequestId"] == "rid-1"
    assert parsed == value


@pytest.mark.parametrize("action", ["DeleteQueue", "PurgeQueue", "TagQueue"])
def test_actions_without_output_answer_an_empty_response(action: str) -> None:
    body = protocol_query.render(action, {}, "rid-2").body.decode()
    root = ET.fromstring(body)
    assert root.tag == f"{{{protocol_query.XMLNS}}}{action}Response"
    assert root.find("sqs:ResponseMetadata/sqs:RequestId", NS).text == "rid-2"  # type: ignore[union-attr]
    assert root.find(f"sqs:{action}Result", NS) is None


def test_the_legacy_query_names_are_what_query_sdks_send() -> None:
    operation = MODEL.operation_model("SendMessageBatch")
    params = {
        "QueueUrl": "http://h/1/q",
        "Entries": [
            {
                "Id": "a",
                "MessageBody": "b",
                "MessageAttributes": {"n": {"DataType": "Binary", "BinaryValue": b"\x01"}},
            }
        ],
    }
    body = create_serializer("query").serialize_to_request(params, operation)["body"]
    assert body["SendMessageBatchRequestEntry.1.Id"] == "a"
    assert body["SendMessageBatchRequestEntry.1.MessageAttribute.1.Name"] == "n"
    assert body["SendMessageBatchRequestEntry.1.MessageAttribute.1.Value.BinaryValue"] == "AQ=="
    create = create_serializer("query").serialize_to_request(
        {"QueueName": "q", "Attributes": {"DelaySeconds": "1"}, "tags": {"k": "v"}},
        MODEL.operation_model("CreateQueue"),
    )["body"]
    assert create["Attribute.1.Name"] == "DelaySeconds" and create["Tag.1.Key"] == "k"


def test_json_member_names_are_accepted_too() -> None:
    """A client that serializes with the JSON model's names (`Attributes.1.key`)."""
    document = copy.deepcopy(create_loader().load_service_model("sqs", "service-2"))
    document["metadata"]["protocol"] = "query"
    operation = ServiceModel(document, "sqs").operation_model("SetQueueAttributes")
    params = {"QueueUrl": "u", "Attributes": {"DelaySeconds": "3", "Policy": "{}"}}
    body = create_serializer("query").serialize_to_request(params, operation)["body"]
    assert "Attributes.1.key" in body
    assert protocol_query.parse(form_request(body)) == ("SetQueueAttributes", params)


def test_empty_lists_and_maps() -> None:
    _, params = protocol_query.parse(
        form_request({"Action": "GetQueueAttributes", "QueueUrl": "u", "AttributeNames": ""})
    )
    assert params == {"QueueUrl": "u", "AttributeNames": []}


def test_indices_are_ordered_numerically() -> None:
    body = {"Action": "UntagQueue", "QueueUrl": "u"}
    body.update({f"TagKey.{i}": f"k{i}" for i in (10, 2, 1)})
    assert protocol_query.parse(form_request(body))[1]["TagKeys"] == ["k1", "k2", "k10"]


def test_query_string_parameters_and_queue_url_from_the_path() -> None:
    request = Request(
        "GET",
        "/000000000000/orders",
        {"Action": "GetQueueAttributes", "AttributeName.1": "All"},
        {"host": "example:9"},
        b"",
        True,
    )
    assert protocol_query.parse(request) == (
        "GetQueueAttributes",
        {"QueueUrl": "http://example:9/000000000000/orders", "AttributeNames": ["All"]},
    )


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("MaxNumberOfMessages", "ten", "InvalidParameterValue"),
        ("WaitTimeSeconds", "1.5", "InvalidParameterValue"),
    ],
)
def test_malformed_scalars(field: str, value: str, code: str) -> None:
    body = {"Action": "ReceiveMessage", "QueueUrl": "u", field: value}
    with pytest.raises(SqsError) as caught:
        protocol_query.parse(form_request(body))
    assert caught.value.kind.code == code
    assert f"Value {value} for parameter {field} is invalid" in caught.value.message


def test_unknown_action() -> None:
    with pytest.raises(SqsError) as caught:
        protocol_query.parse(form_request({"Action": "MakeCoffee"}))
    assert caught.value.kind.query_code == "InvalidAction"
    assert caught.value.message == "The action MakeCoffee is not valid for this endpoint."


def test_error_response_is_escaped_xml() -> None:
    response = protocol_query.render_error(SqsError("InvalidParameterValue", "a <b> & c"), "rid")
    assert response.status == 400
    error = ET.fromstring(response.body).find("sqs:Error", NS)
    assert error is not None
    assert [child.text for child in error] == ["Sender", "InvalidParameterValue", "a <b> & c", None]


# -- end to end, raw HTTP --------------------------------------------------------------------------
server = serve()


http = http_client()


def unique(prefix: str = "p") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def query(http: httpx.Client, action: str, path: str = "/", **params: str) -> httpx.Response:
    return http.post(path, data={"Action": action, "Version": "2012-11-05", **params})


def xml(response: httpx.Response) -> ET.Element:
    assert response.headers["content-type"] == "text/xml"
    return ET.fromstring(response.content)


def test_query_create_queue_and_attributes(http: httpx.Client, server: ServerProcess) -> None:
    name = unique()
    response = query(
        http,
        "CreateQueue",
        QueueName=name,
        **{"Attribute.1.Name": "VisibilityTimeout", "Attribute.1.Value": "45"},
        **{"Tag.1.Key": "team", "Tag.1.Value": "a&b <c>\r\n"},
    )
    assert response.status_code == 200
    root = xml(response)
    assert root.tag == f"{{{protocol_query.XMLNS}}}CreateQueueResponse"
    url = root.findtext("sqs:CreateQueueResult/sqs:QueueUrl", namespaces=NS)
    assert url == f"{server.url}/000000000000/{name}"
    assert root.findtext("sqs:ResponseMetadata/sqs:RequestId", namespaces=NS)
    assert response.headers["x-amzn-requestid"] == root.findtext(
        "sqs:ResponseMetadata/sqs:RequestId", namespaces=NS
    )

    got = xml(query(http, "GetQueueAttributes", QueueUrl=url, **{"AttributeName.1": "All"}))
    attributes = {
        a.findtext("sqs:Name", namespaces=NS): a.findtext("sqs:Value", namespaces=NS)
        for a in got.findall("sqs:GetQueueAttributesResult/sqs:Attribute", NS)
    }
    assert attributes["VisibilityTimeout"] == "45"
    assert attributes["QueueArn"] == f"arn:aws:sqs:us-east-1:000000000000:{name}"

    tags = xml(query(http, "ListQueueTags", QueueUrl=url)).findall(
        "sqs:ListQueueTagsResult/sqs:Tag", NS
    )
    assert [
        (t.findtext("sqs:Key", namespaces=NS), t.findtext("sqs:Value", namespaces=NS)) for t in tags
    ] == [("team", "a&b <c>\r\n")]


def test_query_by_get_and_on_the_queue_path(http: httpx.Client, server: ServerProcess) -> None:
    name = unique("get")
    assert query(http, "CreateQueue", QueueName=name).status_code == 200
    listed = xml(http.get("/", params={"Action": "ListQueues", "QueueNamePrefix": name}))
    assert [u.text for u in listed.findall("sqs:ListQueuesResult/sqs:QueueUrl", NS)] == [
        f"{server.url}/000000000000/{name}"
    ]
    # Older SDKs post to the queue's URL and leave QueueUrl out.
    root = xml(
        query(
            http, "GetQueueAttributes", f"/000000000000/{name}", **{"AttributeName.1": "QueueArn"}
        )
    )
    assert root.findtext("sqs:GetQueueAttributesResult/sqs:Attribute/sqs:Value", namespaces=NS) == (
        f"arn:aws:sqs:us-east-1:000000000000:{name}"
    )


def query_error(response: httpx.Response) -> tuple[int, str, str, str]:
    root = xml(response)
    assert root.tag == f"{{{protocol_query.XMLNS}}}ErrorResponse"
    assert root.findtext("sqs:RequestId", namespaces=NS)
    return (
        response.status_code,
        root.findtext("sqs:Error/sqs:Type", namespaces=NS) or "",
        root.findtext("sqs:Error/sqs:Code", namespaces=NS) or "",
        root.findtext("sqs:Error/sqs:Message", namespaces=NS) or "",
    )


def test_query_errors(http: httpx.Client) -> None:
    assert query_error(query(http, "GetQueueUrl", QueueName=unique("none"))) == (
        400,
        "Sender",
        "AWS.SimpleQueueService.NonExistentQueue",
        "The specified queue does not exist for this wsdl version.",
    )
    assert query_error(query(http, "Brew")) == (
        400,
        "Sender",
        "InvalidAction",
        "The action Brew is not valid for this endpoint.",
    )
    assert query_error(query(http, "GetQueueUrl")) == (
        400,
        "Sender",
        "MissingParameter",
        "The request must contain the parameter QueueName.",
    )
    name = unique("err")
    query(http, "CreateQueue", QueueName=name)
    assert query_error(
        query(
            http,
            "CreateQueue",
            QueueName=name,
            **{"Attribute.1.Name": "DelaySeconds", "Attribute.1.Value": "5"},
        )
    ) == (
        400,
        "Sender",
        "QueueAlreadyExists",
        "A queue already exists with the same name and a different value for attribute "
        "DelaySeconds",
    )
    status, _, code, _ = query_error(
        query(http, "ReceiveMessage", f"/000000000000/{name}", MaxNumberOfMessages="many")
    )
    assert (status, code) == (400, "InvalidParameterValue")
    # Digits of other scripts (Python's int() reads them) are no number to SQS.
    for action, params in (
        ("SendMessage", {"MessageBody": "x", "DelaySeconds": "\u0665"}),
        ("ReceiveMessage", {"MaxNumberOfMessages": "\u0665"}),
        (
            "StartMessageMoveTask",
            {
                "SourceArn": f"arn:aws:sqs:us-east-1:000000000000:{name}",
                "MaxNumberOfMessagesPerSecond": "\u00b2",
            },
        ),
    ):
        path = "/" if action == "StartMessageMoveTask" else f"/000000000000/{name}"
        status, _, code, _ = query_error(query(http, action, path, **params))
        assert (status, code) == (400, "InvalidParameterValue"), action


def json_call(http: httpx.Client, action: str, body: bytes | dict[str, Any]) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"X-Amz-Target": f"AmazonSQS.{action}", "Content-Type": protocol_json.CONTENT_TYPE}
    return http.post("/", content=content, headers=headers)


def test_json_errors(http: httpx.Client) -> None:
    missing = json_call(http, "GetQueueUrl", {"QueueOwnerAWSAccountId": "1"})
    assert missing.status_code == 400
    assert missing.json() == {
        "__type": "com.amazonaws.sqs#MissingRequiredParameterException",
        "message": "The request must contain the parameter QueueName.",
    }
    assert missing.headers["x-amzn-query-error"] == "MissingParameter;Sender"

    absent = json_call(http, "GetQueueUrl", {"QueueName": unique("none")})
    assert absent.json()["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"
    assert absent.headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"

    unknown = json_call(http, "Brew", {})
    assert unknown.status_code == 400
    assert unknown.json()["__type"] == "com.amazon.coral.service#UnknownOperationException"
    assert "x-amzn-query-error" not in unknown.headers

    for bad in (b"{not json", b"[1]", json.dumps({"QueueName": 5}).encode()):
        answer = json_call(http, "GetQueueUrl", bad)
        assert answer.status_code == 400
        assert answer.json()["__type"] == "com.amazon.coral.service#SerializationException"

    name = unique("json")
    assert (
        json_call(http, "CreateQueue", {"QueueName": name, "Attributes": None}).status_code == 200
    )
    wrong = json_call(http, "ListQueues", {"MaxResults": "5"})
    assert wrong.json()["__type"] == "com.amazon.coral.service#SerializationException"


def test_characters_xml_cannot_carry_are_replaced() -> None:
    operation = MODEL.operation_model("ListQueueTags")
    response = protocol_query.render("ListQueueTags", {"Tags": {"k": "a\x00b\ud800c"}}, "rid")
    parsed = create_parser("query").parse(
        {"body": response.body, "headers": {}, "status_code": 200}, operation.output_shape
    )
    assert parsed["Tags"] == {"k": "a\ufffdb\ufffdc"}


def test_query_answered_in_json_when_the_client_accepts_it(
    http: httpx.Client, server: ServerProcess
) -> None:
    """AWS answers a query request with `Accept: application/json` in JSON (the shapes that
    LocalStack's AWS-validated tests record); without the header, XML as before."""
    accept = {"Accept": "application/json"}
    name = unique("json")
    created = http.get(
        "/",
        params={"Action": "CreateQueue", "QueueName": name, "Version": "2012-11-05"},
        headers=accept,
    )
    assert created.status_code == 200
    assert created.headers["content-type"] == "application/json"
    doc = created.json()
    url = doc["CreateQueueResponse"]["CreateQueueResult"]["QueueUrl"]
    assert url == f"{server.url}/000000000000/{name}"
    assert (
        doc["CreateQueueResponse"]["ResponseMetadata"]["RequestId"]
        == (created.headers["x-amzn-requestid"])
    )

    listed = http.get(
        "/", params={"Action": "ListQueues", "QueueNamePrefix": name}, headers=accept
    ).json()
    assert listed["ListQueuesResponse"]["ListQueuesResult"]["queueUrls"] == [url]
    assert b"<ListQueuesResponse" in http.get("/", params={"Action": "ListQueues"}).content

    body = '{"a": "b <&>"}'
    query(http, "SendMessage", QueueUrl=url, MessageBody=body)
    received = http.get(
        "/",
        params={
            "Action": "ReceiveMessage",
            "QueueUrl": url,
            "AttributeName.1": "All",
            "VisibilityTimeout": "0",
        },
        headers=accept,
    ).json()
    (message,) = received["ReceiveMessageResponse"]["ReceiveMessageResult"]["messages"]
    assert message["Body"] == body
    assert {"Name": "ApproximateReceiveCount", "Value": "1"} in message["Attributes"]

    attributes = http.get(
        url, params={"Action": "GetQueueAttributes", "AttributeName.1": "All"}, headers=accept
    ).json()["GetQueueAttributesResponse"]["GetQueueAttributesResult"]["Attributes"]
    assert {"Name": "QueueArn", "Value": f"arn:aws:sqs:us-east-1:000000000000:{name}"} in (
        attributes
    )

    error = http.get("/", params={"Action": "Brew"}, headers=accept)
    assert error.status_code == 400
    assert error.json()["Error"] == {
        "Type": "Sender",
        "Code": "InvalidAction",
        "Message": "The action Brew is not valid for this endpoint.",
    }
    assert error.json()["RequestId"] == error.headers["x-amzn-requestid"]


def test_a_get_of_a_queue_url_without_an_action(http: httpx.Client, server: ServerProcess) -> None:
    """AWS: 404 and an UnknownOperationException, whatever the Accept header says."""
    name = unique("noaction")
    url = query(http, "CreateQueue", QueueName=name).text.split("<QueueUrl>")[1].split("<")[0]
    path = url.removeprefix(server.url)
    for headers in ({}, {"Accept": "application/json"}):
        response = http.get(path, headers=headers)
        assert response.status_code == 404
        assert "<UnknownOperationException" in response.text
    # A native queue of that very name is still the native API's.
    assert http.put(f"/000000000000/native-{name}").status_code == 201
    assert http.get(f"/000000000000/native-{name}").json()["name"] == f"000000000000/native-{name}"
