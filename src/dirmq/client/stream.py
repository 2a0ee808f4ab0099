"""The streaming receive for the synchronous client: one WebSocket (wsproto over a plain or TLS
socket) on `GET /{queue}/messages`, the server pushing messages while the credit allows, acks
flowing back (docs/http-api.md, "Streaming receive").

    with store.queue("jobs").consume(prefetch=100) as consumer:
        for message in consumer:
            handle(message)
            consumer.ack(message)

A `Consumer` belongs to one thread. Acks are buffered and sent together: before the consumer
blocks on its socket for more messages, once half the prefetch is buffered, at the first call
after `ACK_DELAY_S`, by `flush()`, and on `close()`. Closing (or the process dying) gives every
message it still holds back to the queue at once.

Why it is long: the protocol's client side is one sans-I/O core (`_Core`: handshake, frames,
tags, buffered acks) with two I/O shells over it, the blocking `Consumer` and `AsyncConsumer`;
apart, the shells would import the core's private state back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from urllib.parse import quote, urlsplit

import httpx
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)

from dirmq import errors
from dirmq.client import protocol as p
from dirmq.client import tls
from dirmq.client.frames import FrameSplitter
from dirmq.store import Message
from dirmq.wire import stream as wire

log = logging.getLogger("dirmq.client")

ACK_DELAY_S = 0.05
READ_BYTES = 256 * 1024
CLOSE_WAIT_S = 2.0  # for the server's answer to our close frame
MAX_HANDSHAKE_BYTES = 64 * 1024  # the head of the server's answer to the handshake
# Close codes the server ends a stream with that are not errors (a normal close, a shutdown).
ENDS = frozenset({1000, 1001})


class StreamTarget:
    """Where a consumer connects, and how: what a `RemoteStore` knows."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        verify: ssl.SSLContext | bool,
        timeout_s: float,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.InvalidArgument(f"not an http(s) URL: {url!r}")
        self.url = url
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.base_path = parts.path.rstrip("/")
        self.headers = headers
        self.verify = verify
        self.timeout_s = timeout_s

    def ssl_context(self) -> ssl.SSLContext:
        if isinstance(self.verify, ssl.SSLContext):
            return self.verify
        return httpx.create_ssl_context()  # httpx's default trust, as the HTTP client's

    def connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise errors.StorageIOError(0, f"cannot reach dirmq at {self.url}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            return sock
        try:
            return self.ssl_context().wrap_socket(sock, server_hostname=self.host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise errors.StorageIOError(
                0, f"cannot reach dirmq at {self.url}: {exc}{tls.hint(str(exc))}"
            ) from exc


class _Core:
    """What a consumer does, without I/O: the WebSocket (wsproto), the messages received and
    not yet handed out, the tags of those not yet settled, the buffered acks. Its methods
    return the bytes to send; the sync and async consumers move them."""

    def __init__(self, target: StreamTarget, queue: str, prefetch: int, visibility_s: float | None):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise errors.InvalidArgument(f"prefetch must be a positive integer, got {prefetch!r}")
        self.target = target
        self.prefetch = prefetch
        # Settlements the server reported as failed: (receipt, error), e.g. StaleReceipt when
        # a lease had expired before its ack arrived (the message may come again).
        self.failures: list[tuple[str, errors.DirmqError]] = []
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.ready: deque[Message] = deque()
        self.tags: dict[str, int] = {}  # receipt -> delivery tag, of what we hold
        self.acks: list[int] = []
        self.first_ack_at = 0.0
        self.ended: BaseException | None = None  # why no more messages come
        self.accepted = False
        self._parts: list[bytes] = []  # a message arriving in several frames
        self._head = bytearray()  # the handshake's answer, until its head is whole
        self.frames = FrameSplitter(self.ws)
        self._rejected: RejectConnection | None = None
        self._rejected_body = b""
        query = {"prefetch": str(prefetch)}
        if visibility_s is not None:
            query["visibility"] = p.seconds(visibility_s)
        self.path = (
            target.base_path
            + p.queue_path(queue)
            + "/messages?"
            + "&".join(f"{k}={v}" for k, v in query.items())
        )

    def handshake(self) -> bytes:
        target = self.target
        host = target.host if ":" not in target.host else f"[{target.host}]"
        headers = [(name.encode(), value.encode()) for name, value in target.headers.items()]
        return self.ws.send(
            Request(
                host=f"{host}:{target.port}",
                target=quote(self.path, safe="/?=&%"),
                extra_headers=headers,
            )
        )

    def received(self, data: bytes) -> bytes:
        """Take what the socket brought (b"": it closed); return what to answer (pongs, the
        close frame's answer). Raises the server's refusal of the handshake."""
        if not data:
            if not self.accepted:
                raise errors.StorageIOError(0, f"dirmq at {self.target.url} closed the connection")
            self.ended = self.ended or errors.StorageIOError(
                0, f"dirmq at {self.target.url} closed the stream without a close frame"
            )
            return b""
        answer = b""
        if not self.accepted:
            answer, data = self._handshake_answer(data)
            if not data:
                return answer
        decode = wire.decode_delivery
        tags, ready = self.tags, self.ready
        for payload in self.frames.feed(data):
            if payload is None:
                answer += self._events()
                continue
            tag, message = decode(payload)
            tags[message.receipt or ""] = tag
            ready.append(message)
        return answer

    def _handshake_answer(self, data: bytes) -> tuple[bytes, bytes]:
        """Before the handshake is answered: wsproto takes the answer's head (and, if the
        stream is refused, everything after it). (What to answer, the bytes after an accepting
        head: frames, for the splitter.)"""
        if self.frames.raw:  # refused: the rest is the refusal's body
            self.ws.receive_data(data)
            return self._events(), b""
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > MAX_HANDSHAKE_BYTES:
                raise errors.DirmqError(
                    f"dirmq at {self.target.url} answered the stream's handshake with over "
                    f"{MAX_HANDSHAKE_BYTES} bytes of header"
                )
            return b"", b""
        head, rest = bytes(self._head[: end + 4]), bytes(self._head[end + 4 :])
        self._head.clear()
        self.ws.receive_data(head)
        answer = self._events()
        if self.accepted:
            return answer, rest
        self.frames.raw = True
        if rest:
            self.ws.receive_data(rest)
            answer += self._events()
        return answer, b""

    def _events(self) -> bytes:
        """Take wsproto's events; return what to answer."""
        answer = b""
        for event in self.ws.events():
            if isinstance(event, BytesMessage):  # a fragmented delivery, reassembled here
                payload = event.data
                if not event.message_finished:
                    self._parts.append(bytes(payload))
                    continue
                if self._parts:
                    self._parts.append(bytes(payload))
                    payload = b"".join(self._parts)
                    self._parts = []
                tag, message = wire.decode_delivery(bytes(payload))
                self.tags[message.receipt or ""] = tag
                self.ready.append(message)
            elif isinstance(event, TextMessage):
                if event.message_finished:  # (the server's reports are small: one frame)
                    self._report(event.data)
            elif isinstance(event, Ping):
                answer += self.ws.send(event.response())
            elif isinstance(event, CloseConnection):
                answer += self._server_closed(event)
            elif isinstance(event, AcceptConnection):
                self.accepted = True
            elif isinstance(event, RejectConnection):
                self._rejected = event
                if not event.has_body:
                    self._refused()
            elif isinstance(event, RejectData) and self._rejected is not None:
                self._rejected_body += event.data
                if event.body_finished:
                    self._refused()
        return answer

    def _refused(self) -> None:
        event = self._rejected
        assert event is not None
        headers = [
            (k.decode("latin-1").lower(), v.decode("utf-8", "replace")) for k, v in event.headers
        ]
        p.raise_for(p.Answer(event.status_code, headers, self._rejected_body))
        raise errors.DirmqError(f"dirmq refused the stream: HTTP {event.status_code}")

    def _report(self, text: str) -> None:
        for failure in json.loads(text).get("failed", []):
            error_type = p.error_type(str(failure.get("error", "")))
            error = error_type(str(failure.get("message", "")))
            receipt = str(failure.get("receipt", ""))
            self.failures.append((receipt, error))
            log.warning("the ack of %s did not take: %s", receipt, error)

    def _server_closed(self, event: CloseConnection) -> bytes:
        answer = b""
        if self.ws.state is ConnectionState.REMOTE_CLOSING:
            answer = self.ws.send(event.response())
        if event.code in ENDS:
            self.ended = _End(event.reason or "")
        else:
            self.ended = _close_error(event.code, event.reason or "")
        return answer

    def next_ready(self) -> Message | None:
        """A message received and not handed out yet; None if there is none (raises why the
        stream ended, unless it ended normally, once every received one is handed out)."""
        if self.ready:
            return self.ready.popleft()
        if self.ended is not None and not isinstance(self.ended, _End):
            raise self.ended
        return None

    def ack(self, message: Message | str) -> bool:
        """Buffer the ack; whether the buffer is due to be sent."""
        receipt = _receipt(message)
        tag = self.tags.pop(receipt, None)
        if tag is None:
            raise errors.InvalidArgument(f"receipt {receipt[:80]!r} is not held by this consumer")
        if not self.acks:
            self.first_ack_at = time.monotonic()
        self.acks.append(tag)
        return len(self.acks) * 2 >= self.prefetch

    def acks_due(self) -> bool:
        return bool(self.acks) and time.monotonic() - self.first_ack_at >= ACK_DELAY_S

    def flush(self) -> bytes:
        if not self.acks or self.ended is not None:
            return b""
        acks, self.acks = self.acks, []
        return self._text(wire.encode_settle(ack=acks))

    def ack_through(self, message: Message | str) -> bytes:
        receipt = _receipt(message)
        through = self.tags.get(receipt)
        if through is None:
            raise errors.InvalidArgument(f"receipt {receipt[:80]!r} is not held by this consumer")
        for held, tag in list(self.tags.items()):
            if tag <= through:
                del self.tags[held]
        acks = [tag for tag in self.acks if tag > through]
        self.acks = []
        return self._text(wire.encode_settle(ack=acks, ack_through=through))

    def nack(self, message: Message | str, delay_s: float) -> bytes:
        receipt = _receipt(message)
        tag = self.tags.pop(receipt, None)
        if tag is None:
            raise errors.InvalidArgument(f"receipt {receipt[:80]!r} is not held by this consumer")
        delay = float(p.seconds(delay_s)) if delay_s else None
        acks, self.acks = self.acks, []
        return self._text(wire.encode_settle(ack=acks, nack=[tag], delay=delay))

    def close(self) -> bytes:
        """The buffered acks and our close frame (nothing if the stream has ended)."""
        if self.ended is not None or self.ws.state is not ConnectionState.OPEN:
            return b""
        return self.flush() + self.ws.send(CloseConnection(code=1000))

    def _text(self, text: str) -> bytes:
        if self.ws.state is not ConnectionState.OPEN:
            return b""
        return self.ws.send(TextMessage(data=text))


class Consumer:
    """A streaming consumer of one queue: an iterator of leased messages (blocking while the
    queue is empty), `ack`/`ack_through`/`nack` to settle them, a context manager."""

    def __init__(
        self,
        target: StreamTarget,
        queue: str,
        *,
        prefetch: int = 100,
        visibility_s: float | None = None,
    ) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self._closed = True  # until connected
        self._core = core = _Core(target, queue, prefetch, visibility_s)
        self.failures = core.failures
        self._sock = target.connect()
        try:
            self._write(core.handshake())
            while not core.accepted:
                self._receive()
        except BaseException:
            self._sock.close()
            raise
        self._closed = False
        self._sock.settimeout(None)

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.get()
        if message is None:
            raise StopIteration
        return message

    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout_s` (None: until one comes); None if none
        came in time or the stream ended (`closed` tells which)."""
        core = self._core
        if core.acks_due():
            self.flush()
        message = core.next_ready()
        if message is not None or core.ended is not None:
            return message
        self.flush()  # before blocking: the acks give the server the credit to send more
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not core.ready and core.ended is None:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._sock.settimeout(left)
            try:
                self._receive()
            except TimeoutError:
                return None
            finally:
                if deadline is not None:
                    self._sock.settimeout(None)
        return core.next_ready()

    @property
    def closed(self) -> bool:
        """Whether the stream has ended (closed here, by the server, or lost)."""
        return self._closed or self._core.ended is not None

    # -- settling -----------------------------------------------------------------------------
    def holds(self, receipt: str) -> bool:
        """Whether `receipt` is of a message this consumer received and has not settled."""
        return receipt in self._core.tags

    def ack(self, message: Message | str) -> None:
        """Acknowledge a message (or its receipt): buffered, sent with the next batch."""
        if self._core.ack(message):
            self.flush()

    def ack_through(self, message: Message | str) -> None:
        """Acknowledge `message` and every message received before it (one small frame, sent
        now: cheaper than acking each)."""
        self._write(self._core.ack_through(message))

    def nack(self, message: Message | str, delay_s: float = 0.0) -> None:
        """Give a message back (ready again at once, or after `delay_s`): sent now."""
        self._write(self._core.nack(message, delay_s))

    def flush(self) -> None:
        """Send the buffered acks now."""
        self._write(self._core.flush())

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Send the buffered acks, then close: what is still held goes back to the queue."""
        if self._closed:
            return
        try:
            goodbye = self._core.close()
            if goodbye:
                self._write(goodbye)
                self._sock.settimeout(CLOSE_WAIT_S)
                while self._core.ended is None:  # the server's close frame: acks all taken
                    self._receive()
        except (OSError, errors.DirmqError):
            pass
        finally:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):  # (an object whose __init__ failed has none)
            self._sock.close()

    # -- inside -------------------------------------------------------------------------------
    def _receive(self) -> None:
        """One read from the socket, its events taken."""
        try:
            data = self._sock.recv(READ_BYTES)
        except TimeoutError:
            raise
        except OSError as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream from {url} broke: {exc}") from exc
        self._write(self._core.received(data))

    def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._sock.sendall(data)
        except OSError as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream to {url} broke: {exc}") from exc


class AsyncConsumer:
    """`Consumer` for asyncio: `async for`, `await consumer.get()`, `async with`; `ack` is
    buffered as there (a plain call), the rest awaits. Made by `AsyncRemoteQueue.consume`."""

    def __init__(self, core: _Core, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self._core = core
        self._reader = reader
        self._writer = writer
        self.failures = core.failures
        self._closed = False

    @classmethod
    async def connect(
        cls,
        target: StreamTarget,
        queue: str,
        *,
        prefetch: int = 100,
        visibility_s: float | None = None,
    ) -> AsyncConsumer:
        core = _Core(target, queue, prefetch, visibility_s)
        context = target.ssl_context() if target.tls else None
        try:
            # `asyncio.timeout`, not `wait_for`, here and below: Python 3.11's `wait_for`
            # swallows a cancellation that lands as the awaited thing completes.
            async with asyncio.timeout(target.timeout_s):
                reader, writer = await asyncio.open_connection(
                    target.host, target.port, ssl=context, limit=READ_BYTES * 4
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise errors.StorageIOError(
                0, f"cannot reach dirmq at {target.url}: {exc}{tls.hint(str(exc))}"
            ) from exc
        consumer = cls(core, reader, writer)
        try:
            await consumer._write(core.handshake())
            while not core.accepted:
                async with asyncio.timeout(target.timeout_s):
                    await consumer._receive()
        except BaseException:
            writer.close()
            raise
        return consumer

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        message = await self.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def get(self, timeout_s: float | None = None) -> Message | None:
        """As `Consumer.get`."""
        core = self._core
        if core.acks_due():
            await self.flush()
        message = core.next_ready()
        if message is not None or core.ended is not None:
            return message
        await self.flush()
        try:
            async with asyncio.timeout(timeout_s):
                while not core.ready and core.ended is None:
                    await self._receive()
        except TimeoutError:
            return None
        return core.next_ready()

    @property
    def closed(self) -> bool:
        return self._closed or self._core.ended is not None

    def holds(self, receipt: str) -> bool:
        return receipt in self._core.tags

    async def ack(self, message: Message | str) -> None:
        if self._core.ack(message):
            await self.flush()

    async def ack_through(self, message: Message | str) -> None:
        await self._write(self._core.ack_through(message))

    async def nack(self, message: Message | str, delay_s: float = 0.0) -> None:
        await self._write(self._core.nack(message, delay_s))

    async def flush(self) -> None:
        await self._write(self._core.flush())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            goodbye = self._core.close()
            if goodbye:
                await self._write(goodbye)
                async with asyncio.timeout(CLOSE_WAIT_S):
                    while self._core.ended is None:
                        await self._receive()
        except (OSError, TimeoutError, errors.DirmqError):
            pass
        finally:
            self._writer.close()
            with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self._writer.wait_closed()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def _receive(self) -> None:
        try:
            data = await self._reader.read(READ_BYTES)
        except (OSError, ssl.SSLError) as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream from {url} broke: {exc}") from exc
        await self._write(self._core.received(data))

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (OSError, ssl.SSLError) as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream to {url} broke: {exc}") from exc


class _End(Exception):
    """The server ended the stream normally (it stops, or we closed)."""


def _close_error(code: int, reason: str) -> errors.DirmqError:
    """The library's error for a stream the server closed with `code` (4000 + an HTTP status
    carries the error's name in its reason: `QueueNotFound: ...`)."""
    name, _, message = reason.partition(": ")
    if 4000 <= code < 5000 and message:
        error_type = p.error_type(name)
        if issubclass(error_type, errors.StorageError):
            return error_type(0, message)
        return error_type(message)
    return errors.DirmqError(f"the server closed the stream ({code}): {reason}")


def _receipt(message: Message | str) -> str:
    receipt = message if isinstance(message, str) else message.receipt
    if not receipt:
        raise errors.InvalidArgument("not a leased message: it has no receipt")
    return receipt
