"""SQS requests: which ones they are, who sent them, and which action answers them.

Served on the native API's port: a request is SQS's when it carries `X-Amz-Target: AmazonSQS.*`
(JSON protocol) or an `Action` parameter in its query or form body (query protocol); nothing
of the native API looks like that. So is a GET of an SQS queue URL (`/<account>/<name>`) without
an Action when no native queue has that name: AWS answers it with UnknownOperationException, not
the native API's 404. `dirmq serve --sqs-listen` also gives SQS a port of its own.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any, Protocol

from dirmq import errors
from dirmq.server.access import OPEN, Access
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.server.credentials import SEE
from dirmq.server.dialect import Dialect
from dirmq.sqs import protocol_json, protocol_query, protocol_query_json
from dirmq.sqs.access import authorise
from dirmq.sqs.actions import load
from dirmq.sqs.actions.move_tasks import tasks_of
from dirmq.sqs.context import DEFAULT_ACCOUNT, DEFAULT_REGION, Context
from dirmq.sqs.errors import SqsError, missing, no_such_queue

log = logging.getLogger("dirmq.sqs")
# AWS's words for a request without credentials, or with a token the server does not know.
_AWS_WORDING = {
    "MissingAuthenticationToken": "Request is missing Authentication Token",
    "InvalidClientTokenId": "The security token included in the request is invalid.",
}


class Wire(Protocol):
    """What each protocol module (protocol_json, protocol_query) provides."""

    def parse(self, request: Request) -> tuple[str, dict[str, Any]]: ...
    def render(self, action: str, result: dict[str, Any], request_id: str) -> Response: ...
    def render_error(self, error: SqsError, request_id: str) -> Response: ...


def is_sqs_request(request: Request) -> bool:
    if protocol_json.is_json_request(request):
        return True
    if "Action" in request.query:
        return True
    content_type = (request.headers.get("content-type") or "").lower()
    return (
        request.method == "POST"
        and content_type.startswith("application/x-www-form-urlencoded")
        and b"Action=" in request.body
    )


_QUEUE_URL_PATH = re.compile(r"/[0-9]{12}/[A-Za-z0-9_-]{1,80}(\.fifo)?/?")


def _is_queue_url_get(request: Request) -> bool:
    """A GET of an SQS queue URL's path (whatever its parameters)."""
    return request.method == "GET" and _QUEUE_URL_PATH.fullmatch(request.path) is not None


