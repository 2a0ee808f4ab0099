"""AWS JSON 1.0, the protocol boto3 and the AWS CLI use for SQS: `POST /` with
`X-Amz-Target: AmazonSQS.<Action>` and a JSON body; errors carry `__type` and, because SQS is
"query compatible", the legacy code in the `x-amzn-query-error` header (`Code;Sender`), which
botocore reports as the error code.

Input is checked against botocore's SQS model (the JSON protocol's own): each value must have
its member's JSON type, as AWS's deserializer insists (SerializationException otherwise), so
actions can trust the types of what they are given; `null` members count as absent."""

from __future__ import annotations

import functools
import itertools
import json
import os
import uuid
from collections.abc import Iterator
from typing import Any

from dirmq.server.contract import Request, Response
from dirmq.sqs.errors import SqsError
from dirmq.wire import jsondoc

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."


def is_json_request(request: Request) -> bool:
    return (request.headers.get("x-amz-target") or "").startswith(TARGET_PREFIX)


@functools.cache
def service_model() -> Any:
    """botocore's SQS model (loaded once, on first use)."""
    from botocore.loaders import create_loader  # type: ignore[import-untyped]
    from botocore.model import ServiceModel  # type: ignore[import-untyped]

    return ServiceModel(create_loader().load_service_model("sqs", "service-2"), "sqs")


def input_shape(action: str) -> Any:
    """The input shape of `action`, or None for an action SQS does not have."""
    model = service_model()
    if action not in model.operation_names:
        return None
    return model.operation_model(action).input_shape


def parse(request: Request) -> tuple[str, dict[str, Any]]:
    action = (request.headers.get("x-amz-target") or "")[len(TARGET_PREFIX) :]
    shape = input_shape(action)
    if shape is None:
        raise SqsError("UnknownOperationException", "")
    if not request.body.strip():
        return action, {}
    try:
        params = jsondoc.loads(request.body)
    except ValueError as exc:
        raise SqsError(
            "SerializationException", f"The request body is not valid JSON: {exc}"
        ) from exc
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    return action, _checked(shape, params, "")


def _checked(shape: Any, value: Any, path: str) -> Any:
    """`value` with its nulls dropped, if it has `shape`'s JSON type; SerializationException
    naming the member otherwise."""
    kind = shape.type_name
    if kind == "structure":
        _expect(isinstance(value, dict), path, "a JSON object")
        out: dict[str, Any] = {}
        for key, item in value.items():
            member = shape.members.get(key)
            if member is None or item is None:
                continue  # unknown members are ignored, as AWS does
            out[key] = _checked(member, item, f"{path}.{key}" if path else key)
        return out
    if kind == "list":
        _expect(isinstance(value, list), path, "a JSON array")
        return [_checked(shape.member, item, f"{path}[{i}]") for i, item in enumerate(value)]
    if kind == "map":
        _expect(isinstance(value, dict), path, "a JSON object")
        return {
            _checked(shape.key, k, f"{path} key"): _checked(shape.value, v, f"{path}.{k}")
            for k, v in value.items()
            if v is not None
        }
    if kind in ("integer", "long"):
        _expect(isinstance(value, int) and not isinstance(value, bool), path, "an integer")
    elif kind in ("float", "double"):
        _expect(isinstance(value, int | float) and not isinstance(value, bool), path, "a number")
    elif kind == "boolean":
        _expect(isinstance(value, bool), path, "true or false")
    elif kind in ("string", "blob", "timestamp"):
        _expect(
            isinstance(value, str) or (kind == "timestamp" and isinstance(value, int | float)),
            path,
            "a string",
        )
    return value


def _expect(ok: bool, path: str, what: str) -> None:
    if not ok:
        raise SqsError("SerializationException", f"{path or 'The request body'} must be {what}.")


def render(action: str, result: dict[str, Any], request_id: str) -> Response:
    body = json.dumps(result, separators=(",", ":")).encode()
    return Response(200, body, [("Content-Type", CONTENT_TYPE), ("x-amzn-RequestId", request_id)])


def render_error(error: SqsError, request_id: str) -> Response:
    kind = error.kind
    body = json.dumps({"__type": kind.json_type, "message": error.message})
    headers = [("Content-Type", CONTENT_TYPE), ("x-amzn-RequestId", request_id)]
    if kind.query_header:
        fault = "Sender" if kind.sender_fault else "Receiver"
        headers.append(("x-amzn-query-error", f"{kind.query_code};{fault}"))
    return Response(kind.status, body.encode(), headers)


# Request ids in AWS's UUID form: a random prefix per process and a counter, which is unique
# without a uuid4 (an os.urandom call) per request. Drawn again in a forked worker.
_ids: tuple[int, str, Iterator[int]] = (-1, "", iter(()))


def new_request_id() -> str:
    global _ids
    pid, prefix, counter = _ids
    if pid != os.getpid():
        h = uuid.uuid4().hex
        prefix = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-"
        counter = itertools.count(int(h[20:], 16))
        _ids = (os.getpid(), prefix, counter)
    return f"{prefix}{next(counter) & 0xFFFFFFFFFFFF:012x}"
