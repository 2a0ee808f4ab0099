"""The SQS query protocol: form-encoded `Action=...&Version=2012-11-05&...` (or the same in the
query string), answered in XML. Parameters are translated to and from the JSON protocol's shapes
using botocore's SQS service model, so every action is written once.

botocore's SQS model has described the JSON protocol since SQS moved to it, and lost on the way
the names the query protocol gives to list members and map entries (`Attribute.1.Name`,
`AttributeName.1`, `SendMessageBatchRequestEntry.1.Id`, `<QueueUrl>`, `<Message>`...). They are
put back here (`_LIST_MEMBERS`, `_MAP_ENTRIES`) on a copy of the model, `query_model()`, which
is what botocore's own query serializer and parser need to speak to us as the query SDKs do:
the tests use them that way.

Requests: the flat `Name.1.Sub=value` parameters become a tree, read along the input shape
(structures by member name, flattened lists by index, maps by `.N.Name/.N.Value`); integers and
booleans are converted; blobs stay base64 text, as in JSON. A request posted to a queue's URL
without a QueueUrl parameter (older SDKs do that) gets that URL. Results are written along the
output shape inside `<XResponse><XResult>...</XResult><ResponseMetadata>`, escaped (carriage
returns as `&#13;`, so they survive XML's line-end normalisation; characters XML cannot carry
replaced).
"""

from __future__ import annotations

import base64
import copy
import functools
import re
from typing import Any
from urllib.parse import parse_qsl
from xml.sax.saxutils import escape

from dirmq.server.contract import Request, Response
from dirmq.sqs.errors import SqsError, invalid_value

XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
CONTENT_TYPE = "text/xml"

# The query protocol's names that botocore's (JSON) model no longer carries.
_LIST_MEMBERS = {
    "AWSAccountIdList": "AWSAccountId",
    "ActionNameList": "ActionName",
    "AttributeNameList": "AttributeName",
    "BatchResultErrorEntryList": "BatchResultErrorEntry",
    "BinaryList": "BinaryListValue",
    "ChangeMessageVisibilityBatchRequestEntryList": "ChangeMessageVisibilityBatchRequestEntry",
    "ChangeMessageVisibilityBatchResultEntryList": "ChangeMessageVisibilityBatchResultEntry",
    "DeleteMessageBatchRequestEntryList": "DeleteMessageBatchRequestEntry",
    "DeleteMessageBatchResultEntryList": "DeleteMessageBatchResultEntry",
    "ListMessageMoveTasksResultEntryList": "ListMessageMoveTasksResultEntry",
    "MessageAttributeNameList": "MessageAttributeName",
    "MessageList": "Message",
    "MessageSystemAttributeList": "MessageSystemAttributeName",
    "QueueUrlList": "QueueUrl",
    "SendMessageBatchRequestEntryList": "SendMessageBatchRequestEntry",
    "SendMessageBatchResultEntryList": "SendMessageBatchResultEntry",
    "StringList": "StringListValue",
    "TagKeyList": "TagKey",
}
# map shape: (name of each entry where the map is used, key name, value name)
_MAP_ENTRIES = {
    "QueueAttributeMap": ("Attribute", "Name", "Value"),
    "MessageSystemAttributeMap": ("Attribute", "Name", "Value"),
    "MessageBodyAttributeMap": ("MessageAttribute", "Name", "Value"),
    "MessageBodySystemAttributeMap": ("MessageSystemAttribute", "Name", "Value"),
    "TagMap": ("Tag", "Key", "Value"),
}


@functools.cache
def query_model() -> Any:
    """botocore's SQS model as the query protocol sees it (protocol `query`, query names,
    result wrappers)."""
    from botocore.model import ServiceModel  # type: ignore[import-untyped]

    return ServiceModel(query_model_document(), "sqs")


def query_model_document() -> dict[str, Any]:
    """The JSON document of `query_model()`: a botocore data file for an SQS client that speaks
    the query protocol (the tests give one to boto3)."""
    from botocore.loaders import create_loader  # type: ignore[import-untyped]

    raw: dict[str, Any] = copy.deepcopy(create_loader().load_service_model("sqs", "service-2"))
    metadata = raw["metadata"]
    metadata["protocol"] = "query"
    metadata["protocols"] = ["query"]
    metadata["xmlNamespace"] = XMLNS
    for key in ("jsonVersion", "targetPrefix", "awsQueryCompatible"):
        metadata.pop(key, None)
    for name, operation in raw["operations"].items():
        if "output" in operation:
            operation["output"]["resultWrapper"] = f"{name}Result"
    shapes = raw["shapes"]
    for shape_name, member_name in _LIST_MEMBERS.items():
        if shape_name in shapes:
            shapes[shape_name]["member"]["locationName"] = member_name
    for shape_name, (entry, key, value) in _MAP_ENTRIES.items():
        if shape_name in shapes:
            shapes[shape_name]["locationName"] = entry
            shapes[shape_name]["key"]["locationName"] = key
            shapes[shape_name]["value"]["locationName"] = value
    return raw


