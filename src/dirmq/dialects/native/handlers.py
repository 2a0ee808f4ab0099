"""The native HTTP API: a superset of SoftLayer MQ's six endpoints, with MQ's status codes.

GET, PUT, DELETE / and /{queue}: the queue routes (queues.py)
POST   /{queue}/messages                  publish: 201 + X-Message-Id; a batch if the body is
                                          multipart/mixed or JSON lines (one group commit)
GET    /{queue}/messages                  receive: 200 + body, 204 if empty; ?wait= ?visibility=
                                          ?max= (multipart/mixed), ?peek=1 to browse as JSON
                                          (&after=<id>: the page after that message;
                                          &state=ready|in_flight|delayed|dead)
DELETE /{queue}/messages                  purge (?state=dead: the dead area)
GET    /{queue}/messages/{id}             peek, without leasing
DELETE /{queue}/messages/{id|receipt}     ack: by id (MQ semantics) or by receipt (stale: 409)
POST   /{queue}/messages/{receipt}/nack   ?delay=; X-Outcome: returned, delayed, dead-lettered
POST   /{queue}/messages/{receipt}/extend ?visibility=
POST   /{queue}/messages/{receipt}/dead-letter ?reason=TEXT (kept as X-Dead-Detail)
                                          &kind=rejected|unreadable
POST   /{queue}/messages/ack              many receipts at once: {"receipts": [...]}
POST   /{queue}/messages/nack             {"receipts": [...], "delay": ...} (delay optional)
POST   /{queue}/messages/extend           {"receipts": [...], "visibility": ...}
                                          answered 200 {"settled": N, "failed": [...]}
POST, GET /{queue}/redrive; GET, DELETE /{queue}/redrive/{task}: redrive tasks (redrive.py)
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from dirmq.dialects.native import batch, redrive
from dirmq.dialects.native.queues import (
    delete_queue,
    get_queue,
    json_response,
    list_queues,
    put_queue,
)
from dirmq.dialects.native.routes import Route
from dirmq.errors import (
    DirmqError,
    InvalidArgument,
    MessageNotFound,
    MessageTooLarge,
    QueueNotFound,
)
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.server.errors import json_error
from dirmq.server.queuecounts import PUBLISHED
from dirmq.store import Durability, Message, OutgoingMessage, Queue
from dirmq.store.bodyfiles import FileBody
from dirmq.store.events import REASON_REJECTED
from dirmq.store.ids import is_id
from dirmq.store.layout import parse_receipt
from dirmq.store.streamed import StreamedFile, streamable
from dirmq.wire import messages as wire
from dirmq.wire.durations import parse_duration

MAX_RECEIVE = 1000
MAX_WAIT_S = 3600.0
Handler = Callable[[Broker, Request, Route], Awaitable[Response]]


def _param(request: Request, name: str, header: str | None = None) -> str | None:
    value = request.query.get(name)
    if value is None and header is not None:
        value = request.headers.get(header)
    return value


def _duration(request: Request, name: str, header: str | None = None) -> float | None:
    value = _param(request, name, header)
    return None if value is None else parse_duration(value, name)


def _int(request: Request, name: str, low: int, high: int) -> int | None:
    value = request.query.get(name)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
        raise InvalidArgument(f"{name}={value!r} must be an integer from {low} to {high}")
    return int(value)


def _durability(request: Request) -> Durability | None:
    value = _param(request, "durability", "x-durability")
    if value is None:
        return None
    try:
        return Durability(value.lower())
    except ValueError:
        choices = ", ".join(d.value for d in Durability)
        raise InvalidArgument(f"durability={value!r} must be one of {choices}") from None


# -- messages --------------------------------------------------------------------------------
@dataclass(slots=True)  # not frozen: one is built per publish, and frozen ones build slower
class Publish:
    """A publish request, read and validated: what the broker stores, and how to answer."""

    queue: Queue
    messages: list[OutgoingMessage]
    durability: Durability | None = None
    timeout_s: float = 0.0  # at capacity: 504 at once unless the request says to wait
    batch: bool = False


def read_publish(broker: Broker, request: Request, route: Route) -> Publish:
    """The one reading of a publish request, for both ways of answering it (`publish`, and
    the app's fast path): InvalidArgument & co. for anything wrong, nothing stored."""
    queue = broker.queue(route.queue)  # 404 before anything is written: never strand a message
    content_type = request.headers.get("content-type")
    batch = wire.is_batch(content_type)
    if not request.query and request.headers.keys().isdisjoint(_PUBLISH_HEADERS) and not batch:
        # No delay, dedup id, group, durability nor timeout: the usual request, in one step.
        message = OutgoingMessage(request.body, wire.stored_headers(request.raw_headers))
        queue.validate(message)
        return Publish(queue, [message])
    delay_s = _duration(request, "delay", "x-delay")
    ttl_s = _duration(request, "ttl", "x-ttl")
    dedup_id = _param(request, "dedup", "x-dedup-id")
    group = _param(request, "group", "x-group")
    given = _param(request, "priority", "x-priority")
    priority = None if given is None else wire.parse_priority(given)
    if batch:
        if dedup_id is not None:
            raise InvalidArgument("in a batch, give each message its own dedup id (X-Dedup-Id)")
        messages = [
            replace(
                m,
                delay_s=delay_s if m.delay_s is None else m.delay_s,
                group=group if m.group is None else m.group,
                ttl_s=ttl_s if m.ttl_s is None else m.ttl_s,
                priority=m.priority or priority or 0,
            )
            for m in wire.parse_batch(content_type or "", request.body)
        ]
        if not messages:
            raise InvalidArgument("the batch holds no messages")
    else:
        headers = wire.stored_headers(request.raw_headers)
        messages = [
            OutgoingMessage(request.body, headers, delay_s, dedup_id, group, ttl_s, priority or 0)
        ]
    for message in messages:
        queue.validate(message)
    timeout_s = _duration(request, "timeout", "x-timeout") or 0.0
    return Publish(queue, messages, _durability(request), timeout_s, batch)


def published_response(publish: Publish, ids: list[str]) -> Response:
    if not publish.batch:
        return published(ids[0])
    return json_response(201, {"ids": ids}, [("X-Message-Id", ",".join(ids))])


async def publish(broker: Broker, request: Request, route: Route) -> Response:
    read = read_publish(broker, request, route)
    if request.upload is not None:
        return await _publish_streamed(broker, request, read)
    ids = await broker.publish(
        read.queue, read.messages, durability=read.durability, timeout_s=read.timeout_s
    )
    return published_response(read, ids)


def streamed_file(read: Publish, length: int) -> StreamedFile | None:
    """The file a publish's body of `length` bytes is written to as it arrives (its head
    written), when it is one message with no dedup id for a queue that takes one
    (`streamed.streamable`), at its priority and with its time to live (its own or its
    queue's); None: the body is read into memory (within the server's body budget) and
    published the usual way."""
    message = read.messages[0]
    if read.batch or message.dedup_id is not None or not streamable(read.queue):
        return None
    return StreamedFile.create(
        read.queue,
        length,
        message.headers,
        message.group,
        read.durability,
        priority=message.priority,
        ttl_s=message.ttl_s,
    )


async def _publish_streamed(broker: Broker, request: Request, read: Publish) -> Response:
    """A publish whose body went to its file as it arrived (`streamed_file`): published once
    the last byte is written, as durably as any other (the runtime discards it otherwise)."""
    assert request.upload is not None
    sink = await request.upload.written()
    if not isinstance(sink, StreamedFile):  # only `streamed_file` makes the native API's sinks
        raise TypeError(f"a publish's body went to a {type(sink).__name__}")
    delay_s = read.messages[0].delay_s
    message_id = await broker.call(sink.publish, delay_s)
    broker.moved(PUBLISHED, read.queue.name, 1)
    return published(message_id)


def too_large(
    broker: Broker, route: Route, headers: dict[str, str], length: int
) -> MessageTooLarge | None:
    """A single-message publish whose Content-Length is over its queue's `max_message_bytes`:
    refused before its body is read (a batch's messages are checked one by one once read)."""
    if route.kind != "messages" or wire.is_batch(headers.get("content-type")):
        return None
    try:
        limit = broker.queue(route.queue).config.max_message_bytes
    except DirmqError:
        return None  # the handler reports it (a missing queue: 404)
    if length <= limit:
        return None
    # The words of `Queue.validate`'s refusal: the same limit, the same message.
    return MessageTooLarge.for_queue(route.queue, length, limit)


# Where a publish's options may come from, besides the query (see `publish`).
_PUBLISH_HEADERS = frozenset(
    {"x-delay", "x-dedup-id", "x-group", "x-durability", "x-timeout", "x-ttl", "x-priority"}
)


def published(message_id: str) -> Response:
    # json_response's bytes: an id is digits, hex and a dash (nothing to escape).
    body = b'{"id":"%s"}\n' % message_id.encode()
    return Response(201, body, [("Content-Type", "application/json"), ("X-Message-Id", message_id)])


def is_peek(request: Request) -> bool:
    """Whether a `GET /{queue}/messages` browses (`?peek=1`) rather than receives: the one
    test of it, which the authorisation (browse, not read) relies on too."""
    return request.query.get("peek", "").lower() in ("1", "true", "yes")


async def receive(broker: Broker, request: Request, route: Route) -> Response:
    queue = broker.queue(route.queue)
    if is_peek(request):
        return await _browse(broker, queue, request)
    if "state" in request.query:
        raise InvalidArgument("state= chooses what a browse shows: give peek=1 too")
    max_count = _int(request, "max", 1, MAX_RECEIVE)
    wait_s = _duration(request, "wait", "x-wait") or 0.0
    if wait_s > MAX_WAIT_S:
        raise InvalidArgument(f"wait must be at most {MAX_WAIT_S:.0f} s")
    visibility_s = _duration(request, "visibility", "x-visibility")
    messages = await broker.receive(
        queue,
        max_count or 1,
        visibility_s,
        wait_s,
        consumer=request.principal or None,
        by_file=max_count is None,  # one message: its body may be sent from its file
    )
    if not messages:
        return Response(204)
    if max_count is None:
        return message_response(messages[0])
    content_type, body = wire.multipart_messages(messages)
    return Response(200, body, [("Content-Type", content_type)])


async def _browse(broker: Broker, queue: Queue, request: Request) -> Response:
    limit = _int(request, "max", 1, MAX_RECEIVE) or 100
    after = request.query.get("after")  # a page: the ready messages after this id
    if after is not None and not is_id(after):
        raise InvalidArgument(f"after={after[:80]!r} is not a dirmq message id")

    state = _state(request.query.get("state", "ready"))

    def snapshot() -> list[Message]:
        return list(queue.browse(limit, after=after, state=state))

    messages = await broker.call(snapshot)
    return json_response(200, {"messages": [wire.message_json(m) for m in messages]})


def message_response(message: Message) -> Response:
    """A message as the answer to a GET; a large body left in its file by the lease
    (`Broker.receive(by_file=True)`) is sent from there."""
    body = message.body
    if isinstance(body, FileBody):
        return Response(200, b"", wire.delivery_headers(message), file=body)
    return Response(200, body, wire.delivery_headers(message))


# What `state=` may say (a browse's, a purge's), and the store's name for it.
_STATES = {
    "ready": "ready",
    "in_flight": "leased",
    "leased": "leased",
    "delayed": "delayed",
    "dead": "dead",
}


def _state(value: str) -> str:
    try:
        return _STATES[value]
    except KeyError:
        raise InvalidArgument(
            f"state={value[:40]!r} must be one of ready, in_flight, delayed, dead"
        ) from None


async def purge(broker: Broker, request: Request, route: Route) -> Response:
    """Every live message (ready, in flight, delayed), or with `state=dead` the queue's own
    dead area (and nothing else)."""
    queue = broker.queue(route.queue)
    state = request.query.get("state")
    if state is not None and state != "dead":
        raise InvalidArgument(
            f"state={state[:40]!r}: a purge takes state=dead (the dead area), or no state "
            "(every live message)"
        )
    removed = await broker.call(queue.purge, dead=state == "dead")
    return json_response(200, {"purged": removed})


async def peek(broker: Broker, request: Request, route: Route) -> Response:
    queue = broker.queue(route.queue)
    if not is_id(route.ref):
        raise InvalidArgument(f"{route.ref!r} is not a message id")
    return message_response(await broker.call(queue.peek, route.ref))


async def ack(broker: Broker, request: Request, route: Route) -> Response:
    queue = broker.queue(route.queue)
    receipt = request.query.get("receipt") or request.headers.get("x-receipt")
    ref_is_receipt = parse_receipt(route.ref) is not None
    if receipt is not None and receipt != route.ref and not receipt.startswith(f"{route.ref}."):
        raise InvalidArgument(f"receipt {receipt!r} does not belong to message {route.ref!r}")
    if receipt is None and ref_is_receipt:
        receipt = route.ref
    if receipt is not None:
        await broker.ack(queue, receipt)
        return Response(204)
    if not is_id(route.ref):
        raise InvalidArgument(f"{route.ref!r} is neither a message id nor a receipt")
    if not await broker.call(queue.delete, route.ref):
        raise MessageNotFound(f"no message {route.ref} in queue {route.queue!r}")
    return Response(204)


async def settle(broker: Broker, request: Request, route: Route) -> Response:
    queue = broker.queue(route.queue)
    if parse_receipt(route.ref) is None:
        raise InvalidArgument(f"{route.ref!r} is not a receipt (<message id>.<receive count>)")
    if route.action == "nack":
        delay_s = _duration(request, "delay", "x-delay") or 0.0
        outcome = await broker.nack(queue, route.ref, delay_s)
        return Response(204, b"", [("X-Outcome", outcome)])
    if route.action == "extend":
        visibility_s = _duration(request, "visibility", "x-visibility")
        if visibility_s is None:
            raise InvalidArgument("extend needs visibility= (e.g. 30s)")
        await broker.call(queue.extend, route.ref, visibility_s)
        return Response(204)
    # A consumer's verdict: ?reason= is its own words (the detail), ?kind= rejected/unreadable.
    detail = request.query.get("reason")
    kind = request.query.get("kind", REASON_REJECTED)
    await broker.call(queue.dead_letter, route.ref, detail, reason=kind)
    return Response(204, b"", [("X-Outcome", "dead-lettered")])


TABLE: dict[tuple[str, str], Handler] = {
    ("root", "GET"): list_queues,
    ("queue", "GET"): get_queue,
    ("queue", "PUT"): put_queue,
    ("queue", "DELETE"): delete_queue,
    ("messages", "POST"): publish,
    ("messages", "GET"): receive,
    ("messages", "DELETE"): purge,
    ("message", "GET"): peek,
    ("message", "DELETE"): ack,
    ("action", "POST"): settle,
    ("batch", "POST"): batch.settle_batch,
    ("redrive", "POST"): redrive.start,
    ("redrive", "GET"): redrive.list_tasks,
    ("task", "GET"): redrive.get_task,
    ("task", "DELETE"): redrive.cancel_task,
}


def allowed(kind: str) -> list[str]:
    return sorted(method for k, method in TABLE if k == kind)


def method_not_allowed(route: Route) -> Response:
    methods = allowed(route.kind)
    response = json_error(405, "MethodNotAllowed", f"use {', '.join(methods)} here")
    response.headers.append(("Allow", ", ".join(methods)))
    return response


__all__ = ["TABLE", "QueueNotFound", "method_not_allowed"]
