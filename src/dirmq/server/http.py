"""The HTTP/1.1 server: an `asyncio.Protocol` with httptools (llhttp) doing all the parsing.

It reads and writes every connection (`serve.py` only binds the listening sockets). It enforces
the limits that protect the server from its clients (header and body size, slow or idle clients,
connection count), handles keep-alive, pipelining (answered in order, one at a time),
`Expect: 100-continue`, streaming responses with trailers, back-pressure from slow readers, and
draining on shutdown. What a request means is the business of the listener's dialects
(`dialect.py`); what it hands them and takes back is the contract (`contract.py`). A `GET`
asking for a protocol upgrade is answered like any other; if the application answers it with
`SwitchProtocols`, the connection's bytes go to the `Upgraded` object it names from then on
(`websocket.py`), else the connection closes after the answer. A large body the application
gives a sink for is written there as it arrives (`bodies.py`), and an answer whose body is a
file is sent from it (`filesend.py`): neither is held in memory.

Why it is long: one connection's state machine (parsing, pipelining, back-pressure, limits, timers,
streaming, drain), whose invariants (answers in order, each budget charge given back exactly once)
span all of it.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, cast
from urllib.parse import parse_qsl

import httptools

from dirmq.server import filesend
from dirmq.server.addresses import is_loopback_peer
from dirmq.server.balance import ConnectionBalance
from dirmq.server.bodies import STREAM_BODY_BYTES, Upload, window_for
from dirmq.server.budget import MemoryBudget, default_body_memory_bytes
from dirmq.server.contract import (
    LATER,
    BodyCheck,
    BodySinkFor,
    FastHandler,
    Handler,
    Later,
    Observe,
    Request,
    Response,
    StreamResponse,
    SwitchProtocols,
    Upgraded,
)
from dirmq.wire import framing

log = logging.getLogger("dirmq.server")

# Requests one connection may have waiting behind the one being answered before we stop
# reading from it (one read can bring more: at most what it holds, 256 KiB).
MAX_PIPELINED = 16
# What one read brings is parsed this much at a time, so that parsing stops (keeping the rest)
# as soon as the connection must not be read: 256 KiB of pipelined requests would otherwise
# become thousands of queued requests (megabytes) on every such connection.
FEED_BYTES = 4 * 1024
UPLOAD_FEED_BYTES = 64 * 1024
MAX_SWEEP_S = 0.5  # timeouts fire at most this late (less when a limit is shorter)
# After refusing a request whose body is unread, how long we keep reading (and dropping) what
# the client still sends: closing at once with unread data makes the kernel send a reset, which
# can destroy our answer before the client reads it.
LINGER_S = 2.0
# Bodies from this size on are read into one buffer of their Content-Length, handed over
# without the copy that joining their pieces would make (smaller ones: the pieces are cheaper).
PREALLOCATE_BYTES = 256 * 1024
RETRY_AFTER_S = 1
CERTIFICATE_REQUIRED = (
    "this server requires a client certificate (mutual TLS) signed by a CA it trusts; "
    "none was presented"
)
_NO_BODY = frozenset({204, 304})
PROTECTED_MODE = (
    "dirmq runs in protected mode (no credentials configured): only clients on this host may "
    "connect; start it with --credentials FILE (or --allow-anonymous)"
)
_METHOD_NAMES = {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")}


@dataclass(frozen=True, slots=True)
class Limits:
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    header_timeout_s: float = 10.0  # the whole request head must arrive within this
    body_timeout_s: float = 60.0  # and its body within this after the head
    idle_timeout_s: float = 75.0  # keep-alive connections with no request are closed
    max_connections: int = 20_000
    # The sum of request bodies (and response bodies stuck in write buffers) held in memory.
    max_body_memory_bytes: int = field(default_factory=default_body_memory_bytes)


def _over_the_limit(limit_bytes: int) -> str:
    """What a 413 for the server's own limit says: the limit, and who may raise it."""
    return (
        f"over the server's limit of {limit_bytes} bytes (its operator raises it with "
        "`dirmq serve --max-body-bytes SIZE`)"
    )