def operation(action: str) -> Any:
    model = query_model()
    if action not in model.operation_names:
        return None
    return model.operation_model(action)


# -- requests ------------------------------------------------------------------------------------
def form_parameters(request: Request) -> dict[str, str]:
    """The query string's parameters, then the form body's (the first of each name wins).

    Percent-decoded bytes that are not UTF-8 (`MessageBody=%FF%FE`) are kept as lone surrogates
    (`surrogateescape`), never replaced by U+FFFD: the actions' one character rule (SQS's
    allowed set, `message_attributes.first_invalid_character`) then refuses them as it refuses
    the same text from the JSON protocol (InvalidMessageContents for a body)."""
    # The query as sent (the server decoded it as Latin-1, one character per byte); a request
    # built without one (tests) has only its parsed query.
    params: dict[str, str] = {} if request.raw_query else dict(request.query)
    raw_query = request.raw_query.encode("latin-1", "replace")
    content_type = (request.headers.get("content-type") or "").lower()
    form = request.body and (not content_type or "x-www-form-urlencoded" in content_type)
    for raw in (raw_query, request.body if form else b""):
        text = raw.decode("utf-8", "surrogateescape")
        for name, value in parse_qsl(text, keep_blank_values=True, errors="surrogateescape"):
            params.setdefault(name, value)
    return params


_ACCOUNT_ACTIONS = frozenset({"CreateQueue", "ListQueues"})


def parse(request: Request) -> tuple[str, dict[str, Any]]:
    flat = form_parameters(request)
    action = flat.get("Action", "")
    op = operation(action)
    if op is None:
        raise SqsError(
            "InvalidAction", f"The action {action or '(none)'} is not valid for this endpoint."
        )
    if action in _ACCOUNT_ACTIONS and request.path.strip("/"):
        # AWS answers actions on the account, not a queue, only at the service's root.
        raise SqsError("InvalidAction", f"The action {action} is not valid for this endpoint.")
    shape = op.input_shape
    if shape is None:
        return action, {}
    params = _read_structure(shape, _tree(flat))
    if "QueueUrl" in shape.members and "QueueUrl" not in params and request.path.strip("/"):
        host = request.headers.get("host") or "localhost"
        params["QueueUrl"] = f"{request.scheme}://{host}{request.path}"
    return action, params


class _Node:
    """One component of the dotted parameter names: its own value (if the name ends here) and
    the components that follow it."""

    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.value: str | None = None
        self.children: dict[str, _Node] = {}


def _tree(flat: dict[str, str]) -> _Node:
    root = _Node()
    for name, value in flat.items():
        node = root
        for part in name.split("."):
            node = node.children.setdefault(part, _Node())
        node.value = value
    return root


def _query_name(member: Any, member_name: str) -> str:
    """The name a structure member goes by: a flattened list goes by its member's name."""
    if member.type_name == "list" and member.serialization.get("flattened"):
        name = member.member.serialization.get("name")
        if name:
            return str(name)
    return str(member.serialization.get("name", member_name))


def _read(shape: Any, node: _Node, label: str) -> Any:
    kind = shape.type_name
    if kind == "structure":
        return _read_structure(shape, node)
    if kind == "list":
        items = node
        if not shape.serialization.get("flattened"):
            items = node.children.get(shape.member.serialization.get("name", "member"), _Node())
        return [_read(shape.member, child, label) for child in _indexed(items)]
    if kind == "map":
        return _read_map(shape, node, label)
    return _scalar(shape, node.value, label)


def _read_structure(shape: Any, node: _Node) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for member_name, member in shape.members.items():
        name = _query_name(member, member_name)
        child = node.children.get(name)
        if child is None and name != member_name:
            child = node.children.get(member_name)  # a client serializing with the JSON names
        if child is None or (not child.children and child.value is None):
            continue
        if member.type_name in ("list", "map") and not child.children:
            out[member_name] = [] if member.type_name == "list" else {}  # `Name=`: empty
            continue
        if member.type_name == "structure" and not child.children:
            continue
        out[member_name] = _read(member, child, name)
    return out


