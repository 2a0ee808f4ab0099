"""Publish/subscribe over HTTP, under `/@pubsub` (no queue name starts with `@`).

POST   /@pubsub/publish                                   publish (query parameters, raw body)
GET    /@pubsub/subscribe                                 a subscription as server-sent events
POST   /@pubsub/subscriptions/{name}/deliveries/{key}/{action}   done|dismiss|abort|heartbeat
GET    /@pubsub/subscriptions                             every subscription (JSON list)
DELETE /@pubsub/subscriptions/{name}                      remove a detached subscription
GET    /@pubsub                                           counters (`PubSub.stats`)
GET    /@pubsub/retained                                  a page of the retained log (JSON lines)
GET    /@pubsub/retained/head                             the retained log's head

Everything durable happens in `dirmq.pubsub` on the shared root; this module only maps HTTP onto
it. A subscription attached here is an event stream of this process (`pubsub_stream.py`: its
window, wake-ups, keep-alives and give-back on close), kept in the worker's table of attached
streams: settling one of its deliveries is a POST that must reach this process. A sweeper task
runs `PubSub.maybe_sweep` every `SWEEP_EVERY_S` whether or not anyone is subscribed, so accept
timeouts, crashed sessions' deliveries and unreported outcomes are handled by any live server.

Reading the retained log (`GET /@pubsub/retained`) consumes nothing and holds no state: a page
is `[from, from + limit)` cut at the head (`dirmq.pubsub.retained`), one JSON line per entry (the
body in base64, as in the event stream) and one marker line per entry that is missing or
damaged, so a reader (the Spark source over `url`) can tell data loss from filtering.
`X-Next-Seq` is where the next page starts. What goes on the wire is encoded by
`dirmq.wire.pubsub`, beside the client's decoders.

Permissions (docs/security.md), on `@channel/<channel>` and `@subscription/<name>`: a publish
needs write on its channel (and on its reply_to queue); a subscription needs read on every
channel it may receive (each channel prefix P: a read pattern ending in `*` that matches
`@channel/P`; no channel filter: `@channel/`), a named subscription read on
`@subscription/<name>` too; a retained page, which consumes nothing, browse the same way (a
browse or read pattern); a settle read on the subscription, or to be the principal that
attached the stream; deleting a subscription admin on it; the list shows only the
subscriptions the principal may see (any permission); `GET /@pubsub` is judged as
`/metrics`, the retained head needs a principal only.

Why it is long: eight routes, each with its query parameters, its permission rule (`_authorise`)
and its handler, over one hub and one table of attached streams; the event stream itself is
apart (`pubsub_stream.py`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import unquote

from dirmq.dialects.pubsub_stream import EventStream, StreamBody
from dirmq.errors import DeliveryNotFound, DirmqError, InvalidArgument, MessageTooLarge
from dirmq.pubsub import Mode, PubSub
from dirmq.pubsub.layout import PubSubPaths, is_delivery_key
from dirmq.pubsub.model import (
    DEFAULT_ACCEPT_TIMEOUT_S,
    DEFAULT_PROCESS_TIMEOUT_S,
    Filter,
    check_name,
)
from dirmq.pubsub.policy import (
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_DELIVERIES,
    MAX_DELIVERIES_LIMIT,
)
from dirmq.pubsub.retained import LostEntry, read_retained
from dirmq.pubsub.seqlogs import LogHead
from dirmq.server.access import OPEN, Access
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response, StreamResponse
from dirmq.server.credentials import (
    ADMIN,
    BROWSE,
    CHANNEL_PREFIX,
    READ,
    SUBSCRIPTION_PREFIX,
    WRITE,
)
from dirmq.server.dialect import Dialect
from dirmq.server.errors import error_response, json_error
from dirmq.server.metrics import Metrics
from dirmq.server.parameters import check_parameters, every_value
from dirmq.wire import messages as wire
from dirmq.wire import pubsub as pubsub_wire
from dirmq.wire.durations import parse_duration

log = logging.getLogger("dirmq.server")

PREFIX = "/@pubsub"
SWEEP_EVERY_S = 0.5
DEFAULT_WINDOW = 16
MAX_WINDOW = 1000
MAX_SEQ = 2**62
DEFAULT_RETAINED_LIMIT = 100
MAX_RETAINED_LIMIT = 1000
# A page stops early once its bodies reach this (at least one entry is always sent): 1000
# entries of up to 16 MiB each must not become one response held in memory.
MAX_PAGE_BODY_BYTES = 8 * 1024 * 1024
RETAINED_PARAMETERS = ("from", "limit", "channel", "subject")
MAX_BODY_BYTES = 16 * 1024 * 1024  # as a queue's default max_message_bytes
CLOSE_WAIT_S = 5.0
ACTIONS = ("done", "dismiss", "abort", "heartbeat")


@dataclass(frozen=True, slots=True)
class PubSubRoute:
    # stats | publish | subscribe | subscriptions | subscription | delivery | retained |
    # retained_head
    kind: str
    name: str = ""
    key: str = ""
    action: str = ""


def is_pubsub_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def parse_pubsub_route(path: str) -> PubSubRoute | None:
    """The route of a `/@pubsub...` path (percent-encoded, as sent), or None if it has none."""
    segments = [unquote(s, errors="strict") for s in path[len(PREFIX) :].strip("/").split("/")]
    match segments:
        case [""]:
            return PubSubRoute("stats")
        case ["publish"]:
            return PubSubRoute("publish")
        case ["subscribe"]:
            return PubSubRoute("subscribe")
        case ["retained"]:
            return PubSubRoute("retained")
        case ["retained", "head"]:
            return PubSubRoute("retained_head")
        case ["subscriptions"]:
            return PubSubRoute("subscriptions")
        case ["subscriptions", name]:
            return PubSubRoute("subscription", name=name)
        case ["subscriptions", name, "deliveries", key, action] if action in ACTIONS:
            return PubSubRoute("delivery", name=name, key=key, action=action)
    return None


# The query parameters each endpoint takes (a settle takes `extend` on a heartbeat only);
# anything else is refused, not ignored (`server/parameters.py`).
PARAMETERS: dict[str, frozenset[str]] = {
    "stats": frozenset(),
    "publish": frozenset(
        {
            "channel",
            "subject",
            "mode",
            "id",
            "acks",
            "reply_to",
            "accept_timeout",
            "process_timeout",
            "persistence",
        }
    ),
    "subscribe": frozenset(
        {
            "channel",
            "subject",
            "name",
            "from",
            "window",
            "max_deliveries",
            "backoff",
            "backoff_max",
            "dead_letter",
        }
    ),
    "subscriptions": frozenset(),
    "subscription": frozenset(),
    "delivery": frozenset(),
    "heartbeat": frozenset({"extend"}),
    "retained": frozenset(RETAINED_PARAMETERS),
    "retained_head": frozenset(),
}

_SHAPES = {
    "stats": "",
    "publish": "/publish",
    "subscribe": "/subscribe",
    "subscriptions": "/subscriptions",
    "subscription": "/subscriptions/{name}",
    "delivery": "/subscriptions/{name}/deliveries/{key}/",
    "retained": "/retained",
    "retained_head": "/retained/head",
}

METHODS: dict[str, tuple[str, ...]] = {
    "stats": ("GET",),
    "publish": ("POST",),
    "subscribe": ("GET",),
    "subscriptions": ("GET",),
    "subscription": ("DELETE",),
    "delivery": ("POST",),
    "retained": ("GET",),
    "retained_head": ("GET",),
}


def _json(status: int, data: object, headers: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
    return Response(status, body, [("Content-Type", "application/json"), *(headers or [])])


def _duration(request: Request, name: str, default: float) -> float:
    value = request.query.get(name)
    return default if value is None else parse_duration(value, name)


def _int(value: str | None, name: str, low: int, high: int, default: int | None) -> int | None:
    if value is None:
        return default
    if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
        raise InvalidArgument(f"{name}={value!r} must be an integer from {low} to {high}")
    return int(value)


@dataclass(frozen=True, slots=True)
class RetainedPage:
    lines: list[bytes]  # one JSON document each, without the newline
    next_seq: int
    missing: int


def read_retained_page(
    paths: PubSubPaths, first: int, limit: int, wanted: Filter, head: int
) -> RetainedPage:
    """Entries `first` .. `first + limit - 1` (never past `head`) that match `wanted`, plus a
    marker for each one that is missing or damaged, stopping early once the bodies reach
    `MAX_PAGE_BODY_BYTES`. Blocking: a pool thread."""
    lines: list[bytes] = []
    missing = body_bytes = 0
    next_seq = max(first, min(first + limit, head + 1))  # where a page read to its end stops
    for item in read_retained(paths, first, first + limit, wanted, head=head):
        lines.append(pubsub_wire.encode_retained(item))
        if isinstance(item, LostEntry):
            missing += 1
            continue
        body_bytes += len(item[1].body)
        if body_bytes >= MAX_PAGE_BODY_BYTES:
            next_seq = item[0] + 1
            break
    return RetainedPage(lines, next_seq, missing)


class PubSubApi(Dialect):
    """The `/@pubsub` handlers of one worker process, and its attached streams. On a shared
    port ask it first: no queue name (native or SQS) starts with `@`, and a publish whose body
    or parameters look like an SQS request (`Action=`) is still a publish."""

    name = "pubsub"

    def __init__(self, broker: Broker, metrics: Metrics, access: Access = OPEN) -> None:
        self.broker = broker
        self.metrics = metrics
        self.access = access
        self._hub: PubSub | None = None
        self._retained_head: LogHead | None = None
        self._streams: dict[str, EventStream] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self.closing = False

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        """At startup: sweep a root that already has pub/sub state (a restart after a crash
        must report and return what the dead process left). A root that never used pub/sub gets
        its `@pubsub` directory on the first pub/sub request."""
        if os.path.isdir(PubSubPaths.under(self.broker.store.root).base):
            self._start_hub(self._new_hub())

    def _new_hub(self) -> PubSub:
        return PubSub(self.broker.store, sweep_interval_s=SWEEP_EVERY_S)

    def _start_hub(self, hub: PubSub) -> PubSub:
        if self._hub is None:
            self._hub = hub
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())
        return self._hub

    async def hub(self) -> PubSub:
        if self._hub is not None:
            return self._hub
        return self._start_hub(await self.broker.call(self._new_hub))

    async def _sweep_forever(self) -> None:
        assert self._hub is not None
        while not self.closing:
            await asyncio.sleep(SWEEP_EVERY_S)
            try:
                await self.broker.call(self._hub.maybe_sweep)
            except Exception:  # a bad moment (disk full) must not stop sweeping for good
                log.exception("pub/sub sweep failed")

    async def close(self) -> None:
        """Before the broker's pool stops: end every stream (clients see the end of the event
        stream; what they held goes back) and stop sweeping."""
        self.closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        for stream in list(self._streams.values()):
            stream.stop()
        deadline = time.monotonic() + CLOSE_WAIT_S
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    # -- dispatch --------------------------------------------------------------------------------
    def claims(self, request: Request) -> bool:
        return request.path.startswith("/@") and is_pubsub_path(request.path)

    def public(self, request: Request) -> bool:
        return request.path.rstrip("/") == PREFIX and self.access.metrics_open

    async def __call__(self, request: Request) -> Response | StreamResponse:
        try:
            response = await self._answer(request)
        except DirmqError as exc:
            response = error_response(exc)
        except UnicodeDecodeError:
            response = json_error(400, "InvalidName", "the path is not valid UTF-8 once decoded")
        return response

    async def _answer(self, request: Request) -> Response | StreamResponse:
        request.route = "invalid"  # until the path is one of ours
        route = parse_pubsub_route(request.path)
        if route is None:
            return json_error(404, "NotFound", f"no pub/sub endpoint at {request.path}")
        request.route = route.kind
        request.queue = route.name
        allowed = METHODS[route.kind]
        if request.method not in allowed:
            response = json_error(405, "MethodNotAllowed", f"use {', '.join(allowed)} here")
            response.headers.append(("Allow", ", ".join(allowed)))
            return response
        if self.access.enabled:
            self._authorise(request, route)
        if request.query:
            kind = "heartbeat" if route.action == "heartbeat" else route.kind
            where = f"{request.method} {PREFIX}{_SHAPES[route.kind]}{route.action}"
            check_parameters(request.query, PARAMETERS[kind], where)
        handler = self._handlers()[route.kind]
        return await handler(request, route)

    def _authorise(self, request: Request, route: PubSubRoute) -> None:
        """Raise the refusal unless the principal may do this, judged by names alone (see the
        module's docstring). A settle is judged by `settle`, which knows the stream's owner."""
        access, principal, query = self.access, request.principal, request.query
        if route.kind == "stats":
            if not access.may_read_metrics(principal):
                raise access.refusal(principal, "metrics", PREFIX)
        elif route.kind == "publish":
            channel = query.get("channel")
            if channel is not None:
                access.require(principal, WRITE, CHANNEL_PREFIX + channel, "channel")
            reply_to = query.get("reply_to")
            if reply_to:
                access.require(principal, WRITE, reply_to, "reply_to queue")
        elif route.kind in ("subscribe", "retained"):
            # Attaching a subscription consumes (deliveries are taken from its pool): read. A
            # retained page only looks: browse (which read grants too).
            needs = READ if route.kind == "subscribe" else BROWSE
            name = query.get("name") if route.kind == "subscribe" else None
            if name:
                access.require(principal, READ, SUBSCRIPTION_PREFIX + name, "subscription")
            dead_letter = query.get("dead_letter") if route.kind == "subscribe" else None
            if dead_letter:
                access.require(principal, WRITE, dead_letter, "dead_letter queue")
            where = f"{request.method} {request.path}"
            prefixes = [v for k, v in every_value(request.raw_query, where) if k == "channel" and v]
            for prefix in prefixes or [""]:
                if not access.covers(principal, needs, CHANNEL_PREFIX + prefix):
                    every = f"every channel starting with {prefix!r}"
                    raise access.refusal(principal, needs, every)
        elif route.kind == "subscription":
            access.require(principal, ADMIN, SUBSCRIPTION_PREFIX + route.name, "subscription")

    def _handlers(
        self,
    ) -> dict[str, Callable[[Request, PubSubRoute], Awaitable[Response | StreamResponse]]]:
        return {
            "stats": self.stats,
            "publish": self.publish,
            "subscribe": self.subscribe,
            "subscriptions": self.list_subscriptions,
            "subscription": self.delete_subscription,
            "delivery": self.settle,
            "retained": self.read_retained,
            "retained_head": self.retained_head,
        }

    # -- handlers --------------------------------------------------------------------------------
    async def stats(self, request: Request, route: PubSubRoute) -> Response:
        hub = await self.hub()
        stats = await self.broker.call(hub.stats)
        return _json(200, {**stats, "streams": len(self._streams)})

    async def publish(self, request: Request, route: PubSubRoute) -> Response:
        query = request.query
        channel = query.get("channel")
        if channel is None:
            raise InvalidArgument("publish needs channel= (the channel to publish to)")
        if len(request.body) > MAX_BODY_BYTES:
            raise MessageTooLarge(
                f"message is {len(request.body)} bytes; pub/sub accepts at most {MAX_BODY_BYTES}"
            )
        kwargs = {
            "subject": query.get("subject", ""),
            "mode": query.get("mode", Mode.ANYONE.value),
            "headers": wire.stored_headers(request.raw_headers),
            "message_id": query.get("id") or None,
            "acks": query.get("acks", ""),
            "reply_to": query.get("reply_to") or None,
            "accept_timeout_s": _duration(request, "accept_timeout", DEFAULT_ACCEPT_TIMEOUT_S),
            "process_timeout_s": _duration(request, "process_timeout", DEFAULT_PROCESS_TIMEOUT_S),
            "persistence": query.get("persistence", "writethrough"),
        }
        hub = await self.hub()
        # Shielded: a publisher that hangs up does not interrupt a publish half written (the
        # sweeper would finish it, but later).
        published = await asyncio.shield(
            self.broker.call(hub.publish, channel, request.body, **kwargs)
        )
        self.metrics.pubsub_published.labels(published.mode.value).inc()
        return _json(201, pubsub_wire.encode_published(published), [("X-Message-Id", published.id)])

    async def subscribe(self, request: Request, route: PubSubRoute) -> StreamResponse:
        if self.closing:
            raise InvalidArgument("the server is shutting down")
        channels: list[str] = []
        subjects: list[str] = []
        for key, value in every_value(request.raw_query, f"{request.method} {request.path}"):
            if key == "channel":
                channels.append(value)
            elif key == "subject":
                subjects.append(value)
        name = request.query.get("name") or None
        replay_from = _int(request.query.get("from"), "from", 1, 2**62, None)
        window = _int(request.query.get("window"), "window", 1, MAX_WINDOW, DEFAULT_WINDOW)
        assert window is not None
        max_deliveries = _int(
            request.query.get("max_deliveries"),
            "max_deliveries",
            0,
            MAX_DELIVERIES_LIMIT,
            DEFAULT_MAX_DELIVERIES,
        )
        assert max_deliveries is not None
        hub = await self.hub()
        sub = await self.broker.call(
            hub.subscribe,
            name,
            channels=[c for c in channels if c],
            subjects=[s for s in subjects if s],
            replay_from=replay_from,
            max_deliveries=max_deliveries,
            backoff_s=_duration(request, "backoff", DEFAULT_BACKOFF_S),
            backoff_max_s=_duration(request, "backoff_max", DEFAULT_BACKOFF_MAX_S),
            dead_letter=request.query.get("dead_letter") or None,
        )
        stream = EventStream(self.broker, self.metrics, sub, window, request.principal, self.forget)
        self._streams[sub.name] = stream
        self.metrics.pubsub_attached.inc()
        return StreamResponse(200, StreamBody(stream), list(pubsub_wire.SSE_HEADERS))

    def _head(self, hub: PubSub) -> int:
        if self._retained_head is None:
            self._retained_head = LogHead(hub.retained.directory, hub.retained.refresh_head)
        return self._retained_head.current()

    async def read_retained(self, request: Request, route: PubSubRoute) -> Response:
        channels: list[str] = []
        subjects: list[str] = []
        for key, value in every_value(request.raw_query, f"{request.method} {request.path}"):
            if key == "channel" and value:
                channels.append(value)
            elif key == "subject" and value:
                subjects.append(value)
        wanted = Filter(tuple(channels), tuple(subjects))
        first = _int(request.query.get("from"), "from", 1, MAX_SEQ, 1)
        limit = _int(
            request.query.get("limit"), "limit", 1, MAX_RETAINED_LIMIT, DEFAULT_RETAINED_LIMIT
        )
        assert first is not None and limit is not None
        hub = await self.hub()

        def page() -> tuple[RetainedPage, int]:
            head = self._head(hub)
            return read_retained_page(hub.paths, first, limit, wanted, head), head

        result, head = await self.broker.call(page)
        body = b"".join(line + b"\n" for line in result.lines)
        return Response(200, body, pubsub_wire.page_headers(result.next_seq, head, result.missing))

    async def retained_head(self, request: Request, route: PubSubRoute) -> Response:
        hub = await self.hub()
        head = await self.broker.call(self._head, hub)
        return _json(200, pubsub_wire.encode_head(head), [(pubsub_wire.HEAD_HEADER, str(head))])

    async def settle(self, request: Request, route: PubSubRoute) -> Response:
        check_name("subscription name", route.name)
        if not is_delivery_key(route.key):
            raise InvalidArgument(f"{route.key[:200]!r} is not a delivery key")
        stream = self._streams.get(route.name)
        principal = request.principal
        allowed = self.access.allows(principal, READ, SUBSCRIPTION_PREFIX + route.name)
        if not allowed and (stream is None or stream.owner != principal):
            # The same refusal whether the stream is attached here or not.
            raise self.access.refusal(principal, READ, f"subscription {route.name!r}")
        if stream is None:
            raise DeliveryNotFound(
                f"subscription {route.name!r} is not attached to this server process (with "
                "--workers N, settle on the worker holding the stream)"
            )
        extend_s = None
        if route.action == "heartbeat" and "extend" in request.query:
            extend_s = parse_duration(request.query["extend"], "extend")
        deadline = await stream.settle(route.key, route.action, extend_s)
        if deadline is None:
            return Response(204)
        return _json(200, pubsub_wire.encode_deadline(deadline))

    async def list_subscriptions(self, request: Request, route: PubSubRoute) -> Response:
        hub = await self.hub()
        found = await self.broker.call(hub.subscriptions)
        if self.access.enabled:
            visible = self.access.visible(request.principal, SUBSCRIPTION_PREFIX)
            found = [s for s in found if visible(str(s["name"]))]
        return _json(200, found)

    async def delete_subscription(self, request: Request, route: PubSubRoute) -> Response:
        check_name("subscription name", route.name)
        hub = await self.hub()
        if not await self.broker.call(os.path.isdir, hub.paths.sub(route.name)):
            return json_error(404, "SubscriptionNotFound", f"no subscription {route.name!r}")
        await self.broker.call(hub.delete_subscription, route.name)
        return Response(204)

    def forget(self, stream: EventStream) -> None:
        if self._streams.get(stream.sub.name) is stream:
            del self._streams[stream.sub.name]
            self.metrics.pubsub_attached.dec()