class _Reject(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        headers: tuple[tuple[str, str], ...] = (),
        response: Response | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers
        self.response = response  # the answer, when the application wrote it


def error_body(status: int, message: str) -> bytes:
    return json.dumps({"error": framing.reason(status), "message": message}).encode() + b"\n"


class _Clock:
    """The Date header, formatted at most once a second, and each status line with the Date and
    Server headers as bytes, built at most once a second per status."""

    def __init__(self) -> None:
        self._second = 0
        self._text = ""
        self._prefixes: dict[int, bytes] = {}

    def date(self) -> str:
        now = int(time.time())
        if now != self._second:
            self._second, self._text = now, formatdate(now, usegmt=True)
            self._prefixes = {}
        return self._text

    def prefix(self, status: int) -> bytes:
        """`HTTP/1.1 <status> <reason>`, `Date` and `Server`, each line ending in CRLF."""
        date = self.date()
        prefix = self._prefixes.get(status)
        if prefix is None:
            line = (
                f"HTTP/1.1 {status} {framing.reason(status)}\r\nDate: {date}\r\nServer: dirmq\r\n"
            )
            prefix = self._prefixes[status] = line.encode()
        return prefix


class HttpServer:
    """Shared state of every connection of one listening server."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits | None = None,
        fast: FastHandler | None = None,
        *,
        budget: MemoryBudget | None = None,
        body_check: BodyCheck | None = None,
        body_sink: BodySinkFor | None = None,
        observe: Observe | None = None,
        scheme: str = "http",
        require_client_certificate: bool = False,
        loopback_only: bool = False,
    ) -> None:
        self.handler = handler
        # Protected mode (no credentials configured): a peer not on this host is turned away.
        self.loopback_only = loopback_only
        self.scheme = scheme  # "https": the listener wraps connections in TLS (serve.py)
        # TLS let a client without a certificate through (`tls.py`): refuse it here, in words.
        self.require_client_certificate = require_client_certificate
        self.fast = fast
        self.body_check = body_check
        self.body_sink = body_sink  # large bodies written as they arrive (bodies.py)
        self.observe = observe
        self.limits = limits or Limits()
        # Shared by every listener of a worker process (serve.py passes one).
        self.budget = budget or MemoryBudget(self.limits.max_body_memory_bytes)
        self.connections: set[HttpProtocol] = set()
        # With several workers: connections spread evenly over them (balance.py), and this
        # listener's index among the worker's, which a passed connection names.
        self.balance: ConnectionBalance | None = None
        self.listener = 0
        self.draining = False
        self.clock = _Clock()
        self.requests_served = 0
        # One timer for every connection's deadline instead of a timer per connection armed
        # and cancelled three times a request: a timeout fires up to one sweep period late.
        shortest = min(limits_of(self.limits))
        self._sweep_s = min(MAX_SWEEP_S, max(shortest / 4, 0.01))
        self._sweeper: asyncio.TimerHandle | None = None

    def protocol(self) -> HttpProtocol:
        return HttpProtocol(self)

    def passed_protocol(self, received: bytes, arrived: Callable[[], None]) -> HttpProtocol:
        """For a connection another worker passed on (balance.py) with the bytes it had read:
        it stays here; `arrived` is called once it is counted here."""
        return HttpProtocol(self, movable=False, received=received, arrived=arrived)

    def watch(self, connection: HttpProtocol) -> None:
        self.connections.add(connection)
        if self._sweeper is None:
            loop = asyncio.get_running_loop()
            self._sweeper = loop.call_later(self._sweep_s, self._sweep, loop)

    def _sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        expired = [c for c in self.connections if 0.0 < c.deadline <= now]
        for connection in expired:
            connection.timed_out()
        self._sweeper = (
            loop.call_later(self._sweep_s, self._sweep, loop) if self.connections else None
        )

    async def drain(self, timeout_s: float) -> int:
        """Finish what is in progress, then close every connection (the listener is already
        closed by the caller). Idle connections close now; busy ones after their response.
        Returns how many were still busy at the deadline, and cut."""
        self.draining = True
        # Closed idle ones are not waited for: over TLS, closing waits for the client's
        # close_notify, which an idle keep-alive client never sends (they are aborted below).
        idle = {c for c in list(self.connections) if c.close_if_idle()}
        deadline = time.monotonic() + timeout_s
        while self.connections - idle and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        cut = list(self.connections)
        for connection in cut:
            connection.abort()
        return len(cut)


def limits_of(limits: Limits) -> tuple[float, float, float]:
    return (limits.header_timeout_s, limits.body_timeout_s, limits.idle_timeout_s)


class HttpProtocol(asyncio.Protocol):
    # Slots: thousands of connections sit parked in long polls; each must stay small.
    __slots__ = (
        "_arrived",
        "_began",
        "_body",
        "_body_bytes",
        "_body_charge",
        "_body_io",
        "_can_write",
        "_closed",
        "_counted",
        "_file_sending",
        "_first_read",
        "_head_bytes",
        "_headers",
        "_in_message",
        "_limits",
        "_lingering",
        "_loop",
        "_movable",
        "_parser",
        "_peer",
        "_pending",
        "_raw_headers",
        "_reading_paused",
        "_received",
        "_received_as_stream",
        "_refusal",
        "_response_charge",
        "_server",
        "_stream_counted",
        "_task",
        "_transport",
        "_unparsed",
        "_upgrade_tail",
        "_upgraded",
        "_upload",
        "_url",
        "_write_paused",
        "deadline",
    )

    def __init__(
        self,
        server: HttpServer,
        movable: bool = True,
        received: bytes = b"",
        arrived: Callable[[], None] | None = None,
    ) -> None:
        self._server = server
        # May be passed to another worker (balance.py) when accepted.
        self._movable = movable and server.balance is not None
        # Its first bytes not looked at yet: a streaming consumer's upgrade may move it (once
        # more, for a connection passed at accept, but never a second time as a stream).
        self._first_read = server.balance is not None
        self._received = received  # read by the worker that passed it here
        self._received_as_stream = bool(received)  # passed for its upgrade: it stays here
        self._arrived = arrived  # for a passed connection: tell balance.py it is counted here
        self._counted = False  # in this worker's connection count (balance.py)
        self._stream_counted = False  # in this worker's stream count (balance.py)
        self._limits = server.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        # Created on first use: most connections never pipeline nor fill their write buffer, and
        # a deque or an Event per parked long poll adds up.
        self._pending: deque[Request] | None = None
        # The request being answered: its Task, or LATER while a fast answer is on its way.
        self._task: asyncio.Future[Any] | Later | None = None
        self.deadline = 0.0  # loop time at which the connection times out; 0: never
        self._can_write: asyncio.Event | None = None  # set while writable; None: never paused
        self._write_paused = False  # the transport's write buffer is over its high-water mark
        self._reading_paused = False
        self._response_charge = 0  # bytes of a response body charged while the buffer drains
        self._closed = False
        self._lingering = False  # refused: reading and dropping the rest until LINGER_S
        # A refusal waiting for the answers to the requests before it: nothing more is read.
        self._refusal: Callable[[], None] | None = None
        self._unparsed: memoryview | None = None  # received, parsed once reading may go on
        self._body_charge = 0  # budget reserved for the body being read
        self._began = 0.0  # time.monotonic() when the current request began to arrive
        self._peer = ""
        # A GET asking to upgrade is being answered: what the client sent after it (reading is
        # paused meanwhile; httptools parses nothing after an upgrade request).
        self._upgrade_tail: bytes | None = None
        self._upgraded: Upgraded | None = None  # the protocol the connection switched to
        self._file_sending = False  # a body goes from its file straight to the socket
        self._reset_message()

    def _reset_message(self) -> None:
        self._url = b""
        self._raw_headers: list[tuple[str, str]] = []
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._body: list[bytes] = []
        self._body_io: io.BytesIO | None = None
        self._body_bytes = 0
        self._in_message = False
        self._upload: Upload | None = None  # the body going to its sink (bodies.py)

    # -- connection lifecycle -------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self._transport = cast(asyncio.Transport, transport)
        balance = self._server.balance
        if balance is not None:
            # Before anything is read: another worker may serve it (balance.py).
            if self._movable and balance.pass_connection(
                transport.get_extra_info("socket"), self._server.listener
            ):
                self._closed = True
                self._transport.abort()  # our copy only: the connection lives on over there
                return
            balance.opened()
            self._counted = True
            if self._arrived is not None:
                self._arrived()
        if len(self._server.connections) >= self._limits.max_connections:
            message = "too many connections; retry shortly"
            self._write_error(503, message, extra=(("Retry-After", "1"),))
            self._transport.close()
            self._closed = True
            return
        if self._server.require_client_certificate and not transport.get_extra_info("peercert"):
            # Before reading anything: the client's first request gets this answer.
            self._write_error(403, CERTIFICATE_REQUIRED)
            self._transport.close()
            self._closed = True
            return
        if self._server.loopback_only and not is_loopback_peer(
            transport.get_extra_info("peername")
        ):
            self._write_error(403, PROTECTED_MODE)
            self._transport.close()
            self._closed = True
            return
        self._server.watch(self)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self._peer = str(peer[0])
        # No TCP_NODELAY here: uvloop sets it on every TCP transport, accepted or passed
        # (`get_extra_info("socket")` alone cost three getsockname(2) and a socket object).
        self._arm(self._limits.idle_timeout_s)
        if self._received:  # before the transport reads anything more: in order
            received, self._received = self._received, b""
            self.data_received(received)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        balance = self._server.balance
        if self._counted and balance is not None:
            self._counted = False
            balance.closed()
            if self._stream_counted:
                self._stream_counted = False
                balance.stream_closed()
        if self._upgraded is not None:
            self._upgraded.connection_lost()
        self._server.connections.discard(self)
        self._disarm()
        if self._task is not None:
            self._task.cancel()  # e.g. a long poll whose client went away
        if self._can_write is not None:
            self._can_write.set()
        # What the budget holds for this connection (the running request gives its own back).
        self._drop_upload()
        self._give_body_charge()
        while self._pending:
            self._release(self._pending.popleft())
        self._give_response_charge()
        self._take_unparsed()

    # -- back-pressure: nothing more is read while answers are unsent ---------------------------
    def pause_writing(self) -> None:
        if self._upgraded is not None:
            self._upgraded.writable(False)
            return
        self._write_paused = True
        if self._can_write is None:
            self._can_write = asyncio.Event()
        self._can_write.clear()
        self._update_reading()

    def resume_writing(self) -> None:
        if self._upgraded is not None:
            self._upgraded.writable(True)
            return
        self._write_paused = False
        if self._can_write is not None:
            self._can_write.set()
        self._give_response_charge()
        self._update_reading()
        if self._task is None:
            self._start_next()

    def _update_reading(self) -> None:
        """Read only while answers flow: not while the write buffer is over its high-water mark
        (a client that sends requests but reads no answers), nor while more than MAX_PIPELINED
        requests wait. Then the kernel's buffers fill and TCP stops the client."""
        transport = self._transport
        if transport is None or (self._closed and not self._lingering):
            return  # gone, or closing after a refusal
        pause = self._must_pause()
        if not pause and self._unparsed is not None:
            # What was received already comes first; reading resumes once it is parsed.
            self._loop.call_soon(self._feed_unparsed)
            pause = True
        if pause != self._reading_paused:
            self._reading_paused = pause
            if pause:
                transport.pause_reading()
            else:
                transport.resume_reading()

    def _must_pause(self) -> bool:
        return not self._lingering and (
            self._write_paused
            or (self._upload is not None and self._upload.behind)
            or self._upgrade_tail is not None
            or self._refusal is not None
            or (self._pending is not None and len(self._pending) > MAX_PIPELINED)
        )

    def _charge_response(self, size: int) -> None:
        """A response body left in the write buffer (a slow reader) counts against the budget
        until the buffer drains below its low-water mark."""
        if self._write_paused and size and not self._closed:
            self._response_charge += size
            self._server.budget.take(size)

    def _give_response_charge(self) -> None:
        if self._response_charge:
            self._server.budget.give(self._response_charge)
            self._response_charge = 0

    def _drop_upload(self) -> None:
        """The body being received will never be a request's (refused, or its client left)."""
        upload, self._upload = self._upload, None
        if upload is not None:
            upload.close()

    def _upload_progress(self) -> None:
        """The upload's writer caught up (or failed): read on."""
        self._update_reading()

    def _give_body_charge(self) -> None:
        if self._body_charge:
            self._server.budget.give(self._body_charge)
            self._body_charge = 0

    def _release(self, request: Request) -> None:
        """A request is answered (or dropped): its body's share of the budget is free, and
        its upload's sink is discarded (what the answer kept, it has taken)."""
        upload = request.upload
        if isinstance(upload, Upload):
            upload.close()
            request.upload = None
        if request.held_bytes:
            self._server.budget.give(request.held_bytes)
            request.held_bytes = 0

    def close_if_idle(self) -> bool:
        """Close the connection if no request is in progress on it; whether it did. An
        upgraded one is asked to say goodbye, and counts as busy until it has closed."""
        if self._upgraded is not None:
            self._upgraded.shutdown()
            return False
        if self._task is None and not self._in_message and self._transport is not None:
            self._transport.close()
            return True
        return False

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # -- timers (HttpServer._sweep checks every connection's deadline) ---------------------------
    def _arm(self, seconds: float) -> None:
        self.deadline = self._loop.time() + seconds

    def _disarm(self) -> None:
        self.deadline = 0.0

    def timed_out(self) -> None:
        self.deadline = 0.0
        if self._lingering:
            if self._transport is not None:
                self._transport.close()
        elif self._in_message:
            self._fail(408, "the request did not arrive in time")
        elif self._task is None and self._transport is not None:
            self._transport.close()  # idle keep-alive connection

    # -- parsing (httptools callbacks) ----------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self._upgraded is not None:
            self._upgraded.data_received(data)
            return
        if self._first_read and self._pass_stream(data):
            return
        if self._upgrade_tail is not None:  # a read that came before pausing took effect
            self._upgrade_tail += data
            return
        if self._closed or self._refusal is not None:
            return
        kept = self._take_unparsed()
        if kept is not None:  # a read that came before pausing took effect: in order
            data = bytes(kept) + data
        if len(data) <= FEED_BYTES:
            self._feed_piece(data)  # the usual case: one request, or a few
        else:
            self._feed(memoryview(data))
        if self._unparsed is not None or self._upload is not None:
            self._update_reading()

    def _pass_stream(self, data: bytes) -> bool:
        """A connection whose first bytes ask for an upgrade (a streaming consumer) may go to
        a worker serving fewer streams (balance.py); True if it went. One that stays counts as
        a stream here at once, not at its 101: else several streams arriving together each see
        the same counts, and all stay on the worker that took them."""
        self._first_read = False  # only a connection's first bytes are looked at
        balance = self._server.balance
        transport = self._transport
        if (
            balance is None
            or transport is None
            or self._closed
            or not self._counted
            or data[:4] != b"GET "
            or b"upgrade:" not in data[:4096].lower()
        ):
            return False
        if not self._received_as_stream and balance.pass_stream(
            transport.get_extra_info("socket"), self._server.listener, data
        ):
            self._closed = True
            transport.abort()  # our copy only: the connection lives on over there
            return True
        balance.stream_opened()
        self._stream_counted = True
        return False

    def _feed(self, data: memoryview) -> None:
        """Parse FEED_BYTES at a time while the connection may be read; keep the rest."""
        while data:
            if self._closed or self._refusal is not None:
                return  # refused: the rest is dropped
            if self._must_pause():
                self._keep_unparsed(data)
                return
            # An upload's body in larger pieces: it ends no request, only its window pauses.
            size = UPLOAD_FEED_BYTES if self._upload is not None else FEED_BYTES
            if not self._feed_piece(data[:size]):
                if self._upgrade_tail is not None:
                    self._upgrade_tail += data[size:]
                return
            data = data[size:]

    def _feed_unparsed(self) -> None:
        data = self._take_unparsed()
        if data is not None:
            self._feed(data)
        self._update_reading()

    def _keep_unparsed(self, data: memoryview) -> None:
        """Received but not to be parsed yet (at most one read, ~256 KiB): it is in memory, so
        it counts against the budget until parsed, and uploads wait rather than the sum grow."""
        self._unparsed = data
        self._server.budget.take(len(data))

    def _take_unparsed(self) -> memoryview | None:
        data, self._unparsed = self._unparsed, None
        if data is not None:
            self._server.budget.give(len(data))
        return data

    def _feed_piece(self, data: bytes | memoryview) -> bool:
        """Parse; False if the request was refused (the rest is not to be parsed)."""
        try:
            self._parser.feed_data(data)
            return True
        except httptools.HttpParserUpgrade as upgrade:
            if self._upgrade_tail is None:  # not a GET: nothing answers it
                self._fail(400, "protocol upgrades are not supported on this endpoint")
            else:  # what follows the request waits for its answer (reading stops until then)
                self._upgrade_tail = bytes(data[upgrade.args[0] :])
                self._update_reading()
        except httptools.HttpParserError as exc:
            # httptools wraps what our callbacks raise; a limit we enforced is the real answer.
            reject = exc.__context__ if isinstance(exc.__context__, _Reject) else None
            if reject is not None:
                self._fail(reject.status, reject.message, reject.headers, reject.response)
            else:
                self._fail(400, f"malformed HTTP request: {exc}")
        return False

    def on_message_begin(self) -> None:
        self._drop_upload()
        self._reset_message()
        self._in_message = True
        self._began = time.monotonic()
        self._arm(self._limits.header_timeout_s)

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        text_name, text = name.decode("latin-1"), _header_text(value)
        self._raw_headers.append((text_name, text))
        key = text_name.lower()
        headers = self._headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self._limits.max_header_bytes:
            raise _Reject(431, f"request head over {self._limits.max_header_bytes} bytes")

    def on_headers_complete(self) -> None:
        headers = self._headers
        length = _content_length(headers)
        if length:
            self._check_body(length)
            # A large body may go to a sink as it arrives (its window reserved), else it is
            # reserved whole and read into memory.
            if length < STREAM_BODY_BYTES or not self._stream_body(length):
                self._reserve(length)
                if length >= PREALLOCATE_BYTES:
                    # Filled in place: `bytes(n)` is lazily zeroed memory, and a BytesIO that
                    # holds the only reference to its bytes writes into them and hands them
                    # back as is.
                    self._body_io = io.BytesIO(bytes(length))
        expect = headers.get("expect")
        if (
            expect is not None
            and expect.strip().lower() == "100-continue"
            and self._transport
            and not self._file_sending  # its bytes would land amid the body being sent
        ):
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._arm(self._limits.body_timeout_s)

    def _check_body(self, length: int) -> None:
        """Refuse a body from its Content-Length, before reading it: over the server's limit
        or the application's (413), or over what the memory budget has left (503: a retry
        cures it once other requests are answered). Then reserve it."""
        limit = self._limits.max_body_bytes
        if length > limit:
            raise _Reject(413, f"body of {length} bytes {_over_the_limit(limit)}")
        check = self._server.body_check
        if check is not None:
            path, _query = _split_url(self._url)
            try:
                refusal = check(self._method(), path, self._headers, length)
            except Exception:  # a bug there must not pass for a malformed request: read on
                log.exception("checking the body of %s failed", path)
                refusal = None
            if refusal is not None:
                raise _Reject(refusal.status, "refused by the application", response=refusal)

    def _stream_body(self, length: int) -> bool:
        """Whether the body (of `length` bytes, checked) goes to a sink the application gives
        for it as it arrives (bodies.py), its window reserved."""
        body_sink = self._server.body_sink
        sink = None
        if body_sink is not None:
            path, query = _split_url(self._url)
            head = Request(
                self._method(),
                path,
                _first_values(query) if query else {},
                self._headers,
                b"",
                False,
                self._raw_headers,
                query,
                scheme=self._server.scheme,
                peer=self._peer,
            )
            self._reserve(window_for(length))  # before a sink is made: 503 makes none
            try:
                sink = body_sink(head, length)
            except Exception:  # a bug there must not cost the request: read it into memory
                log.exception("choosing a sink for the body of %s failed", path)
            if sink is None:
                self._give_body_charge()
        if sink is None:
            return False
        self._upload = Upload(sink, length, self._upload_progress)
        return True

    def _reserve(self, size: int) -> None:
        """Reserve `size` bytes of the budget for the body being read (503 if they do not
        fit)."""
        budget = self._server.budget
        if not budget.try_take(size):
            raise _Reject(
                503,
                f"the server's memory for request bodies ({budget.limit} bytes, "
                f"--max-body-memory) is in use by other requests; retry shortly",
                (("Retry-After", str(RETRY_AFTER_S)),),
            )
        self._body_charge += size

    def _method(self) -> str:
        method = self._parser.get_method()
        return _METHOD_NAMES.get(method) or method.decode("ascii", "replace")

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._upload is not None:
            self._upload.feed(body)  # within its Content-Length: llhttp checks that
            return
        if self._body_io is not None:
            self._body_io.write(body)  # within its Content-Length: llhttp checks that
            return
        if self._body_bytes > self._limits.max_body_bytes:
            raise _Reject(413, f"body {_over_the_limit(self._limits.max_body_bytes)}")
        if self._body_bytes > self._body_charge:  # sent chunked: reserved as it arrives
            self._reserve(self._body_bytes - self._body_charge)
        self._body.append(body)

    def on_message_complete(self) -> None:
        self.deadline = 0.0
        upgrade = self._parser.should_upgrade()
        if upgrade and (self._method() != "GET" or self._body_bytes):
            self._drop_upload()
            self._give_body_charge()
            self._reset_message()
            return  # refused as httptools stops after it (`_feed_piece`)
        path, query = _split_url(self._url)
        body = self._body
        request = Request(
            self._method(),
            path,
            _first_values(query) if query else {},
            self._headers,
            (
                self._body_io.getvalue()
                if self._body_io is not None
                else body[0]
                if len(body) == 1
                else b"".join(body)
            ),
            # After a request to upgrade that is not switched, httptools parses nothing more.
            self._parser.should_keep_alive() and not upgrade,
            self._raw_headers,
            query,
            self._body_charge,
            time.monotonic(),
            scheme=self._server.scheme,
            peer=self._peer,
            upload=self._upload,
        )
        if self._upload is not None:
            self._upload.finish()
            self._upload = None  # the request's now, like its charge
        self._body_charge = 0  # the request's now
        self._reset_message()
        if upgrade:
            self._upgrade_tail = b""  # nothing more is parsed: see `_feed_piece`
        if self._task is None and not self._pending and not self._closed and not self._write_paused:
            self._begin(request)  # the usual case
            return
        if self._pending is None:
            self._pending = deque()
        self._pending.append(request)
        self._update_reading()
        self._start_next()

    # -- answering ------------------------------------------------------------------------------
    def _start_next(self) -> None:
        if self._task is not None or self._closed or self._write_paused:
            return
        if not self._pending:
            refusal, self._refusal = self._refusal, None
            if refusal is not None:  # every request before it is answered: its turn
                refusal()
            return
        request = self._pending.popleft()
        self._update_reading()
        self._begin(request)

    def _begin(self, request: Request) -> None:
        fast = self._server.fast
        if fast is not None:
            # Busy from now on: should `respond` run before `fast` returns (an answer ready at
            # once), it clears this, and LATER must not be set again after it.
            self._task = LATER
            try:
                result = fast(request, functools.partial(self._respond, request))
            except Exception:
                log.exception("unhandled error answering %s %s", request.method, request.path)
                result = _internal_error()
            if isinstance(result, Later):
                if result is not LATER and self._task is LATER:
                    self._task = result  # not answered yet: cancelled if the client leaves
                return
            if isinstance(result, Response):
                self._task = None
                self._release(request)
                self._reply(request, result)
                return
        task = self._task = self._loop.create_task(self._answer(request))
        if request.held_bytes or request.upload is not None:
            # Not in `_answer`: a task cancelled before it starts never runs its `finally`.
            task.add_done_callback(lambda _task: self._release(request))

    def _respond(self, request: Request, outcome: Response | BaseException) -> bool:
        """A fast answer is ready: reply (unless the connection went away)."""
        self._task = None
        self._release(request)
        if isinstance(outcome, BaseException):
            log.error(
                "unhandled error answering %s %s",
                request.method,
                request.path,
                exc_info=outcome,
            )
            outcome = _internal_error()
        return self._reply(request, outcome)

    def _reply(self, request: Request, response: Response) -> bool:
        """Send a fast answer's response, then what `_answer` does after its own; False if the
        connection is gone."""
        if self._transport is None or self._closed:
            if response.file is not None:
                response.file.close()
            return False
        keep_alive = request.keep_alive and not self._server.draining
        if response.file is not None:  # sent from its file: a task (see `_send_file`)
            self._task = self._loop.create_task(self._answer_file(request, response, keep_alive))
            return True
        self._write_response(request, response, keep_alive)
        self._server.requests_served += 1
        self._observed(request, response.status, len(response.body))
        self._next_request(keep_alive)
        return True

    def _observed(self, request: Request, status: int, sent: int) -> None:
        observe = self._server.observe
        if observe is None:
            return
        try:
            observe(request, status, sent, time.monotonic() - request.started)
        except Exception:  # an observer's bug must not cost the client its connection
            log.exception("observing %s %s failed", request.method, request.path)

    def _next_request(self, keep_alive: bool) -> None:
        """A response is out: close, or wait for (or start) the next request."""
        if self._transport is None or self._closed:
            return
        if not keep_alive:
            self._transport.close()
            return
        if not self._in_message:
            self._arm(self._limits.idle_timeout_s)
        self._start_next()

    async def _answer(self, request: Request) -> None:
        sent: list[int] = []  # the response's status and body bytes, once it has begun
        try:
            try:
                response = await self._server.handler(request)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("unhandled error answering %s %s", request.method, request.path)
                response = _internal_error()
            if isinstance(response, SwitchProtocols):
                self._switch(request, response)
                return
            keep_alive = request.keep_alive and not self._server.draining
            sent = [response.status, 0]
            await self._send(request, response, keep_alive, sent)
            self._server.requests_served += 1
            if isinstance(response, Response) and response.after is not None:
                # Shielded: the bytes are out, so the follow-up (an ack) must happen even if
                # the client hangs up this very moment and our task is cancelled.
                await asyncio.shield(response.after())
        except asyncio.CancelledError:
            return
        except ConnectionError:
            keep_alive = False
        finally:
            self._task = None
            if sent:  # also a stream the client left (its end is how an SSE stream ends)
                self._observed(request, sent[0], sent[1])
        self._next_request(keep_alive)

    async def _answer_file(self, request: Request, response: Response, keep_alive: bool) -> None:
        """A fast answer whose body is a file: `_reply`'s rest, after the body is sent."""
        sent = 0
        try:
            await self._send_file(request, response, keep_alive)
            sent = response.file.size if response.file is not None else 0
            self._server.requests_served += 1
        except asyncio.CancelledError:
            return
        except ConnectionError:
            keep_alive = False
        finally:
            self._task = None
            self._observed(request, response.status, sent)
        self._next_request(keep_alive)

    async def _send_file(self, request: Request, response: Response, keep_alive: bool) -> None:
        """Write a response whose body is a file (filesend.py): on plain TCP by `sendfile`
        from a thread, under TLS copied through the transport a piece at a time. The file is
        closed once sent, or the sending given up."""
        transport, file = self._transport, response.file
        assert transport is not None and file is not None
        status = response.status
        head = _response_head(
            self._server.clock.prefix(status), response.headers, status, file.size, keep_alive
        )
        if self._closed or transport.is_closing():
            file.close()
            raise ConnectionResetError("client went away")
        if request.method == "HEAD" or status in _NO_BODY:
            file.close()
            transport.write(head)
            return
        self._file_sending = True
        try:
            await filesend.send(transport, head, file, self._limits.idle_timeout_s, self._writable)
        finally:
            self._file_sending = False

    async def _writable(self) -> None:
        """Once the transport's write buffer is under its high-water mark."""
        if self._can_write is not None:
            await self._can_write.wait()

    def _switch(self, request: Request, response: SwitchProtocols) -> None:
        """Write the 101 and hand the connection to `response.connection` (from `_answer`,
        whose `finally` clears `_task`: the connection stays busy for the drain)."""
        transport = self._transport
        tail, self._upgrade_tail = self._upgrade_tail or b"", None
        if transport is None or self._closed:
            return
        head = _response_head(
            self._server.clock.prefix(101), response.headers, 101, 0, keep_alive=True
        )
        transport.write(head)
        self._upgraded = response.connection
        if self._counted and not self._stream_counted and self._server.balance is not None:
            self._server.balance.stream_opened()
            self._stream_counted = True
        self._disarm()  # the protocol keeps its own timers
        self._server.requests_served += 1
        self._observed(request, 101, 0)
        if self._reading_paused:
            self._reading_paused = False
            transport.resume_reading()
        response.connection.start(transport, tail)
        if self._write_paused:
            response.connection.writable(False)

    def _write_response(self, request: Request, response: Response, keep_alive: bool) -> None:
        transport = self._transport
        assert transport is not None
        status, content = response.status, response.body
        head = _response_head(
            self._server.clock.prefix(status), response.headers, status, len(content), keep_alive
        )
        if status in _NO_BODY or request.method == "HEAD" or not content:
            transport.write(head)
        elif len(content) < PREALLOCATE_BYTES:
            transport.write(head + content)  # one small buffer for the transport
        else:
            # Not `head + content`: a big body's copy. The transport keeps the bytes themselves.
            transport.write(head)
            transport.write(content)
            self._charge_response(len(content))

    def _base_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [("Date", self._server.clock.date()), ("Server", "dirmq"), *headers]

    async def _send(
        self,
        request: Request,
        response: Response | StreamResponse,
        keep_alive: bool,
        sent: list[int],
    ) -> None:
        """Write `response`; `sent[1]` counts its body bytes as they go."""
        transport = self._transport
        assert transport is not None
        if isinstance(response, Response):
            if response.file is not None:
                await self._send_file(request, response, keep_alive)
                sent[1] = response.file.size
                return
            self._write_response(request, response, keep_alive)
            sent[1] = len(response.body)
            return
        # uvloop refuses a write to a closed transport with a RuntimeError, which nothing here
        # would handle: a stream whose connection closed (a drain, or the client left) stops.
        if self._closed or transport.is_closing():
            raise ConnectionResetError("client went away")
        headers = self._base_headers(response.headers)
        transport.write(
            framing.response_head(
                response.status,
                headers,
                content_length=None,
                keep_alive=keep_alive,
                trailers=response.trailer_names,
            )
        )
        body = response.body
        try:
            async for piece in body:
                if self._closed or transport.is_closing():
                    raise ConnectionResetError("client went away")
                transport.write(framing.chunk(piece))
                sent[1] += len(piece)
                if self._can_write is not None:
                    await self._can_write.wait()
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception:
            # The head is gone already: the only honest signal left is an aborted connection
            # (a client sees a truncated chunked body, never a hang).
            log.exception("a streamed response failed")
            transport.abort()
            raise ConnectionResetError("stream failed") from None
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
        if self._closed or transport.is_closing():
            raise ConnectionResetError("client went away")  # while the body ended
        transport.write(framing.last_chunk(response.trailers))

    def _fail(
        self,
        status: int,
        message: str,
        extra: tuple[tuple[str, str], ...] = (),
        response: Response | None = None,
    ) -> None:
        """Refuse a request we could not parse or accept, after the answers to the requests
        pipelined before it (reading nothing more meanwhile), then close the connection."""
        self._disarm()
        self._drop_upload()
        self._give_body_charge()
        if self._closed or self._refusal is not None:
            return
        refusal = functools.partial(self._refuse, status, message, extra, response)
        if self._task is None and not self._pending:
            refusal()
            return
        self._refusal = refusal
        self._update_reading()

    def _observe_refusal(self, status: int, response: Response | None) -> None:
        """Observers see a refused request too, as far as it arrived (no method before the
        parser read one: "-")."""
        try:
            method = self._method() if self._url else "-"
        except httptools.HttpParserError:
            method = "-"
        path, query = _split_url(self._url) if self._url else ("-", "")
        request = Request(
            method,
            path,
            {},
            self._headers,
            b"",
            False,
            self._raw_headers,
            query,
            scheme=self._server.scheme,
        )
        request.started = self._began
        request.peer = self._peer
        sent = len(response.body) if response is not None else len(error_body(status, ""))
        self._observed(request, status, sent)

    def _refuse(
        self,
        status: int,
        message: str,
        extra: tuple[tuple[str, str], ...],
        response: Response | None,
    ) -> None:
        """Write the refusal; close once the client closes its side or LINGER_S has passed,
        reading and dropping what it still sends (a body we refused) meanwhile."""
        self._closed = True
        self._take_unparsed()
        transport = self._transport
        if transport is None:
            return
        if self._server.observe is not None:
            self._observe_refusal(status, response)
        if response is None:
            self._write_error(status, message, extra)
        else:
            response.headers = [*response.headers, ("Connection", "close")]
            head = _response_head(
                self._server.clock.prefix(response.status),
                response.headers,
                response.status,
                len(response.body),
                keep_alive=True,  # "Connection: close" is among the headers already
            )
            transport.write(head + response.body)
        if transport.can_write_eof():
            transport.write_eof()
            self._lingering = True
            self._update_reading()
            self._arm(LINGER_S)
        else:
            # TLS: no half-close, but closing sends close_notify and then reads and drops what
            # the client still sends until it answers, for up to LINGER_S (serve.py's
            # ssl_shutdown_timeout): the same linger, done by the TLS layer.
            transport.close()

    def _write_error(
        self, status: int, message: str, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        if self._transport is None:
            return
        body = error_body(status, message)
        headers = self._base_headers([("Content-Type", "application/json"), *extra])
        head = framing.response_head(status, headers, content_length=len(body), keep_alive=False)
        self._transport.write(head + body)


def _internal_error() -> Response:
    return Response(
        500, error_body(500, "internal server error"), [("Content-Type", "application/json")]
    )


def _response_head(
    prefix: bytes, headers: list[tuple[str, str]], status: int, length: int, keep_alive: bool
) -> bytes:
    """What `framing.response_head` makes of a response with a body of `length` bytes (byte for
    byte, the CR/LF check included), from the status line, Date and Server already encoded."""
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers])
    if fields.count("\n") != len(headers) or fields.count("\r") != len(headers):
        raise ValueError(f"header line with CR/LF: {fields[:60]!r}")
    tail = b"" if status in _NO_BODY or status < 200 else b"Content-Length: %d\r\n" % length
    if not keep_alive:
        tail += b"Connection: close\r\n"
    return prefix + fields.encode() + tail + b"\r\n"


