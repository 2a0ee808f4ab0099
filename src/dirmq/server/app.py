"""Request dispatch for the native API: route, call the handler, map errors to statuses, count."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from importlib import resources

from dirmq.errors import DirmqError, QueueNotFound
from dirmq.server import native
from dirmq.server.broker import Broker
from dirmq.server.errors import error_response, json_error
from dirmq.server.http import LATER, Handler, Later, Request, Respond, Response, StreamResponse
from dirmq.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from dirmq.server.metrics import Metrics
from dirmq.server.parameters import check_native
from dirmq.server.pubsub import PubSubApi, is_pubsub_path
from dirmq.server.routes import Route, parse_route

ROUTE_CACHE = 4096  # paths without a message reference, parsed and validated once

_COUNTED: dict[native.Handler, str] = {
    native.publish: "published",
    native.receive: "delivered",
    native.ack: "acked",
}


class NativeApp:
    def __init__(
        self,
        broker: Broker,
        metrics: Metrics,
        sqs: Handler | None = None,
        is_sqs: Callable[[Request], bool] | None = None,
        pubsub: PubSubApi | None = None,
    ) -> None:
        self.broker = broker
        self.metrics = metrics
        self.pubsub = pubsub if pubsub is not None else PubSubApi(broker, metrics)
        # Another dialect on the same port (SQS): composed in serve.py, so this layer does not
        # import the layers built on it.
        self.sqs = sqs
        self.is_sqs = is_sqs
        self._openapi = resources.files("dirmq.server").joinpath("openapi.json").read_bytes()
        self._routes: dict[str, Route] = {}

    async def __call__(self, request: Request) -> Response | StreamResponse:
        started = time.monotonic()
        label = "invalid"
        # `/@pubsub` first: no queue name (native or SQS) starts with `@`, and a publish body or
        # parameter that looks like an SQS request (`Action=`) is still a publish.
        pubsub = request.path.startswith("/@") and is_pubsub_path(request.path)
        if not pubsub and self.sqs is not None and self.is_sqs is not None and self.is_sqs(request):
            return await self.sqs(request)
        try:
            if pubsub:
                label = "pubsub"
                response = await self.pubsub(request)
            else:
                route = self._route(request.path)
                label = route.label
                response = await self._dispatch(request, route)
        except DirmqError as exc:
            response = error_response(exc)
            if self.sqs is not None and _is_sqs_queue_url(request, exc):
                response = _sqs_unknown_operation()
        except UnicodeDecodeError:
            response = json_error(400, "InvalidName", "the path is not valid UTF-8 once decoded")
        method = request.method if request.method in _METHODS else "other"
        self.metrics.answered(label, method, response.status, time.monotonic() - started)
        return response

    def fast(self, request: Request, respond: Respond) -> Response | Later | None:
        """The plain publish, answered without a Task (see `http.FastHandler`); anything else,
        and every error, is left to `__call__`."""
        if request.method != "POST" or request.path.startswith("/@"):
            return None
        if self.is_sqs is not None and self.is_sqs(request):
            return None
        try:
            route = self._route(request.path)
        except (DirmqError, UnicodeDecodeError):
            return None
        if route.kind != "messages":
            return None
        started = time.monotonic()
        metrics, queue = self.metrics, route.queue

        def settle(outcome: list[str] | BaseException) -> None:
            try:
                if isinstance(outcome, DirmqError):
                    response = error_response(outcome)
                elif isinstance(outcome, BaseException):
                    respond(outcome)  # logged and answered 500 there
                    return
                else:
                    response = native.published(outcome[0])
                    metrics.count("published", queue)
                metrics.answered("messages", "POST", response.status, time.monotonic() - started)
            except Exception as exc:  # every request gets its answer, or its connection hangs
                respond(exc)
                return
            respond(response)

        return LATER if native.publish_now(self.broker, request, route, settle) else None

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int
    ) -> Response | None:
        """`http.BodyCheck`: a publish over its queue's size limit gets its 413 from its
        Content-Length, before the body is read."""
        if method != "POST" or path.startswith("/@"):
            return None
        try:
            route = self._route(path)
        except (DirmqError, UnicodeDecodeError):
            return None
        refusal = native.too_large(self.broker, route, headers, length)
        if refusal is None:
            return None
        response = error_response(refusal)
        self.metrics.answered(route.label, method, response.status, 0.0)
        return response

    def _route(self, path: str) -> Route:
        route = self._routes.get(path)
        if route is None:
            route = parse_route(path)
            if not route.ref:  # per-message paths would only churn the cache
                if len(self._routes) >= ROUTE_CACHE:
                    self._routes.clear()
                self._routes[path] = route
        return route

    async def _dispatch(self, request: Request, route: Route) -> Response:
        if route.kind == "server":
            if request.query and request.method in ("GET", "HEAD"):
                check_native(request.query, "server", "GET", "", request.path)
            return await self._server_path(request, route.queue)
        # HEAD is GET without a body, but only where GET changes nothing: never a receive.
        safe_head = request.method == "HEAD" and route.kind in ("root", "queue", "message")
        method = "GET" if safe_head else request.method
        handler = native.TABLE.get((route.kind, method))
        if handler is None:
            return native.method_not_allowed(route)
        if request.query:
            check_native(request.query, route.kind, method, route.action, request.path)
        response = await handler(self.broker, request, route)
        counter = _COUNTED.get(handler)
        if counter is not None and response.status in (200, 201, 204):
            self._count(counter, route.queue, request, response)
        return response

    def _count(self, counter: str, queue: str, request: Request, response: Response) -> None:
        if counter == "published":
            for name, ids in response.headers:
                if name == "X-Message-Id":
                    self.metrics.count(counter, queue, ids.count(",") + 1 if ids else 0)
                    return
        elif counter == "delivered" and response.status == 200:
            count = 1 if "max" not in request.query else response.body.count(b"\r\nX-Message-Id:")
            self.metrics.count(counter, queue, max(count, 1))
        elif counter == "acked" and response.status == 204:
            self.metrics.count(counter, queue)

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
            # Collecting reads every queue's stats: not on the event loop.
            text = await self.broker.call(self.metrics.render)
            return Response(200, text, [("Content-Type", METRICS_CONTENT_TYPE)])
        return Response(200, self._openapi, [("Content-Type", "application/json")])


_SQS_QUEUE_URL = re.compile(r"/[0-9]{12}/[A-Za-z0-9_-]{1,80}(\.fifo)?/?")


def _is_sqs_queue_url(request: Request, exc: DirmqError) -> bool:
    """A GET of an SQS queue URL without an Action that names no native queue: AWS's answer is
    an UnknownOperationException, not the native API's 404."""
    return (
        request.method == "GET"
        and isinstance(exc, QueueNotFound)
        and _SQS_QUEUE_URL.fullmatch(request.path) is not None
    )


def _sqs_unknown_operation() -> Response:
    body = b'<?xml version="1.0"?><UnknownOperationException/>'
    return Response(404, body, [("Content-Type", "text/xml")])


_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
