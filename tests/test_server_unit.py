"""In-process checks of the server's fast paths against what they replace: response heads
(framing.response_head), the fast publish (the general handler's answer and metrics), and the
deadline sweep that stands in for per-connection timers."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import parse_qsl

import pytest
import uvloop
from hypothesis import given
from hypothesis import strategies as st

import dirmq
from dirmq.server.contract import LATER, Later, Request, Respond, Response, StreamResponse
from dirmq.server.http import HttpServer
from dirmq.server.http_listener import Limits
from dirmq.server.http_wire import Clock, first_values, response_head
from dirmq.server.metrics import Metrics
from dirmq.server.multiprocess import MetricsFiles
from dirmq.wire import framing


@pytest.mark.parametrize("status", [200, 201, 204, 304, 404, 503])
@pytest.mark.parametrize("keep_alive", [True, False])
def test_response_heads_are_framings_bytes(status: int, keep_alive: bool) -> None:
    clock = Clock()
    headers = [("Content-Type", "application/json"), ("X-Attr-Name", "é ü"), ("X-Empty", "")]
    while True:  # the Date is the clock's second: built again if it turned meanwhile
        date = clock.date()
        got = response_head(clock.prefix(status), headers, status, 17, keep_alive)
        if clock.date() == date:
            break
    expected = framing.response_head(
        status,
        [("Date", date), ("Server", "dirmq"), *headers],
        content_length=17,
        keep_alive=keep_alive,
    )
    assert got == expected


@pytest.mark.parametrize("value", ["a\r\nInjected: 1", "a\nb", "a\rb"])
def test_response_heads_refuse_line_breaks(value: str) -> None:
    with pytest.raises(ValueError, match="CR/LF"):
        response_head(Clock().prefix(200), [("X-Attr-A", value)], 200, 0, True)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _ok(request: Request) -> Response:
    return Response(200, b"ok")


def test_idle_connections_time_out() -> None:
    async def main() -> tuple[bool, bool]:
        server = HttpServer(_ok, Limits(idle_timeout_s=0.1))
        idle, busy = _Transport(), _Transport()
        idle_protocol, busy_protocol = server.protocol(), server.protocol()
        idle_protocol.connection_made(idle)
        busy_protocol.connection_made(busy)
        for _ in range(6):  # a request every 50 ms keeps `busy` open
            await asyncio.sleep(0.05)
            busy_protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        return idle.closed, busy.closed

    assert asyncio.run(main()) == (True, False)


def test_a_slow_request_head_gets_408() -> None:
    async def main() -> bytes:
        server = HttpServer(_ok, Limits(header_timeout_s=0.1))
        transport = _Transport()
        protocol = server.protocol()
        protocol.connection_made(transport)
        protocol.data_received(b"GET / HTTP/1.1\r\nHo")
        for _ in range(100):
            await asyncio.sleep(0.01)
            if transport.closed:
                break
        return transport.written

    written = asyncio.run(main())
    assert re.match(rb"HTTP/1\.1 408 ", written), written


# -- query strings and sockets ------------------------------------------------------------------
@given(st.text(alphabet="ab=&%+;2F\u00e9 ", max_size=24))
def test_a_query_reads_as_parse_qsl_reads_it(query: str) -> None:
    """The split that skips parse_qsl for a query with nothing to decode (`?wait=20s`) reads
    every query as parse_qsl does: first value of each name, blanks kept, empty fields
    skipped, `%xx` and `+` decoded."""
    expected: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, errors="surrogateescape"):
        expected.setdefault(name, value)
    assert first_values(query) == expected


def test_every_connection_is_served_without_nagle_delays() -> None:
    """uvloop sets TCP_NODELAY on each TCP transport, accepted or passed in by another worker
    (`connect_accepted_socket`): the server no longer sets it (an answer written in two
    pieces would otherwise wait for the client's delayed ACK, 40 ms)."""

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        server = HttpServer(_ok)
        listener = await loop.create_server(server.protocol, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        _, accepted_writer = await asyncio.open_connection("127.0.0.1", port)
        spare = socket.socket()
        spare.bind(("127.0.0.1", 0))
        spare.listen()
        _, passed_writer = await asyncio.open_connection(*spare.getsockname())
        passed, _ = spare.accept()
        await loop.connect_accepted_socket(server.protocol, passed)
        for _ in range(100):
            if len(server.connections) == 2:
                break
            await asyncio.sleep(0.01)
        options = [
            c._transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            for c in server.connections
            if c._transport is not None
        ]
        for writer in (accepted_writer, passed_writer):
            writer.close()
        listener.close()
        spare.close()
        return options

    options = uvloop.run(main())
    assert len(options) == 2 and all(options), options


# -- the fast path (answers without a Task) ---------------------------------------------------
def _fast_server(later: list[Respond]) -> HttpServer:
    """A server whose fast handler answers `/now` at once, `/later` when the test calls the
    `respond` it appends to `later`, raises for `/boom`, and leaves anything else to the
    ordinary handler."""

    def fast(request: Request, respond: Respond) -> Response | Later | None:
        if request.path == "/now":
            return Response(200, b"now")
        if request.path == "/boom":
            raise RuntimeError("a bug")
        if request.path == "/later":
            later.append(respond)
            return LATER
        if request.path == "/at-once":  # answers through `respond` before returning LATER
            respond(Response(200, b"at once"))
            return LATER
        return None

    return HttpServer(_ok, fast=fast)


def test_fast_answers_keep_pipelined_order_and_fall_back() -> None:
    async def main() -> bytes:
        later: list[Respond] = []
        protocol, transport = _fast_server(later).protocol(), _Transport()
        protocol.connection_made(transport)
        protocol.data_received(
            b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        await asyncio.sleep(0.01)
        assert transport.written == b""  # /later holds every answer behind it
        assert len(later) == 1
        later[0](Response(200, b"later"))
        for _ in range(50):
            await asyncio.sleep(0.005)
            if len(later) == 2:
                break
        later[1](RuntimeError("the store broke"))  # an unexpected error: logged, then a 500
        for _ in range(50):
            await asyncio.sleep(0.005)
            if transport.written.count(b"HTTP/1.1") == 6:
                break
        return transport.written

    written = asyncio.run(main())
    answers = written.split(b"HTTP/1.1 ")[1:]
    bodies = [part.rsplit(b"\r\n\r\n", 1)[-1] for part in answers]
    assert bodies[:3] == [b"later", b"now", b"ok"]
    assert answers[3].startswith(b"500 ")
    assert answers[4].startswith(b"500 ")
    assert bodies[5] == b"now"


def test_a_fast_answer_whose_client_left_is_not_sent() -> None:
    async def main() -> bytes:
        later: list[Respond] = []
        protocol, transport = _fast_server(later).protocol(), _Transport()
        protocol.connection_made(transport)
        protocol.data_received(b"GET /later HTTP/1.1\r\nHost: x\r\n\r\n")
        protocol.connection_lost(None)
        await asyncio.sleep(0.01)
        later[0](Response(200, b"too late"))
        return transport.written

    assert asyncio.run(main()) == b""


def test_a_fast_answer_given_before_the_handler_returns_frees_the_connection() -> None:
    async def main() -> tuple[bytes, bool]:
        later: list[Respond] = []
        server = _fast_server(later)
        protocol, transport = server.protocol(), _Transport()
        protocol.connection_made(transport)
        protocol.data_received(
            b"GET /at-once HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /at-once HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        await asyncio.sleep(0.01)
        protocol.close_if_idle()  # idle again: a drain may close it
        return transport.written, transport.closed

    written, closed = asyncio.run(main())
    bodies = [part.rsplit(b"\r\n\r\n", 1)[-1] for part in written.split(b"HTTP/1.1 ")[1:]]
    assert bodies == [b"at once", b"at once", b"now"]
    assert closed


async def _answers(transport: _Transport, count: int, budget_s: float = 2.0) -> None:
    """Wait until `count` responses were written (or the budget is spent)."""
    for _ in range(int(budget_s / 0.01)):
        if transport.written.count(b"HTTP/1.1 ") >= count:
            return
        await asyncio.sleep(0.01)


def test_a_fast_publish_whose_answer_cannot_be_built_gets_a_500(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, metrics_files: MetricsFiles
) -> None:
    """A bug while building a stored publish's response still answers, and the connection
    goes on with its next request."""
    from dirmq.dialects.native import handlers
    from dirmq.dialects.native.app import NativeApp
    from dirmq.server.broker import Broker

    async def main() -> tuple[bytes, int]:
        store = dirmq.Store(tmp_path / "root")
        store.create_queue("q")
        metrics = Metrics(metrics_files, str(store.root))
        broker = Broker(store, counts=metrics)

        def broken(*_args: object) -> None:
            raise RuntimeError("a bug building the answer")

        monkeypatch.setattr(handlers, "published_response", broken)
        app = NativeApp(broker, metrics)
        protocol, transport = HttpServer(app, fast=app.fast).protocol(), _Transport()
        protocol.connection_made(transport)
        publish = b"POST /q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na"
        protocol.data_received(publish + publish)
        await _answers(transport, 2)
        broker.close()
        ready = store.queue("q").stats().ready
        store.close()
        return transport.written, ready

    written, ready = asyncio.run(main())
    assert [a[:3] for a in written.split(b"HTTP/1.1 ")[1:]] == [b"500", b"500"]
    assert ready == 2  # stored: only the answer failed


def test_a_plain_publish_answers_as_the_general_path_does(
    tmp_path: Path, metrics_files: MetricsFiles
) -> None:
    """The same publish through the fast path and through `publish` (an option forces it):
    same status, same headers but the id, same body shape, same metrics."""
    from dirmq.dialects.native.app import NativeApp
    from dirmq.server.broker import Broker
    from dirmq.server.dialect import Router

    async def main() -> tuple[list[bytes], bytes, int]:
        store = dirmq.Store(tmp_path / "root")
        store.create_queue("q")
        metrics = Metrics(metrics_files, str(store.root))
        broker = Broker(store, counts=metrics)
        app = NativeApp(broker, metrics)
        router = Router([app], observe=metrics.observe)
        server = HttpServer(router, fast=router.fast, observe=router.observe)
        protocol, transport = server.protocol(), _Transport()
        protocol.connection_made(transport)
        protocol.data_received(
            b"POST /q/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\na"
            b"POST /q/messages HTTP/1.1\r\nHost: x\r\nX-Delay: 0\r\nContent-Length: 1\r\n\r\nb"
            b"POST /nope/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nc"
        )
        await _answers(transport, 3)
        broker.close()
        depth = store.queue("q").stats().ready
        store.close()
        return transport.written.split(b"HTTP/1.1 ")[1:], metrics.render(), depth

    answers, exposition, depth = asyncio.run(main())
    ids = [re.sub(rb"[0-9a-f]{8,}[-0-9a-f]*", b"ID", a) for a in answers]
    date = re.compile(rb"Date: [^\r]*")
    assert date.sub(b"", ids[0]) == date.sub(b"", ids[1])
    assert ids[0].startswith(b"201 Created")
    assert answers[2].startswith(b"404 ")
    assert depth == 2
    assert b"\ndirmq_messages_published_total 2.0\n" in exposition
    counted = b'dirmq_http_requests_total{door="native",method="POST",route="messages",status='
    assert counted + b'"201"} 2.0' in exposition
    assert counted + b'"404"} 1.0' in exposition


def test_observers_see_every_answer_fast_slow_streamed_and_refused() -> None:
    """The access log and the request metrics rest on `observe`: each answered request once,
    with its status and the body bytes sent, whichever way it was answered."""
    seen: list[tuple[str, str, int, int]] = []

    def observe(request: Request, status: int, sent: int, seconds: float) -> None:
        assert seconds >= 0
        seen.append((request.method, request.path, status, sent))

    async def pieces() -> AsyncIterator[bytes]:
        yield b"abc"
        yield b"de"

    async def handler(request: Request) -> Response | StreamResponse:
        if request.path == "/stream":
            return StreamResponse(200, pieces())
        return Response(201, b"slow!")

    def fast(request: Request, respond: Respond) -> Response | Later | None:
        return Response(200, b"now") if request.path == "/now" else None

    def body_check(method: str, path: str, headers: dict[str, str], length: int) -> None:
        return None

    async def main() -> None:
        server = HttpServer(
            handler, Limits(max_body_bytes=10), fast=fast, body_check=body_check, observe=observe
        )
        protocol, transport = server.protocol(), _Transport()
        protocol.connection_made(transport)
        protocol.data_received(
            b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
            b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n"
        )
        for _ in range(100):
            await asyncio.sleep(0.005)
            if len(seen) == 4:
                break

    asyncio.run(main())
    assert seen[:3] == [
        ("GET", "/now", 200, 3),
        ("POST", "/slow", 201, 5),
        ("GET", "/stream", 200, 5),
    ]
    method, path, status, sent = seen[3]
    assert (method, path, status) == ("POST", "/big", 413) and sent > 0
    assert len(seen) == 4