def _split_url(raw_url: bytes) -> tuple[str, str]:
    """(path, query), both still percent-encoded."""
    if raw_url[:1] == b"/" and b"?" not in raw_url and b"#" not in raw_url:
        return raw_url.decode("latin-1"), ""  # the usual origin-form: nothing to split
    url = httptools.parse_url(raw_url)
    path = url.path.decode("latin-1") if url.path else "/"
    return path, url.query.decode("latin-1") if url.query else ""


def _content_length(headers: dict[str, str]) -> int | None:
    """The declared body size (llhttp has checked it is digits, and that repeats agree: they
    are joined with ", " here, so the first value is the one)."""
    length = headers.get("content-length")
    if length is None:
        return None
    digits = length.split(",", 1)[0].strip()
    return int(digits) if digits.isascii() and digits.isdigit() else None


def _header_text(value: bytes) -> str:
    """Header values are UTF-8 when they decode as such (what our client sends), else latin-1."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")


def _first_values(query: str) -> dict[str, str]:
    """Percent-decoded as UTF-8; bytes that are not UTF-8 are kept as lone surrogates (not
    U+FFFD, which would pass for a real value), so each dialect can refuse them its own way."""
    values: dict[str, str] = {}
    if "%" not in query and "+" not in query:  # nothing to decode (`?wait=20s`): as parse_qsl
        for field in query.split("&"):
            if field:
                name, _, value = field.partition("=")
                values.setdefault(name, value)
        return values
    for name, value in parse_qsl(query, keep_blank_values=True, errors="surrogateescape"):
        values.setdefault(name, value)
    return values
