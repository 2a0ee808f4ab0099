"""The query protocol answered in JSON: what AWS sends a query request (`Action=...`) that
carries `Accept: application/json`.

Requests are read as `protocol_query` reads them. Responses keep the query protocol's tree, as
JSON: `{"<Action>Response": {"<Action>Result": {...}, "ResponseMetadata": {"RequestId": ...}}}`.
What AWS does with the XML names (checked against AWS by LocalStack's tests
`test_get_list_queues_with_query_auth`, `test_get_queue_attributes_json_format` and the
JSON-accepting receive test):

- a flattened list is one array named after the model's member, first letter lower-cased
  (`messages`, `queueUrls`, `successful`, `failed`), of plain objects (`messages[0]["Body"]`);
- a flattened map is an array of entries under the member's name (`"Attributes": [{"Name": ...,
  "Value": ...}]`; tags as `Key`/`Value`);
- an error is `{"Error": {"Type", "Code", "Message"}, "RequestId"}` with the same status as in
  XML.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from dirmq.server.contract import Request, Response
from dirmq.sqs import protocol_query
from dirmq.sqs.errors import SqsError

CONTENT_TYPE = "application/json"


def wants_json(request: Request) -> bool:
    """A query request whose client asked for JSON."""
    accept = request.headers.get("accept") or ""
    return "application/json" in accept.lower()


def parse(request: Request) -> tuple[str, dict[str, Any]]:
    return protocol_query.parse(request)


def render(action: str, result: dict[str, Any], request_id: str) -> Response:
    op = protocol_query.operation(action)
    shape = op.output_shape if op is not None else None
    response: dict[str, Any] = {}
    if shape is not None:
        response[f"{action}Result"] = _members(shape, result)
    response["ResponseMetadata"] = {"RequestId": request_id}
    return _json(200, {f"{action}Response": response}, request_id)


def render_error(error: SqsError, request_id: str) -> Response:
    kind = error.kind
    body = {
        "Error": {
            "Type": "Sender" if kind.sender_fault else "Receiver",
            "Code": kind.query_code,
            "Message": error.query_message,
        },
        "RequestId": request_id,
    }
    return _json(kind.status, body, request_id)


def _json(status: int, body: dict[str, Any], request_id: str) -> Response:
    headers = [("Content-Type", CONTENT_TYPE), ("x-amzn-RequestId", request_id)]
    return Response(status, json.dumps(body, separators=(",", ":")).encode(), headers)


def _members(shape: Any, value: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for member_name, member in shape.members.items():
        item = value.get(member_name)
        if item is None:
            continue
        flattened = member.serialization.get("flattened")
        if member.type_name == "list" and flattened:
            out[member_name[:1].lower() + member_name[1:]] = [
                _value(member.member, element) for element in item
            ]
        else:
            out[member_name] = _value(member, item)
    return out


def _value(shape: Any, value: Any) -> Any:
    kind = shape.type_name
    if kind == "structure":
        return _members(shape, value)
    if kind == "list":
        return [_value(shape.member, item) for item in value]
    if kind == "map":
        key_name = shape.key.serialization.get("name", "key")
        value_name = shape.value.serialization.get("name", "value")
        return [
            {key_name: _value(shape.key, key), value_name: _value(shape.value, item)}
            for key, item in value.items()
        ]
    if kind == "blob" and isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return value
