"""The SQS query protocol: form-encoded `Action=...&Version=2012-11-05&...` (or the same in the
query string), answered in XML. Parameters are translated to and from the JSON protocol's shapes
using botocore's SQS service model, so every action is written once."""

from __future__ import annotations

from typing import Any

from dirmq.server.http import Request, Response
from dirmq.sqs.errors import SqsError

XMLNS = "http://queue.amazonaws.com/doc/2012-11-05/"


def parse(request: Request) -> tuple[str, dict[str, Any]]:
    raise SqsError("InvalidAction", "the query protocol is being written")


def render(action: str, result: dict[str, Any], request_id: str) -> Response:
    raise NotImplementedError


def render_error(error: SqsError, request_id: str) -> Response:
    body = (
        f'<?xml version="1.0"?><ErrorResponse xmlns="{XMLNS}"><Error><Type>'
        f"{'Sender' if error.kind.sender_fault else 'Receiver'}</Type><Code>{error.kind.query_code}"
        f"</Code><Message>{error.message}</Message><Detail/></Error><RequestId>{request_id}"
        "</RequestId></ErrorResponse>"
    )
    return Response(error.kind.status, body.encode(), [("Content-Type", "text/xml")])
