"""The yaq dialect (`--yaq-listen`): the yaq README's API, on dirmq queues.

    POST {queue-path}[?timeout=]                  enqueue: 200; at capacity wait, 504 on timeout
    GET  {queue-path}[?timeout=]                  dequeue one: 200 + body; waits (forever by
                                                  default), 504 on timeout
    GET  {queue-path}?quantity=N[&timeout=]       202, chunked multipart/mixed, one part per
                                                  message as it is dequeued; the timeout applies
                                                  to each message; an `X-Next-Message-Status`
                                                  trailer (504, 500) when fewer than N came
    GET  {queue-path}?quantity=unlimited          stream until the client disconnects

The queue is the whole URL path, percent-decoded (`/fish/saltwater`, `/snazzy%20party`); queues
are created on first use. yaq's root queue `/` is the dirmq queue named `_root`. Dequeue is
destructive, as in yaq, but a message is acknowledged only after it was handed to the socket:
one whose client vanished first is given back, never lost. Content-Type and Content-Encoding
are kept. Decisions where yaq's README contradicts itself are in docs/yaq.md.

With credentials (docs/security.md): an enqueue needs `write` on the queue (and creates it if
absent: yaq's queues are made by use), a dequeue `read` (`browse` is not enough: yaq has no way
to look without dequeuing); `/health` is as on the native port.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import unquote

from dirmq.errors import (
    DirmqError,
    InvalidArgument,
    MessageTooLarge,
    QueueNotFound,
    StaleReceipt,
)
from dirmq.server.access import OPEN, Access
from dirmq.server.broker import Broker
from dirmq.server.contract import BodySink, Request, Response, StreamResponse
from dirmq.server.credentials import READ, WRITE
from dirmq.server.dialect import Dialect
from dirmq.server.errors import CHALLENGES, status_of
from dirmq.server.parameters import check_parameters
from dirmq.server.queuecounts import PUBLISHED
from dirmq.store import Message, OutgoingMessage, Queue, QueueConfig
from dirmq.store.bodyfiles import FileBody
from dirmq.store.names import validate_queue_name
from dirmq.store.streamed import StreamedFile, streamable
from dirmq.wire import framing
from dirmq.wire import messages as wire
from dirmq.wire.durations import parse_duration

ROOT_QUEUE = "_root"
LEASE_S = 60.0  # how long a dequeued message may take to reach the socket
CREATION_POLL_S = 0.25  # how often a dequeue of a queue not yet created looks for it
TRAILER = "X-Next-Message-Status"
# yaq's own parameters only (docs/yaq.md): another is refused, not ignored.
PARAMETERS = {"POST": frozenset({"timeout"}), "GET": frozenset({"timeout", "quantity"})}


def _text(status: int, message: str) -> Response:
    return Response(
        status, message.encode() + b"\n", [("Content-Type", "text/plain; charset=utf-8")]
    )


class YaqApp(Dialect):
    name = "yaq"

    def __init__(self, broker: Broker, access: Access = OPEN) -> None:
        self.broker = broker
        self.access = access

    def public(self, request: Request) -> bool:
        return request.method == "GET" and request.path == "/health" and self.access.health_open

    def refuse(self, request: Request, error: DirmqError) -> Response:
        return _refusal(error)

    async def __call__(self, request: Request) -> Response | StreamResponse:
        try:
            name = unquote(request.path, errors="strict").strip("/") or ROOT_QUEUE
            request.route = "enqueue" if request.method == "POST" else "dequeue"
            request.queue = name
            if request.method in ("POST", "GET") and not (
                request.method == "GET" and name == "health"
            ):
                permission = WRITE if request.method == "POST" else READ
                self.access.require(request.principal, permission, name)
            if request.query:
                accepted = PARAMETERS.get(request.method)
                if accepted is not None:
                    check_parameters(request.query, accepted, f"a yaq {request.method}")
            timeout = request.query.get("timeout")
            timeout_s = None if timeout is None else parse_duration(timeout, "timeout")
            if request.method == "POST":
                return await self._enqueue(name, request, timeout_s)
            if request.method == "GET":
                if name == "health":  # as on the native port (no queue may be named so)
                    return self._health()
                return await self._dequeue(name, request, timeout_s)
            # Not even HEAD: a dequeue whose body is never sent would lose the message.
            response = _text(405, "yaq queues take GET (dequeue) and POST (enqueue)")
            response.headers.append(("Allow", "GET, POST"))
            return response
        except DirmqError as exc:
            return _refusal(exc)
        except UnicodeDecodeError:
            return _text(400, "the queue path is not valid UTF-8 once percent-decoded")

    def body_check(
        self, method: str, path: str, headers: dict[str, str], length: int, principal: str = ""
    ) -> Response | None:
        """`contract.BodyCheck`: an enqueue over its queue's size limit (a queue it would create:
        the default limit) gets its 413 from its Content-Length, before the body is read (to
        a principal that may enqueue there only: the limit tells that the queue exists)."""
        if method != "POST":
            return None
        try:
            name = unquote(path, errors="strict").strip("/") or ROOT_QUEUE
            if not self.access.allows(principal, WRITE, name):
                return None
            validate_queue_name(name)
            try:
                limit = self.broker.queue(name).config.max_message_bytes
            except QueueNotFound:
                limit = QueueConfig().max_message_bytes
        except (DirmqError, UnicodeDecodeError):
            return None  # the handler answers it
        if length <= limit:
            return None
        # The words of `Queue.validate`'s refusal: the same limit, the same message.
        refusal = MessageTooLarge.for_queue(name, length, limit)
        return _text(413, str(refusal))

    def body_sink(self, head: Request, length: int) -> BodySink | None:
        """An enqueue into a queue that exists (one a POST would create is left to `_enqueue`)
        goes to the message's file as it arrives (store/streamed.py), for a principal that may
        enqueue there; anything else is read into memory and answered as usual."""
        if head.method != "POST" or head.query:
            return None
        try:
            name = unquote(head.path, errors="strict").strip("/") or ROOT_QUEUE
            if not self.access.allows(head.principal, WRITE, name):
                return None
            queue = self.broker.queue(name)
            if not streamable(queue):
                return None
            return StreamedFile.create(queue, length, wire.stored_headers(head.raw_headers))
        except (DirmqError, UnicodeDecodeError):
            return None

    def _health(self) -> Response:
        closing = self.broker.closing
        body = b'{"status": "draining"}\n' if closing else b'{"status": "ok"}\n'
        return Response(503 if closing else 200, body, [("Content-Type", "application/json")])

    async def _created(self, name: str) -> Queue:
        return await self.broker.call(self.broker.store.create_queue, name)

    async def _existing(self, name: str, timeout_s: float | None) -> Queue | None:
        """The queue `name` once it exists, waiting up to `timeout_s` (None: for ever) for a
        POST to create it: a read never creates a queue. None when it still does not exist (or
        the server is draining). A name that can never be a queue is refused at once."""
        validate_queue_name(name)
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while True:
            try:
                return self.broker.queue(name)
            except QueueNotFound:
                pass
            if self.broker.closing:
                return None
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return None
            # Creation is rare and a waiting reader costs one stat per period: polled.
            await asyncio.sleep(CREATION_POLL_S if left is None else min(CREATION_POLL_S, left))

    async def _enqueue(self, name: str, request: Request, timeout_s: float | None) -> Response:
        if request.upload is not None:  # its body went to its file as it arrived
            sink = await request.upload.written()
            if not isinstance(sink, StreamedFile):  # only `body_sink` makes yaq's sinks
                raise TypeError(f"an enqueue's body went to a {type(sink).__name__}")
            message_id = await self.broker.call(sink.publish)
            self.broker.moved(PUBLISHED, sink.queue.name, 1)
            return Response(200, b"", [("X-Message-Id", message_id)])
        queue = await self._created(name)
        message = OutgoingMessage(request.body, wire.stored_headers(request.raw_headers))
        queue.validate(message)
        (message_id,) = await self.broker.publish(queue, [message], timeout_s=timeout_s)
        return Response(200, b"", [("X-Message-Id", message_id)])

    async def _dequeue(
        self, name: str, request: Request, timeout_s: float | None
    ) -> Response | StreamResponse:
        quantity_text = request.query.get("quantity", "1")
        if quantity_text == "unlimited":
            quantity: int | None = None
        elif quantity_text.isascii() and quantity_text.isdigit() and int(quantity_text) >= 1:
            quantity = int(quantity_text)
        else:
            raise InvalidArgument(
                f"quantity={quantity_text!r} must be a positive integer or 'unlimited'"
            )
        validate_queue_name(name)  # before a 202 is promised
        started = asyncio.get_running_loop().time()
        if quantity == 1:
            queue = await self._existing(name, timeout_s)
            if timeout_s is not None:  # the wait for the queue counts against the timeout
                timeout_s = max(0.0, timeout_s - (asyncio.get_running_loop().time() - started))
            messages = (
                []
                if queue is None
                else await self.broker.receive(
                    queue,
                    1,
                    LEASE_S,
                    timeout_s,
                    consumer=request.principal or None,
                    by_file=True,  # a large body is sent from its file
                )
            )
            if queue is None or not messages:
                return Response(504)  # as in yaq's transcript: no body
            message = messages[0]
            body = message.body
            return Response(
                200,
                b"" if isinstance(body, FileBody) else body,
                _part_headers(message),
                after=self._acker(queue, message),
                file=body if isinstance(body, FileBody) else None,
            )
        boundary = framing.new_boundary()
        response = StreamResponse(
            202,
            body=_never(),
            headers=[("Content-Type", f'multipart/mixed; boundary="{boundary}"')],
            trailer_names=(TRAILER,),
        )
        response.body = self._stream(
            name, boundary, quantity, timeout_s, response, request.principal or None
        )
        return response

    def _acker(self, queue: Queue, message: Message):  # type: ignore[no-untyped-def]
        async def ack() -> None:
            try:
                await self.broker.ack(queue, message.receipt or "")  # the broker counts it
            except StaleReceipt:
                pass  # the lease ran out while the client was reading: it will be redelivered

        return ack

    async def _stream(
        self,
        name: str,
        boundary: str,
        quantity: int | None,
        timeout_s: float | None,
        response: StreamResponse,
        consumer: str | None,
    ) -> AsyncIterator[bytes]:
        sent = 0
        unacked: Message | None = None
        queue: Queue | None = None
        try:
            while quantity is None or sent < quantity:
                try:
                    if queue is None:  # the first message's wait includes the queue's creation
                        queue = await self._existing(name, timeout_s)
                    got = (
                        []
                        if queue is None
                        else await self.broker.receive(
                            queue, 1, LEASE_S, timeout_s, consumer=consumer
                        )
                    )
                except DirmqError as exc:
                    response.trailers.append((TRAILER, str(status_of(exc))))
                    break
                except Exception:  # an unexpected failure still ends the body properly
                    response.trailers.append((TRAILER, "500"))
                    break
                if not got or queue is None:
                    response.trailers.append((TRAILER, "504"))
                    break
                unacked = got[0]
                yield framing.multipart_part(boundary, _part_headers(unacked), unacked.body)
                # The part is written (the server asks for the next one only then): ack it now,
                # not after the next message, which may take long to come.
                await asyncio.shield(self._acker(queue, unacked)())
                unacked = None
                sent += 1
            yield framing.multipart_end(boundary)
        finally:
            if unacked is not None and queue is not None:  # the client went away first
                await asyncio.shield(self.broker.call(queue.nack, unacked.receipt or ""))


def _refusal(exc: DirmqError) -> Response:
    status = status_of(exc)
    response = _text(status if status < 500 or status == 504 else 500, str(exc))
    if status == 401:
        response.headers.extend(CHALLENGES)
    return response


def _part_headers(message: Message) -> list[tuple[str, str]]:
    headers = [(name, value) for name, value in message.headers.items()]
    if message.content_type is None:
        headers.append(("Content-Type", wire.DEFAULT_CONTENT_TYPE))
    headers.append(("X-Message-Id", message.id))
    if message.dead is not None:  # a dead letter says why, as on the native API
        headers.extend(wire.dead_headers(message.dead))
    return headers


async def _never() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover
