"""WebSocket connections (RFC 6455) on the HTTP server, with wsproto doing the frame parsing.

`http.py` answers the upgrade request like any other; an application that accepts it answers
`SwitchProtocols(handshake_headers(request), WebSocket(endpoint))`, and from then on the
connection's bytes come here. This module knows no dialect: an `Endpoint` (the native API's
stream consumer, `dialects/native/stream.py`) gets whole text messages and sends binary ones.

What is enforced here: the handshake (version 13, a well-formed key), whole messages from the
client of at most `max_message_bytes`, frames masked by the client (wsproto), a ping after
`ping_interval_s` of silence and a close after `idle_timeout_s` of it, and a bounded close: once
a close frame is sent, the peer has `CLOSE_TIMEOUT_S` to answer before the connection is cut.
Frames the server sends are built here (an unmasked frame is a 2-10 byte header and the payload:
cheaper than a trip through wsproto for every message pushed).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import struct
from dataclasses import dataclass
from typing import Protocol

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from dirmq.errors import InvalidArgument
from dirmq.server.contract import Request

log = logging.getLogger("dirmq.server")

GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3
CLOSE_TIMEOUT_S = 2.0

# Close codes (RFC 6455 §7.4.1), and ours in the 4000-4999 range that is the application's.
NORMAL = 1000
GOING_AWAY = 1001
PROTOCOL_ERROR = 1002
UNSUPPORTED_DATA = 1003
INVALID_DATA = 1007
POLICY_VIOLATION = 1008
TOO_BIG = 1009
INTERNAL_ERROR = 1011
IDLE = 4408  # as HTTP's 408: nothing heard from the client for too long


@dataclass(frozen=True, slots=True)
class WebSocketLimits:
    max_message_bytes: int = 1024 * 1024  # a whole message from the client (its acks)
    ping_interval_s: float = 30.0  # silence from the client this long: ping it
    # Silence this long (no pong either): close. Long, since a client answers pings only when it
    # reads (a blocking consumer busy with a message does not); a dead process is seen at once
    # (its socket closes), and what a vanished host held comes back when its leases end.
    idle_timeout_s: float = 600.0


def is_websocket(request: Request) -> bool:
    """Whether `request` asks to become a WebSocket (`Upgrade: websocket`)."""
    upgrade = request.headers.get("upgrade")
    return upgrade is not None and "websocket" in upgrade.lower()


def handshake_headers(request: Request) -> list[tuple[str, str]]:
    """The 101's headers for a valid WebSocket handshake; InvalidArgument says what is wrong."""
    if request.method != "GET":
        raise InvalidArgument("a WebSocket handshake is a GET")
    connection = request.headers.get("connection", "").lower()
    if "upgrade" not in [token.strip() for token in connection.split(",")]:
        raise InvalidArgument("a WebSocket handshake needs 'Connection: Upgrade'")
    version = request.headers.get("sec-websocket-version", "")
    if version.strip() != "13":
        raise InvalidArgument(
            f"Sec-WebSocket-Version {version[:20]!r} is not supported: only 13 (RFC 6455)"
        )
    key = request.headers.get("sec-websocket-key", "").strip()
    try:
        valid = len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        valid = False
    if not valid:
        raise InvalidArgument("Sec-WebSocket-Key must be 16 bytes in base64 (RFC 6455 §4.1)")
    return [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Accept", accept_key(key)),
    ]


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def frame_header(opcode: int, length: int) -> bytes:
    """The header of one final, unmasked frame (server to client) of `length` payload bytes."""
    if length < 126:
        return bytes((0x80 | opcode, length))
    if length < 65536:
        return struct.pack("!BBH", 0x80 | opcode, 126, length)
    return struct.pack("!BBQ", 0x80 | opcode, 127, length)


BINARY = 0x2
TEXT = 0x1


class Endpoint(Protocol):
    """The application side of one WebSocket."""

    def opened(self, socket: WebSocket) -> None:
        """The connection is a WebSocket now: `socket` sends."""

    def text(self, text: str) -> None:
        """One whole text message from the client."""

    def binary(self, data: bytes) -> None:
        """One whole binary message from the client."""

    def closed(self, code: int, reason: str) -> None:
        """Once: the WebSocket is closing or gone (whichever side began); nothing more can be
        sent."""


