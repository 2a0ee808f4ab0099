"""The native API as a dialect: route, authorise, call the handler, map errors to statuses;
and the server's own paths (`/health`, `/metrics`, `/openapi.json`) on its port. Requests and
messages are counted elsewhere (the Router's observer, the broker).

Permissions by route (the Router has authenticated the request already; `NEEDS`):

    GET /                          any principal; lists only the queues it may see
    GET|HEAD /{queue}              any permission on the queue
    PUT, DELETE /{queue}           admin (and write on a `dead_letter_queue` it names)
    POST /{queue}/messages         write
    GET /{queue}/messages          read (a receive, or a stream: `stream.py`)
    GET /{queue}/messages?peek=1   browse (read grants it too), unless it asks for a stream
    GET|HEAD /{queue}/messages/{id}                                      browse (a peek)
    DELETE /{queue}/messages/{ref}, POST .../{receipt}/{action}          read
    POST /{queue}/messages/ack|nack|extend (many receipts at once)       read
    DELETE /{queue}/messages       admin (purge, ?state=dead too)
    POST /{queue}/redrive          admin (and write on the queue its "to" names)
    DELETE /{queue}/redrive/{task} admin (a cancel)
    GET /{queue}/redrive[/{task}]                                         any permission
    /health, /metrics              as the credentials file says; /openapi.json: any principal
    /@schedules[/{name}]           judged in schedules.py: admin on a schedule's queue to
                                   change it, browse to see it (its queue is not in the path)

Every worker also runs the root's recurring schedules (dirmq/schedules: each tick once, however
many servers and processes run them), from `start` to `close`.

A route of `handlers.TABLE` without a rule here is refused to every principal (never open):
a new route must be given its permission (tests/test_browse_permission.py checks they are).

Why it is long: the general dispatch and the fast paths (publish, receive, long poll, ack)
judge the same routes, parameters and permissions, and must agree on each of them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from importlib import resources
from typing import TypeVar

from dirmq.dialects.native import handlers as native
from dirmq.dialects.native import queues
from dirmq.dialects.native.parameters import check_native
from dirmq.dialects.native.redrive import redrive_target
from dirmq.dialects.native.routes import Route, parse_route
from dirmq.dialects.native.schedules import ScheduleRoutes, schedule_path
from dirmq.dialects.native.stream import StreamSessions
from dirmq.errors import AccessDenied, DirmqError, QueueNotFound
from dirmq.redrive.tasks import redrives_of
from dirmq.schedules import Scheduler
from dirmq.server.access import OPEN, Access
from dirmq.server.broker import Broker
from dirmq.server.contract import (
    LATER,
    BodySink,
    Later,
    Request,
    Respond,
    Response,
    StreamResponse,
    SwitchProtocols,
)
from dirmq.server.credentials import ADMIN, BROWSE, READ, SEE, WRITE
from dirmq.server.dialect import Dialect
from dirmq.server.errors import error_response, json_error
from dirmq.server.later_receive import LaterReceive
from dirmq.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dirmq.server.metrics import Metrics
from dirmq.server.websocket import is_websocket
from dirmq.store import Message
from dirmq.store.layout import parse_receipt
from dirmq.wire.durations import parse_duration

T = TypeVar("T")

ROUTE_CACHE = 4096  # paths without a message reference, parsed and validated once

# The permission each (route kind, method) needs on the route's queue; "peek" is the kind of a
# `GET /{queue}/messages?peek=1` (`_rule`). Looking without leasing or changing anything takes
# browse (or SEE: stats and configuration); leasing or settling takes read.
NEEDS: dict[tuple[str, str], str] = {
    ("queue", "GET"): SEE,
    ("queue", "PUT"): ADMIN,
    ("queue", "DELETE"): ADMIN,
    ("messages", "POST"): WRITE,
    ("messages", "GET"): READ,
    ("peek", "GET"): BROWSE,
    ("messages", "DELETE"): ADMIN,
    ("message", "GET"): BROWSE,
    ("message", "DELETE"): READ,
    ("action", "POST"): READ,
    ("batch", "POST"): READ,
    ("redrive", "POST"): ADMIN,  # moves messages between queues, as an operator does
    ("redrive", "GET"): SEE,
    ("task", "GET"): SEE,
    ("task", "DELETE"): ADMIN,
}
FILTERED = frozenset({("root", "GET")})  # answered with only what the principal may see


class NativeApp(Dialect):
    """Claims every request it is asked about: on a shared port, ask it last."""

    name = "native"

    def __init__(self, broker: Broker, metrics: Metrics, access: Access = OPEN) -> None:
        self.broker = broker
        self.metrics = metrics
        self.access = access
        self._checked = access.enabled  # an open server skips every check
        # Served without the file's indentation: a third fewer bytes for every client to take.
        document = resources.files("dirmq.dialects.native").joinpath("openapi.json").read_bytes()
        self._openapi = json.dumps(
            json.loads(document), separators=(",", ":"), ensure_ascii=False
        ).encode()
        self._routes: dict[str, Route] = {}
        self.streams = StreamSessions(broker)
        self._resuming: asyncio.Task[None] | None = None
        self.schedule_routes = ScheduleRoutes(broker, access)
        self._scheduler = Scheduler(broker.store)

    def start(self) -> None:
        # Redrive tasks whose process died (a crash, a restart) carry on here.
        self._resuming = asyncio.get_running_loop().create_task(
            self.broker.call(redrives_of(self.broker.store).resume_all)
        )
        self._scheduler.start()

    async def close(self) -> None:
        if self._resuming is not None:
            self._resuming.cancel()
        await asyncio.to_thread(self._scheduler.stop)  # a tick being published is finished
        redrives_of(self.broker.store).close()  # running redrives stop; the next resumes them
        await self.streams.close()

    async def __call__(self, request: Request) -> Response | StreamResponse | SwitchProtocols:
        request.route = "invalid"  # until the path is known to be one of ours
        try:
            schedule = schedule_path(request.path)
            if schedule is not None:
                request.route = "schedules"
                return await self.schedule_routes(request, schedule)
            route = self._route(request.path)
            request.route = route.label
            if route.kind != "server":
                request.queue = route.queue
            response = await self._dispatch(request, route)
        except DirmqError as exc:
            response = error_response(with_hint(exc))
        except UnicodeDecodeError:
            response = json_error(400, "InvalidName", "the path is not valid UTF-8 once decoded")
        return response

    def fast(self, request: Request, respond: Respond) -> Response | Later | None:
        """A publish, or an ack by receipt, answered without a Task (see `contract.FastHandler`):
        a publish read as `publish` reads it, handed to the queue's line, answered when stored;
        an ack handed to the queue's ack line (`_fast_ack`). Anything else, every error (left
        to `__call__` to report) and a queue with a capacity (whose waits need a Task that the
        client's leaving can cancel) go the general way."""
        if request.method == "DELETE":
            return self._fast_ack(request, respond)
        if request.method == "GET":
            return self._fast_get(request, respond)
        if request.method != "POST" or request.upload is not None:
            return None  # an uploaded body is published once written: `handlers.publish`
        route = self._fast_route(request, "messages", WRITE)
        if route is None:
            return None
        try:
            if request.query:  # as `_dispatch` checks them: an unknown one is refused
                check_native(request.query, route.kind, "POST", "", request.path)
            read = native.read_publish(self.broker, request, route)
        except (DirmqError, UnicodeDecodeError):
            return None
        request.route, request.queue = "messages", route.queue

        def settle(outcome: list[str] | BaseException) -> None:
            _answer(respond, outcome, lambda ids: native.published_response(read, ids))

        queued = self.broker.publish_nowait(read.queue, read.messages, settle, read.durability)
        return LATER if queued else None

    def _fast_route(self, request: Request, kind: str, needs: str) -> Route | None:
        """The route of a request a fast path may take: of `kind` and allowed to its principal
        (`needs`); None otherwise (the general path reports what is wrong)."""
        try:
            route = self._route(request.path)
        except (DirmqError, UnicodeDecodeError):
            return None
        if route.kind != kind:
            return None
        if self._checked and not self.access.allows(request.principal, needs, route.queue):
            return None
        return route

    def _fast_ack(self, request: Request, respond: Respond) -> Later | None:
        """`DELETE /{queue}/messages/{receipt}`, the usual ack, as `handlers.ack` does it: into
        the queue's ack line (`Broker.ack_nowait`), answered 204 once acknowledged. A receipt
        given as `?receipt=` or `X-Receipt`, a delete by id and every refusal go the general
        way."""
        if request.query or "x-receipt" in request.headers:
            return None
        route = self._fast_route(request, "message", READ)
        if route is None or parse_receipt(route.ref) is None:
            return None
        try:
            queue = self.broker.queue(route.queue)
        except (DirmqError, UnicodeDecodeError):
            return None
        request.route, request.queue = "message", route.queue

        def settle(failure: BaseException | None) -> None:
            _answer(respond, failure, lambda _acked: Response(204))

        self.broker.ack_nowait(queue, route.ref, settle)
        return LATER

    def _fast_get(self, request: Request, respond: Respond) -> Later | None:
        """`GET /{queue}/messages`, one message, as `handlers.receive` does it: into the
        queue's lease line (`Broker.receive_nowait`), answered with the message or 204; with
        `?wait=` (and nothing else), a long poll (later_receive.py). Any other parameter (a
        visibility, a batch), a stream's upgrade and every refusal go the general way."""
        query = request.query
        wait_s = 0.0
        if query:
            wait = query.get("wait")
            if wait is None or len(query) != 1:
                return None
            try:
                wait_s = parse_duration(wait, "wait")
            except DirmqError:
                return None
            if wait_s > native.MAX_WAIT_S:
                return None
        headers = request.headers
        if "upgrade" in headers or "x-wait" in headers or "x-visibility" in headers:
            return None
        route = self._fast_route(request, "messages", READ)
        if route is None:
            return None
        try:
            queue = self.broker.queue(route.queue)
        except (DirmqError, UnicodeDecodeError):
            return None
        request.route, request.queue = "messages", route.queue

        def settle(outcome: list[Message] | BaseException) -> None:
            if not _answer(respond, outcome, _delivery) and isinstance(outcome, list):
                self.broker.give_back(queue, outcome)  # the client left while it was leased

        consumer = request.principal or None
        if wait_s <= 0:
            self.broker.receive_nowait(queue, 1, None, settle, consumer, by_file=True)
            return LATER
        receiving = LaterReceive(self.broker, queue, 1, None, wait_s, consumer, settle)
        receiving.start(by_file=True)
        return LATER if receiving.settled else receiving

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int, principal: str = ""
    ) -> Response | None:
        """`contract.BodyCheck`: a publish over its queue's size limit gets its 413 from its
        Content-Length, before the body is read (only for a principal that may publish there:
        the limit tells that the queue exists)."""
        if method != "POST":
            return None
        try:
            route = self._route(path)
        except (DirmqError, UnicodeDecodeError):
            return None
        if self._checked and not self.access.allows(principal, WRITE, route.queue):
            return None
        refusal = native.too_large(self.broker, route, headers, length)
        if refusal is None:
            return None
        return error_response(refusal)

    def body_sink(self, head: Request, length: int) -> BodySink | None:
        """A single-message publish's body goes to the message's file as it arrives
        (`handlers.streamed_file`), for a principal that may publish there; anything it
        cannot take (a batch, a dedup id, a queue with a capacity, any refusal) is read into
        memory and answered the usual way."""
        if head.method != "POST":
            return None
        route = self._fast_route(head, "messages", WRITE)
        if route is None:
            return None
        try:
            if head.query:
                check_native(head.query, route.kind, "POST", "", head.path)
            return native.streamed_file(native.read_publish(self.broker, head, route), length)
        except (DirmqError, UnicodeDecodeError):
            return None

    def public(self, request: Request) -> bool:
        path = request.path
        if path in ("/health", "/health/"):
            return self.access.health_open
        if path in ("/metrics", "/metrics/"):
            return self.access.metrics_open
        return False

    def _route(self, path: str) -> Route:
        route = self._routes.get(path)
        if route is None:
            route = parse_route(path)
            if not route.ref:  # per-message paths would only churn the cache
                if len(self._routes) >= ROUTE_CACHE:
                    self._routes.clear()
                self._routes[path] = route
        return route

    async def _dispatch(self, request: Request, route: Route) -> Response | SwitchProtocols:
        if route.kind == "server":
            if request.query and request.method in ("GET", "HEAD"):
                kind = "metrics" if route.queue == "metrics" else "server"
                check_native(request.query, kind, "GET", "", request.path)
            return await self._server_path(request, route.queue)
        # HEAD is GET without a body, but only where GET changes nothing: never a receive.
        safe_head = request.method == "HEAD" and route.kind in ("root", "queue", "message")
        method = "GET" if safe_head else request.method
        if self._checked:
            self._authorise(request, route, method)
        handler = native.TABLE.get((route.kind, method))
        if handler is None:
            return native.method_not_allowed(route)
        if route.kind == "messages" and method == "GET" and is_websocket(request):
            return self.streams.open(request, route.queue)
        if request.query:
            check_native(request.query, route.kind, method, route.action, request.path)
        if route.kind == "root" and method == "GET":
            visible = self.access.visible(request.principal) if self._checked else None
            return await queues.list_queues(self.broker, request, route, visible)
        return await handler(self.broker, request, route)

    def _authorise(self, request: Request, route: Route, method: str) -> None:
        """Raise the refusal (AccessDenied) unless the principal may do this, judged by the
        queue's name alone: nothing is looked up before."""
        rule = _rule(request, route, method)
        needs = NEEDS.get(rule)
        if needs is None:
            if rule in FILTERED or rule not in native.TABLE:
                return  # the root (filtered), or a method the route has not: 405, nothing to leak
            raise AccessDenied(f"{method} on a {route.kind} route has no permission rule: refused")
        self.access.require(request.principal, needs, route.queue)
        if route.kind == "queue" and method == "PUT":
            target = queues.dead_letter_target(request.body)
            if target is not None:  # its dead letters are written there
                self.access.require(request.principal, WRITE, target)
        if route.kind == "redrive" and method == "POST":
            target = redrive_target(request.body)
            if target is not None:  # the messages are written there (SQS: a DestinationArn)
                self.access.require(request.principal, WRITE, target)

    async def _server_path(self, request: Request, name: str) -> Response:
        if request.method not in ("GET", "HEAD"):
            response = json_error(405, "MethodNotAllowed", f"/{name} is read-only (and reserved)")
            response.headers.append(("Allow", "GET, HEAD"))
            return response
        if name == "health":
            status = 503 if self.broker.closing else 200
            body = {"status": "draining" if self.broker.closing else "ok"}
            return Response(
                status, json.dumps(body).encode() + b"\n", [("Content-Type", "application/json")]
            )
        if name == "metrics":
            if not self.access.may_read_metrics(request.principal):
                raise self.access.refusal(request.principal, "metrics", "/metrics")
            # A scrape reads every worker's files and lists every queue: not on the event loop.
            queue = request.query.get("queue")
            text = await self.broker.call(self.metrics.render, queue)
            return Response(200, text, [("Content-Type", METRICS_CONTENT_TYPE)])
        return Response(200, self._openapi, [("Content-Type", "application/json")])


