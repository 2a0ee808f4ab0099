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
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Iterator
from types import TracebackType
from urllib.parse import quote, urlsplit

import httpx
from wsproto import ConnectionType, WSConnection
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
from dirmq.store import Message
from dirmq.wire import stream as wire

log = logging.getLogger("dirmq.client")

ACK_DELAY_S = 0.05
READ_BYTES = 256 * 1024
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

    def connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise errors.StorageIOError(0, f"cannot reach dirmq at {self.url}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            return sock
        context = (
            self.verify if isinstance(self.verify, ssl.SSLContext) else httpx.create_ssl_context()
        )
        try:
            return context.wrap_socket(sock, server_hostname=self.host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise errors.StorageIOError(
                0, f"cannot reach dirmq at {self.url}: {exc}{tls.hint(str(exc))}"
            ) from exc


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
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise errors.InvalidArgument(f"prefetch must be a positive integer, got {prefetch!r}")
        self.queue = queue
        self.prefetch = prefetch
        # Settlements the server reported as failed: (receipt, error), e.g. StaleReceipt when
        # a lease had expired before its ack arrived (the message may come again).
        self.failures: list[tuple[str, errors.DirmqError]] = []
        self._target = target
        self._ws = WSConnection(ConnectionType.CLIENT)
        self._ready: deque[Message] = deque()
        self._tags: dict[str, int] = {}  # receipt -> delivery tag, of what we hold
        self._acks: list[int] = []
        self._first_ack_at = 0.0
        self._parts: list[bytes] = []  # a message arriving in several frames
        self._ended: BaseException | None = None  # why no more messages come
        self._closed = True  # until connected
        query = {"prefetch": str(prefetch)}
        if visibility_s is not None:
            query["visibility"] = p.seconds(visibility_s)
        path = p.queue_path(queue) + "/messages?" + "&".join(f"{k}={v}" for k, v in query.items())
        self._sock = target.connect()
        try:
            self._handshake(target.base_path + path)
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
        if self._acks and time.monotonic() - self._first_ack_at >= ACK_DELAY_S:
            self.flush()
        if self._ready:
            return self._ready.popleft()
        self.flush()  # before blocking: the acks give the server the credit to send more
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._ready:
            if self._ended is not None:
                if isinstance(self._ended, _End):
                    return None
                raise self._ended
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
        return self._ready.popleft()

    @property
    def closed(self) -> bool:
        """Whether the stream has ended (closed here, by the server, or lost)."""
        return self._closed or self._ended is not None

    # -- settling -----------------------------------------------------------------------------
    def holds(self, receipt: str) -> bool:
        """Whether `receipt` is of a message this consumer received and has not settled."""
        return receipt in self._tags

    def ack(self, message: Message | str) -> None:
        """Acknowledge a message (or its receipt): buffered, sent with the next batch."""
        receipt = _receipt(message)
        tag = self._tags.pop(receipt, None)
        if tag is None:
            raise errors.InvalidArgument(f"receipt {receipt[:80]!r} is not held by this consumer")
        if not self._acks:
            self._first_ack_at = time.monotonic()
        self._acks.append(tag)
        if len(self._acks) * 2 >= self.prefetch:
            self.flush()

    def ack_through(self, message: Message | str) -> None:
        """Acknowledge `message` and every message received before it (one small frame, sent
        now: cheaper than acking each)."""
        receipt = _receipt(message)
        through = self._tags.get(receipt)
        if through is None:
            raise errors.InvalidArgument(f"receipt {receipt[:80]!r} is not held by this consumer")
        for held, tag in list(self._tags.items()):
            if tag <= through:
                del self._tags[held]
        self._acks = [tag for tag in self._acks if tag > through]
        self._send(wire.encode_settle(ack=list(self._acks), ack_through=through))
        self._acks = []

    def nack(self, message: Message | str, delay_s: float = 0.0) -> None:
        """Give a message back (ready again at once, or after `delay_s`): sent now."""
        receipt = _receipt(message)
        tag = self._tags.pop(receipt, None)
        if tag is None:
            raise errors.InvalidArgument(f"receipt {receipt[:80]!r} is not held by this consumer")
        delay = float(p.seconds(delay_s)) if delay_s else None
        acks, self._acks = self._acks, []
        self._send(wire.encode_settle(ack=list(acks), nack=[tag], delay=delay))

    def flush(self) -> None:
        """Send the buffered acks now."""
        if self._acks and not self.closed:
            acks, self._acks = self._acks, []
            self._send(wire.encode_settle(ack=list(acks)))

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Send the buffered acks, then close: what is still held goes back to the queue."""
        if self._closed:
            return
        try:
            if self._ended is None:
                self.flush()
                self._write(self._ws.send(CloseConnection(code=1000)))
                self._sock.settimeout(2.0)
                try:  # the server's close frame: every ack before ours was taken
                    while self._ended is None:
                        self._receive()
                except (OSError, errors.DirmqError):
                    pass
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
    def _handshake(self, path: str) -> None:
        target = self._target
        host = target.host if ":" not in target.host else f"[{target.host}]"
        headers = [(name.encode(), value.encode()) for name, value in target.headers.items()]
        request = Request(
            host=f"{host}:{target.port}", target=quote(path, safe="/?=&%"), extra_headers=headers
        )
        self._write(self._ws.send(request))
        rejected: RejectConnection | None = None
        body = b""
        while True:
            data = self._read()
            self._ws.receive_data(data)
            for event in self._ws.events():
                if isinstance(event, AcceptConnection):
                    self._take(self._ws.events())
                    return
                if isinstance(event, RejectConnection):
                    rejected = event
                    if not event.has_body:
                        self._refused(event, body)
                elif isinstance(event, RejectData) and rejected is not None:
                    body += event.data
                    if event.body_finished:
                        self._refused(rejected, body)
            if not data:
                raise errors.StorageIOError(0, f"dirmq at {target.url} closed the connection")

    def _refused(self, event: RejectConnection, body: bytes) -> None:
        headers = [
            (k.decode("latin-1").lower(), v.decode("utf-8", "replace")) for k, v in event.headers
        ]
        p.raise_for(p.Answer(event.status_code, headers, body))
        raise errors.DirmqError(f"dirmq refused the stream: HTTP {event.status_code}")

    def _read(self) -> bytes:
        try:
            return self._sock.recv(READ_BYTES)
        except TimeoutError:
            raise
        except OSError as exc:
            raise errors.StorageIOError(
                0, f"the stream from {self._target.url} broke: {exc}"
            ) from exc

    def _receive(self) -> None:
        """One read from the socket, its events taken."""
        data = self._read()
        if not data:
            self._ended = self._ended or errors.StorageIOError(
                0, f"dirmq at {self._target.url} closed the stream without a close frame"
            )
            return
        self._ws.receive_data(data)
        self._take(self._ws.events())

    def _take(self, events: Iterator[object]) -> None:
        decode = wire.decode_delivery
        for event in events:
            if isinstance(event, BytesMessage):
                data = event.data
                if not event.message_finished:
                    self._parts.append(bytes(data))
                    continue
                if self._parts:
                    self._parts.append(bytes(data))
                    data = b"".join(self._parts)
                    self._parts = []
                tag, message = decode(bytes(data))
                self._tags[message.receipt or ""] = tag
                self._ready.append(message)
            elif isinstance(event, TextMessage):
                if event.message_finished:  # (the server's reports are small: one frame)
                    self._report(event.data)
            elif isinstance(event, Ping):
                self._write(self._ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                self._server_closed(event)

    def _report(self, text: str) -> None:
        for failure in json.loads(text).get("failed", []):
            error_type = p.error_type(str(failure.get("error", "")))
            error = error_type(str(failure.get("message", "")))
            receipt = str(failure.get("receipt", ""))
            self.failures.append((receipt, error))
            log.warning("the ack of %s did not take: %s", receipt, error)

    def _server_closed(self, event: CloseConnection) -> None:
        if self._ws.state.name == "REMOTE_CLOSING":
            self._write(self._ws.send(event.response()))
        if event.code in ENDS:
            self._ended = _End(event.reason or "")
        else:
            self._ended = _close_error(event.code, event.reason or "")

    def _send(self, text: str) -> None:
        self._write(self._ws.send(TextMessage(data=text)))

    def _write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            raise errors.StorageIOError(
                0, f"the stream to {self._target.url} broke: {exc}"
            ) from exc


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