def _read_map(shape: Any, node: _Node, label: str) -> dict[str, Any]:
    entries = node if shape.serialization.get("flattened") else node.children.get("entry", _Node())
    key_name = shape.key.serialization.get("name", "key")
    value_name = shape.value.serialization.get("name", "value")
    out: dict[str, Any] = {}
    for entry in _indexed(entries):
        key_node = entry.children.get(key_name) or entry.children.get("key")
        value_node = entry.children.get(value_name) or entry.children.get("value")
        if key_node is None or key_node.value is None:
            raise SqsError(
                "MissingParameter", f"The request must contain the parameter {label}.N.{key_name}."
            )
        if value_node is None:
            value_node = _Node()
            value_node.value = "" if shape.value.type_name == "string" else None
        if shape.value.type_name == "structure":
            out[key_node.value] = _read_structure(shape.value, value_node)
        else:
            out[key_node.value] = _read(shape.value, value_node, f"{label}.N.{value_name}")
    return out


def _indexed(node: _Node) -> list[_Node]:
    """The children named 1, 2, 3... in numeric order."""
    numbered = [(int(k), v) for k, v in node.children.items() if k.isascii() and k.isdigit()]
    return [child for _, child in sorted(numbered, key=lambda item: item[0])]


def _scalar(shape: Any, value: str | None, label: str) -> Any:
    if value is None:
        return None
    kind = shape.type_name
    if kind in ("integer", "long"):
        text = value.strip()
        digits = text[1:] if text[:1] in "+-" else text
        if not (digits.isascii() and digits.isdigit()):
            raise invalid_value(label, value, "Must be an integer.")
        return int(text)
    if kind in ("float", "double"):
        try:
            return float(value)
        except ValueError:
            raise invalid_value(label, value, "Must be a number.") from None
    if kind == "boolean":
        lowered = value.strip().lower()
        if lowered not in ("true", "false"):
            raise invalid_value(label, value, "Must be true or false.")
        return lowered == "true"
    return value  # strings, and blobs as base64 text (the JSON protocol's form too)


# -- responses -----------------------------------------------------------------------------------
def render(action: str, result: dict[str, Any], request_id: str) -> Response:
    op = operation(action)
    parts = [f'<?xml version="1.0"?><{action}Response xmlns="{XMLNS}">']
    shape = op.output_shape if op is not None else None
    if shape is not None:
        parts.append(f"<{action}Result>")
        _write_members(parts, shape, result)
        parts.append(f"</{action}Result>")
    parts.append(
        f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata>"
        f"</{action}Response>"
    )
    return Response(200, "".join(parts).encode(), _headers(request_id))


def render_error(error: SqsError, request_id: str) -> Response:
    kind = error.kind
    body = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error>'
        f"<Type>{'Sender' if kind.sender_fault else 'Receiver'}</Type>"
        f"<Code>{_text(kind.query_code)}</Code><Message>{_text(error.query_message)}</Message>"
        f"<Detail/></Error><RequestId>{request_id}</RequestId></ErrorResponse>"
    )
    return Response(kind.status, body.encode(), _headers(request_id))


def _headers(request_id: str) -> list[tuple[str, str]]:
    return [("Content-Type", CONTENT_TYPE), ("x-amzn-RequestId", request_id)]


def _write_members(parts: list[str], shape: Any, value: dict[str, Any]) -> None:
    for member_name, member in shape.members.items():
        item = value.get(member_name)
        if item is None:
            continue
        name = _query_name(member, member_name)
        if member.type_name == "list" and member.serialization.get("flattened"):
            for element in item:
                _write(parts, member.member, element, name)
        elif member.type_name == "map" and member.serialization.get("flattened"):
            _write_map_entries(parts, member, item, name)
        else:
            _write(parts, member, item, name)


def _write(parts: list[str], shape: Any, value: Any, tag: str) -> None:
    kind = shape.type_name
    parts.append(f"<{tag}>")
    if kind == "structure":
        _write_members(parts, shape, value)
    elif kind == "list":
        element = shape.member.serialization.get("name", "member")
        for item in value:
            _write(parts, shape.member, item, element)
    elif kind == "map":
        _write_map_entries(parts, shape, value, "entry")
    else:
        parts.append(_text(_scalar_text(kind, value)))
    parts.append(f"</{tag}>")


def _write_map_entries(parts: list[str], shape: Any, value: dict[str, Any], tag: str) -> None:
    key_name = shape.key.serialization.get("name", "key")
    value_name = shape.value.serialization.get("name", "value")
    for key, item in value.items():
        parts.append(f"<{tag}>")
        _write(parts, shape.key, key, key_name)
        _write(parts, shape.value, item, value_name)
        parts.append(f"</{tag}>")


def _scalar_text(kind: str, value: Any) -> str:
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "blob" and isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return str(value)


def _text(value: str) -> str:
    """Character data: escaped, carriage returns kept, and characters XML 1.0 cannot carry at
    all (which AWS never accepts into a message) replaced, so the document stays well-formed."""
    return escape(_NOT_XML.sub("\ufffd", value), {"\r": "&#13;"})
