"""AWS JSON 1.0, the protocol boto3 and the AWS CLI use for SQS: `POST /` with
`X-Amz-Target: AmazonSQS.<Action>` and a JSON body; errors carry `__type` and, because SQS is
"query compatible", the legacy code in the `x-amzn-query-error` header (`Code;Sender`), which
botocore reports as the error code."""

from __future__ import annotations

import json
import uuid
from typing import Any

from dirmq.server.http import Request, Response
from dirmq.sqs.errors import SqsError

CONTENT_TYPE = "application/x-amz-json-1.0"
TARGET_PREFIX = "AmazonSQS."


def is_json_request(request: Request) -> bool:
    return (request.headers.get("x-amz-target") or "").startswith(TARGET_PREFIX)


def parse(request: Request) -> tuple[str, dict[str, Any]]:
    action = (request.headers.get("x-amz-target") or "")[len(TARGET_PREFIX) :]
    if not request.body.strip():
        return action, {}
    try:
        params = json.loads(request.body)
    except ValueError as exc:
        raise SqsError(
            "InvalidParameterValue", f"The request body is not valid JSON: {exc}"
        ) from exc
    if not isinstance(params, dict):
        raise SqsError("InvalidParameterValue", "The request body must be a JSON object.")
    return action, params


def render(action: str, result: dict[str, Any], request_id: str) -> Response:
    body = json.dumps(result, separators=(",", ":")).encode()
    return Response(200, body, [("Content-Type", CONTENT_TYPE), ("x-amzn-RequestId", request_id)])


def render_error(error: SqsError, request_id: str) -> Response:
    kind = error.kind
    body = json.dumps({"__type": f"com.amazonaws.sqs#{kind.code}", "message": error.message})
    fault = "Sender" if kind.sender_fault else "Receiver"
    headers = [
        ("Content-Type", CONTENT_TYPE),
        ("x-amzn-RequestId", request_id),
        ("x-amzn-query-error", f"{kind.query_code};{fault}"),
    ]
    return Response(kind.status, body.encode(), headers)


def new_request_id() -> str:
    return str(uuid.uuid4())
