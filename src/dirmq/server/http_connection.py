"""One HTTP/1.1 connection's state and its life: accepted (or passed to another worker, or
turned away at once), watched for its deadline, paused and resumed for back-pressure, closed;
and the memory budget it is charged, each charge given back exactly once.

`HttpConnection` holds every field of a connection and the methods that all of its parts use.
Three parts complete it, each a class over it in a module of its own: `Intake`
(`http_intake.py`: the bytes read, parsed into requests), `Answers` (`http_answers.py`: the
requests answered in order) and `Refusals` (`http_refusals.py`: a request refused, then the
connection closed). `HttpProtocol` (`http.py`) is all of them in one object: a call from one
part to another is a plain method call, and what this class calls of the parts is declared
below for the type checker.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import httptools

from dirmq.server.addresses import is_loopback_peer
from dirmq.server.bodies import Upload
from dirmq.server.contract import Later, Request, Response, Upgraded
from dirmq.server.http_listener import Listener

log = logging.getLogger("dirmq.server")

# Requests one connection may have waiting behind the one being answered before we stop
# reading from it (one read can bring more: at most what it holds, 256 KiB).
MAX_PIPELINED = 16
CERTIFICATE_REQUIRED = (
    "this server requires a client certificate (mutual TLS) signed by a CA it trusts; "
    "none was presented"
)
PROTECTED_MODE = (
    "dirmq runs in protected mode (no credentials configured): only clients on this host may "
    "connect; start it with --credentials FILE (or --allow-anonymous)"
)
_METHOD_NAMES = {m.encode(): m for m in ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH")}


class HttpConnection(asyncio.Protocol):
    """A connection's fields and its life; `HttpProtocol` (`http.py`) completes it."""

    # Slots: thousands of connections sit parked in long polls; each must stay small. The parts
    # (and HttpProtocol) add none.
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
        server: Listener,
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

    if TYPE_CHECKING:  # defined by the part named, called from this class or another part

        def _feed_unparsed(self) -> None: ...  # Intake

        def _begin(self, request: Request) -> None: ...  # Answers

        def _start_next(self) -> None: ...  # Answers

        def _fail(  # Refusals
            self,
            status: int,
            message: str,
            extra: tuple[tuple[str, str], ...] = (),
            response: Response | None = None,
        ) -> None: ...

        def _write_error(  # Refusals
            self, status: int, message: str, extra: tuple[tuple[str, str], ...] = ()
        ) -> None: ...

    # -- connection lifecycle ----------------------------------------------------------------------
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
        peer = transport.get_extra_info("peername")
        if self._server.loopback_only and not is_loopback_peer(peer):
            self._write_error(403, PROTECTED_MODE)
            self._transport.close()
            self._closed = True
            return
        self._server.watch(self)
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

    # -- back-pressure: nothing more is read while answers are unsent ------------------------------
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

    # -- the memory budget: what this connection holds is given back once --------------------------
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

    def _give_body_charge(self) -> None:
        if self._body_charge:
            self._server.budget.give(self._body_charge)
            self._body_charge = 0

    def _take_unparsed(self) -> memoryview | None:
        data, self._unparsed = self._unparsed, None
        if data is not None:
            self._server.budget.give(len(data))
        return data

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

    # -- timers (Listener._sweep checks every connection's deadline) -------------------------------
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

    # -- used by several parts ---------------------------------------------------------------------
    def _method(self) -> str:
        method = self._parser.get_method()
        return _METHOD_NAMES.get(method) or method.decode("ascii", "replace")

    def _observed(self, request: Request, status: int, sent: int) -> None:
        observe = self._server.observe
        if observe is None:
            return
        try:
            observe(request, status, sent, time.monotonic() - request.started)
        except Exception:  # an observer's bug must not cost the client its connection
            log.exception("observing %s %s failed", request.method, request.path)

    def _base_headers(self, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [("Date", self._server.clock.date()), ("Server", "dirmq"), *headers]
