"""The streaming receive's client side without I/O (docs/http-api.md, "Streaming receive"): the
WebSocket (wsproto), the messages received and not handed out yet, the tags of those not yet
settled, the buffered acks. Each method returns the bytes to send; the consumers of stream.py
(the blocking `Consumer`, `AsyncConsumer`) move them over their sockets, and read `accepted`,
`ready`, `ended`, `tags` and `failures` to know where the stream is.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from typing import Protocol
from urllib.parse import quote

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
from dirmq.client.frames import FrameSplitter
from dirmq.store import Message
from dirmq.wire import stream as wire

log = logging.getLogger("dirmq.client")

ACK_DELAY_S = 0.05  # a buffered ack waits at most this long for company
MAX_HANDSHAKE_BYTES = 64 * 1024  # the head of the server's answer to the handshake
# Close codes the server ends a stream with that are not errors (a normal close, a shutdown).
ENDS = frozenset({1000, 1001})


class Endpoint(Protocol):
    """What the core needs of where it connects (`stream.StreamTarget`, which also connects)."""

    url: str
    host: str
    port: int
    base_path: str
    headers: dict[str, str]


class StreamCore:
    """What a consumer does, without I/O: the WebSocket (wsproto), the messages received and
    not yet handed out, the tags of those not yet settled, the buffered acks. Its methods
    return the bytes to send; the sync and async consumers move them."""

    def __init__(self, target: Endpoint, queue: str, prefetch: int, visibility_s: float | None):
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
            self.ended = End(event.reason or "")
        else:
            self.ended = close_error(event.code, event.reason or "")
        return answer

    def next_ready(self) -> Message | None:
        """A message received and not handed out yet; None if there is none (raises why the
        stream ended, unless it ended normally, once every received one is handed out)."""
        if self.ready:
            return self.ready.popleft()
        if self.ended is not None and not isinstance(self.ended, End):
            raise self.ended
        return None

    def ack(self, message: Message | str) -> bool:
        """Buffer the ack; whether the buffer is due to be sent."""
        receipt = receipt_of(message)
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
        receipt = receipt_of(message)
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
        receipt = receipt_of(message)
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


class End(Exception):
    """The server ended the stream normally (it stops, or we closed)."""


def close_error(code: int, reason: str) -> errors.DirmqError:
    """The library's error for a stream the server closed with `code` (4000 + an HTTP status
    carries the error's name in its reason: `QueueNotFound: ...`)."""
    name, _, message = reason.partition(": ")
    if 4000 <= code < 5000 and message:
        error_type = p.error_type(name)
        if issubclass(error_type, errors.StorageError):
            return error_type(0, message)
        return error_type(message)
    return errors.DirmqError(f"the server closed the stream ({code}): {reason}")


def receipt_of(message: Message | str) -> str:
    receipt = message if isinstance(message, str) else message.receipt
    if not receipt:
        raise errors.InvalidArgument("not a leased message: it has no receipt")
    return receipt
