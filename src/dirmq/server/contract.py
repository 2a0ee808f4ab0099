"""The runtime<->dialect contract: what a dialect receives (`Request`, its large body maybe in
a sink: `ReceivedBody`), what it answers (`Response`, its body maybe a `BodyFile`;
`StreamResponse`; `SwitchProtocols` with the `Upgraded` object that takes the connection over)
and the shapes of the callables the runtime calls (`Handler`, `FastHandler` with `Respond` and
`LATER`, `BodyCheck`, `BodySinkFor` with `BodySink`, `Observe`). `http.py` serves it on every
connection; the dialects, the router and the observers import it alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class Request:
    method: str
    path: str  # as sent: still percent-encoded
    query: dict[str, str]  # first value of each parameter, percent-decoded
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    keep_alive: bool
    raw_headers: list[tuple[str, str]] = field(default_factory=list)  # names as sent
    raw_query: str = ""  # as sent, still percent-encoded (signatures are computed over it)
    held_bytes: int = 0  # of the server's MemoryBudget, given back once answered
    started: float = 0.0  # time.monotonic() when the whole request had arrived
    # Filled in while it is answered, for whoever observes requests (access log, metrics):
    door: str = ""  # the dialect that answered it ("native", "sqs", "yaq", "pubsub")
    route: str = ""  # a low-cardinality name of what it asked (a route kind, an SQS action)
    queue: str = ""  # the queue (or pub/sub name) it addressed, when it named one
    principal: str = ""  # who sent it, once authenticated
    scheme: str = "http"  # "https" on a TLS listener (for the URLs a dialect hands out)
    peer: str = ""  # the client's IP address
    # A large body that went to a sink as it arrived (`BodySinkFor`): `body` is then empty.
    upload: ReceivedBody | None = None

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


class BodyFile(Protocol):
    """A response body left in a file: `size` bytes from `offset` of the file open as `fd`
    (the object's own descriptor, which `close` closes)."""

    fd: int
    offset: int
    size: int

    def close(self) -> None: ...


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    # Runs once the response is handed to the socket (not if the client vanished first).
    after: Callable[[], Awaitable[None]] | None = None
    # The body is this file's bytes (`body` is then empty): sent from it, never held, and
    # closed by the runtime once sent (or not: the client left).
    file: BodyFile | None = None


@dataclass(slots=True)
class StreamResponse:
    """A chunked response. `trailers` may be filled in by `body` before it finishes."""

    status: int
    body: AsyncIterator[bytes]
    headers: list[tuple[str, str]] = field(default_factory=list)
    trailer_names: tuple[str, ...] = ()
    trailers: list[tuple[str, str]] = field(default_factory=list)


class Upgraded(Protocol):
    """What takes a connection over once it switched protocols (after the 101). It writes to
    the transport it is given, and closes or aborts it when done."""

    def start(self, transport: asyncio.Transport, received: bytes) -> None:
        """The 101 is written; `received`: what the client sent after its request, if any."""

    def data_received(self, data: bytes) -> None: ...

    def writable(self, can_write: bool) -> None:
        """The transport's write buffer went over its high-water mark (False) or back under
        its low-water mark (True)."""

    def shutdown(self) -> None:
        """The server drains: say goodbye to the peer and close soon."""

    def connection_lost(self) -> None: ...


@dataclass(slots=True)
class SwitchProtocols:
    """The answer that upgrades a connection: 101 with `headers`, then `connection` has it."""

    headers: list[tuple[str, str]]
    connection: Upgraded


class BodySink(Protocol):
    """Where a request body too large to hold goes as it arrives (a message's file). Its calls
    block: the runtime makes them off the event loop, one at a time, in order."""

    def write(self, pieces: list[bytes]) -> None:
        """Append the pieces, in order."""

    def discard(self) -> None:
        """Undo what was written, unless the application made use of it (idempotent)."""


class ReceivedBody(Protocol):
    """A request's body in its sink (`Request.upload`). The runtime discards the sink once the
    request is answered, whatever became of it: what the application keeps, it has taken
    from the sink by then (e.g. a message file published)."""

    size: int  # the body's bytes (its Content-Length)

    async def written(self) -> BodySink:
        """The sink, once the whole body is in it; raises what writing it raised."""
        ...


Handler = Callable[[Request], Awaitable[Response | StreamResponse | SwitchProtocols]]
# How a fast handler answers later: once, on the event loop, with the response or with the
# unexpected error it met (logged, then answered 500). False: the connection had gone away
# and nothing was sent (what the answer handed over can be given back).
Respond = Callable[[Response | BaseException], bool]


class Later:
    """What a fast handler returns when it will answer through `respond`, and what the
    connection holds as its `_task` meanwhile. `LATER` has nothing to cancel: if the client
    goes away, the work finishes all the same and its answer is dropped. A handler whose answer
    may wait (a long poll) returns a Later of its own instead, whose `cancel` (called when the
    client goes away) ends the wait."""

    __slots__ = ()

    def cancel(self) -> bool:
        return False


LATER = Later()
# A synchronous first look at a request: its response now, LATER (it calls `respond`), or None
# to leave the request to the Handler. It spares the common requests a Task, a chain of
# coroutines and a future (each hop through the event loop costs microseconds). Its responses
# have no `after`.
FastHandler = Callable[[Request, Respond], "Response | Later | None"]
# A look at a request's head before its body is read: (method, path, headers, Content-Length)
# -> the response that refuses it (e.g. a body over its queue's limit), or None to read it.
BodyCheck = Callable[[str, str, dict[str, str], int], "Response | None"]
# A second look at a head whose body is large (past `bodies.STREAM_BODY_BYTES`, within the
# limits): (the request without its body, Content-Length) -> the sink the body is written to as
# it arrives (`Request.upload`), or None to read it into memory as usual.
BodySinkFor = Callable[[Request, int], "BodySink | None"]
# Told of each answered request once its response is handed to the transport (a stream: once
# it ended): (request, status, response body bytes, seconds since the request arrived). The
# access log and the request metrics hang here, so every dialect is seen the same way.
Observe = Callable[[Request, int, int, float], None]