class WebSocket:
    """The `contract.Upgraded` for one WebSocket connection."""

    __slots__ = (
        "_closed_told",
        "_endpoint",
        "_limits",
        "_loop",
        "_parts",
        "_parts_bytes",
        "_timer",
        "_transport",
        "_ws",
        "can_write",
        "last_heard",
        "sent_bytes",
    )

    def __init__(self, endpoint: Endpoint, limits: WebSocketLimits | None = None) -> None:
        self._endpoint = endpoint
        self._limits = limits or WebSocketLimits()
        self._ws = Connection(ConnectionType.SERVER)
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._parts: list[str | bytes | bytearray] = []  # a message arriving in several frames
        self._parts_bytes = 0
        self._closed_told = False
        self.can_write = asyncio.Event()  # set while the transport takes more
        self.can_write.set()
        self.last_heard = self._loop.time()
        self.sent_bytes = 0

    # -- contract.Upgraded ----------------------------------------------------------------------
    def start(self, transport: asyncio.Transport, received: bytes) -> None:
        self._transport = transport
        self._timer = self._loop.call_later(self._limits.ping_interval_s, self._tick)
        self._endpoint.opened(self)
        if received:
            self.data_received(received)

    def data_received(self, data: bytes) -> None:
        self.last_heard = self._loop.time()
        ws = self._ws
        ws.receive_data(data)
        for event in ws.events():
            if isinstance(event, TextMessage | BytesMessage):
                if not self._message(event):
                    return
            elif isinstance(event, CloseConnection):
                self._peer_closed(event)
                return
            elif isinstance(event, Ping):
                self._write(ws.send(event.response()))
            # Pong: hearing from the peer is all it is for (`last_heard`).

    def writable(self, can_write: bool) -> None:
        if can_write:
            self.can_write.set()
        else:
            self.can_write.clear()

    def shutdown(self) -> None:
        self.close(GOING_AWAY, "the server is shutting down")

    def connection_lost(self) -> None:
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
        self.can_write.set()  # nobody must wait for a transport that is gone
        self._tell_closed(1006, "the connection was lost")  # 1006: closed without a close frame

    # -- for the endpoint -----------------------------------------------------------------------
    @property
    def open(self) -> bool:
        return self._transport is not None and self._ws.state is ConnectionState.OPEN

    def send_binary(self, payloads: list[bytes]) -> None:
        """Send each payload as one binary message, in one write."""
        if not self.open:
            return
        parts: list[bytes] = []
        for payload in payloads:
            parts.append(frame_header(BINARY, len(payload)))
            parts.append(payload)
        self._write(b"".join(parts))

    def send_text(self, text: str) -> None:
        if self.open:
            data = text.encode()
            self._write(frame_header(TEXT, len(data)) + data)

    def close(self, code: int = NORMAL, reason: str = "") -> None:
        """Send a close frame (unless one was sent), tell the endpoint, and cut the connection
        if the peer does not answer within CLOSE_TIMEOUT_S."""
        ws = self._ws
        if self._transport is None:
            return
        if ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            self._write(ws.send(CloseConnection(code, _short(reason))))
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_later(CLOSE_TIMEOUT_S, self._cut)
        self._tell_closed(code, reason)
        if ws.state is ConnectionState.CLOSED and self._transport is not None:
            self._transport.close()

    # -- inside ---------------------------------------------------------------------------------
    def _message(self, event: TextMessage | BytesMessage) -> bool:
        """Gather a message's frames; hand a whole one over. False once the connection closes."""
        data = event.data
        self._parts_bytes += len(data)
        if self._parts_bytes > self._limits.max_message_bytes:
            limit = self._limits.max_message_bytes
            self.close(TOO_BIG, f"a message over {limit} bytes")
            return False
        if not event.message_finished:
            self._parts.append(data)
            return True
        if self._parts:
            self._parts.append(data)
            if isinstance(event, TextMessage):
                data = "".join(part for part in self._parts if isinstance(part, str))
            else:
                data = b"".join(part for part in self._parts if not isinstance(part, str))
            self._parts = []
        self._parts_bytes = 0
        try:
            if isinstance(data, str):
                self._endpoint.text(data)
            else:
                self._endpoint.binary(bytes(data))
        except Exception:
            log.exception("a WebSocket endpoint failed")
            self.close(INTERNAL_ERROR, "internal server error")
        return self.open

    def _peer_closed(self, event: CloseConnection) -> None:
        ws = self._ws
        if ws.state is ConnectionState.REMOTE_CLOSING:
            self._write(ws.send(event.response()))  # the peer began: answer, then it is over
        elif ws.state is ConnectionState.OPEN:
            # Not a close frame from the peer: wsproto could not parse what it sent.
            log.info("WebSocket protocol error: %s", event.reason)
            self._write(ws.send(CloseConnection(event.code, _short(event.reason or ""))))
        self._tell_closed(event.code, event.reason or "")
        if self._transport is not None:
            self._transport.close()

    def _tell_closed(self, code: int, reason: str) -> None:
        if not self._closed_told:
            self._closed_told = True
            try:
                self._endpoint.closed(code, reason)
            except Exception:
                log.exception("a WebSocket endpoint failed to close")

    def _write(self, data: bytes) -> None:
        if self._transport is not None and data:
            self._transport.write(data)
            self.sent_bytes += len(data)

    def _tick(self) -> None:
        """Every ping interval: ping a silent peer; close one silent for too long."""
        silent = self._loop.time() - self.last_heard
        if silent >= self._limits.idle_timeout_s:
            self.close(IDLE, f"RequestTimeout: nothing heard from the client for {silent:.0f} s")
            return
        if silent >= self._limits.ping_interval_s and self.open:
            self._write(self._ws.send(Ping(b"dirmq")))
        self._timer = self._loop.call_later(self._limits.ping_interval_s, self._tick)

    def _cut(self) -> None:
        if self._transport is not None:
            self._transport.abort()


def _short(reason: str) -> str:
    """A close reason fits in a control frame: at most 123 bytes of UTF-8."""
    data = reason.encode()
    if len(data) <= 123:
        return reason
    return data[:120].decode(errors="ignore") + "..."