class SqsApp(Dialect):
    name = "sqs"

    def __init__(
        self,
        broker: Broker,
        *,
        account: str = DEFAULT_ACCOUNT,
        region: str = DEFAULT_REGION,
        access: Access = OPEN,
        deleted_wait_s: float | None = None,
    ) -> None:
        self.broker = broker
        self.deleted_wait_s = deleted_wait_s  # see sqs/deleted.py; None: off
        self.account = account
        self.region = region
        self.access = access  # the Router authenticates; each action is authorised here
        self.actions = load()
        self._resuming: asyncio.Task[None] | None = None

    def start(self) -> None:
        # Message move tasks whose process died (a crash, a restart) carry on here.
        self._resuming = asyncio.get_running_loop().create_task(
            self.broker.call(tasks_of(self.broker).resume_all)
        )

    async def close(self) -> None:
        if self._resuming is not None:
            self._resuming.cancel()
        tasks_of(self.broker).close()  # running redrives stop; the next server resumes them

    def claims(self, request: Request) -> bool:
        if is_sqs_request(request):
            return True
        if not _is_queue_url_get(request):
            return False
        name = request.path.strip("/")
        if not self.access.allows(request.principal, SEE, name):
            return False  # not looked up: the native API refuses it, whether it exists or not
        return not self._names_a_queue(request.path)

    def _names_a_queue(self, path: str) -> bool:
        try:
            self.broker.queue(path.strip("/"))
        except errors.DirmqError:
            return False
        return True  # a native queue of that name: the native API's

    def refuse(self, request: Request, error: errors.DirmqError) -> Response:
        """A request the Router refuses (no credentials, wrong ones), in AWS's words."""
        return _wire(request).render_error(_translate(error), protocol_json.new_request_id())

    async def __call__(self, request: Request) -> Response:
        request.route = "invalid"  # until it names an action of ours
        if _is_queue_url_get(request) and not is_sqs_request(request):  # see the docstring
            body = b'<?xml version="1.0"?><UnknownOperationException/>'
            return Response(404, body, [("Content-Type", "text/xml")])
        request_id = protocol_json.new_request_id()
        wire = _wire(request)
        parse, render, render_error = wire.parse, wire.render, wire.render_error
        action_name = ""
        try:
            action_name, params = parse(request)
            request.queue = _queue_named(params)
            handler = self.actions.get(action_name)
            # Metrics label requests by route: an action we do not have is "invalid", not a
            # label of the client's choosing.
            request.route = action_name if handler is not None else "invalid"
            if handler is None:
                raise SqsError(
                    "InvalidAction",
                    f"The action {action_name or '(none)'} is not valid for this endpoint.",
                )
            _check_required(action_name, params)
            context = self._context(request)
            authorise(self.access, request.principal, action_name, params, context)
            result = await handler(context, params)
        except SqsError as error:
            return render_error(error, request_id)
        except errors.DirmqError as exc:
            return render_error(_translate(exc), request_id)
        except Exception:
            log.exception("SQS %s failed", action_name)
            return render_error(
                SqsError("InternalError", "We encountered an internal error. Please try again."),
                request_id,
            )
        return render(action_name, result, request_id)

    def _context(self, request: Request) -> Context:
        host = request.headers.get("host") or "localhost"
        return Context(
            self.broker,
            f"{request.scheme}://{host}",
            self.account,
            self.region,
            request.headers.get("x-amzn-trace-id"),
            self.deleted_wait_s,
            self.access.visible(request.principal),
            request.principal or None,
        )


def _wire(request: Request) -> Wire:
    """The protocol a request speaks, and its answers are in."""
    if protocol_json.is_json_request(request):
        return protocol_json
    return protocol_query_json if protocol_query_json.wants_json(request) else protocol_query


def _queue_named(params: dict[str, Any]) -> str:
    """The queue a request names (its URL's last segment, or a CreateQueue's name), for
    observers; "" when it names none or not as text."""
    url = params.get("QueueUrl")
    if isinstance(url, str):
        return url.rstrip("/").rpartition("/")[2]
    name = params.get("QueueName")
    return name if isinstance(name, str) else ""


def _check_required(action: str, params: dict[str, Any]) -> None:
    """MissingParameter for a required top-level parameter that is absent (AWS's wording)."""
    shape = protocol_json.input_shape(action)
    for name in getattr(shape, "required_members", ()) if shape is not None else ():
        if params.get(name) is None:
            raise missing(name)


def _translate(exc: errors.DirmqError) -> SqsError:
    """Library errors that reach the SQS layer, in AWS's words."""
    if isinstance(exc, errors.QueueNotFound):
        return no_such_queue()
    if isinstance(exc, errors.Unauthenticated):
        return SqsError(exc.aws_code, _AWS_WORDING.get(exc.aws_code, str(exc)))
    if isinstance(exc, errors.AccessDenied):
        return SqsError("AccessDenied", str(exc))
    if isinstance(exc, errors.StaleReceipt):
        return SqsError("ReceiptHandleIsInvalid", f"The receipt handle is not valid: {exc}")
    if isinstance(exc, errors.StorageError):
        return SqsError("ServiceUnavailable", f"The message could not be stored: {exc}")
    if isinstance(exc, errors.MessageTooLarge):
        return SqsError("InvalidParameterValue", str(exc))
    if isinstance(exc, errors.CorruptConfig):  # the stored file is bad: ours, not the client's
        return SqsError("InternalError", str(exc))
    if isinstance(exc, errors.InvalidArgument | errors.InvalidName | errors.ConfigError):
        return SqsError("InvalidParameterValue", str(exc))
    return SqsError("InternalError", str(exc))