def _rule(request: Request, route: Route, method: str) -> tuple[str, str]:
    """The key of `NEEDS` for a request: its route kind and method, but a browse
    (`GET /{queue}/messages?peek=1`, decided as `handlers.receive` decides it) is a "peek",
    unless it asks for a stream (which leases, whatever its query says)."""
    if (
        route.kind == "messages"
        and method == "GET"
        and native.is_peek(request)
        and not is_websocket(request)
    ):
        return ("peek", "GET")
    return (route.kind, method)


def with_hint(exc: DirmqError) -> DirmqError:
    """`exc`, saying how this API does what it asks for: a missing queue is created by
    `PUT /{queue}` (the store's words cannot know the door)."""
    if isinstance(exc, QueueNotFound) and exc.queue is not None:
        name = exc.queue
        return QueueNotFound(f"queue {name!r} does not exist: PUT /{name} creates it", name)
    return exc


def _answer(respond: Respond, outcome: T | BaseException, build: Callable[[T], Response]) -> bool:
    """Answer a fast request: `build(outcome)`, a DirmqError's response, or (any other error)
    the 500 that `respond` logs. True if it was sent (the connection was still there)."""
    try:
        if isinstance(outcome, DirmqError):
            response = error_response(with_hint(outcome))
        elif isinstance(outcome, BaseException):
            return respond(outcome)  # logged and answered 500 there
        else:
            response = build(outcome)
    except Exception as exc:  # every request gets its answer, or its connection hangs
        respond(exc)
        return False
    return respond(response)


def _delivery(messages: list[Message]) -> Response:
    """A plain receive's answer: its message, or 204 when there was none."""
    return native.message_response(messages[0]) if messages else Response(204)
