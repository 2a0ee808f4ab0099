"""In-process checks of the server's fast paths against what they replace: response heads
(framing.response_head), request metrics (prometheus-client's Counter and Histogram), and the
deadline sweep that stands in for per-connection timers."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

import dirmq
from dirmq.server.http import HttpServer, Limits, Request, Response, _Clock, _response_head
from dirmq.server.metrics import LATENCY_BUCKETS, Metrics
from dirmq.wire import framing


@pytest.mark.parametrize("status", [200, 201, 204, 304, 404, 503])
@pytest.mark.parametrize("keep_alive", [True, False])
def test_response_heads_are_framings_bytes(status: int, keep_alive: bool) -> None:
    clock = _Clock()
    headers = [("Content-Type", "application/json"), ("X-Attr-Name", "é ü"), ("X-Empty", "")]
    date = clock.date()
    expected = framing.response_head(
        status,
        [("Date", date), ("Server", "dirmq"), *headers],
        content_length=17,
        keep_alive=keep_alive,
    )
    assert _response_head(clock.prefix(status), headers, status, 17, keep_alive) == expected


@pytest.mark.parametrize("value", ["a\r\nInjected: 1", "a\nb", "a\rb"])
def test_response_heads_refuse_line_breaks(value: str) -> None:
    with pytest.raises(ValueError, match="CR/LF"):
        _response_head(_Clock().prefix(200), [("X-Attr-A", value)], 200, 0, True)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_request_metrics_read_as_prometheus_clients_would(tmp_path: Path) -> None:
    metrics = Metrics(dirmq.Store(tmp_path / "root"))
    registry = CollectorRegistry()
    requests = Counter(
        "dirmq_http_requests",
        "HTTP requests answered",
        ["route", "method", "status"],
        registry=registry,
    )
    latency = Histogram(
        "dirmq_http_request_duration_seconds",
        "Time to answer a request (long polls included)",
        ["route", "method"],
        registry=registry,
        buckets=LATENCY_BUCKETS,
    )
    published = Counter(
        "dirmq_messages_published", "Messages published", ["queue"], registry=registry
    )
    answers = [
        ("messages", "POST", 201, 0.0004),
        ("messages", "POST", 201, 0.0005),  # on a bound: counted in it (le)
        ("messages", "POST", 404, 0.003),
        ("queue", "GET", 200, 31.0),  # past the last bound: +Inf only
        ("messages", "GET", 204, 0.0),
    ]
    for route, method, status, seconds in answers:
        metrics.answered(route, method, status, seconds)
        requests.labels(route, method, str(status)).inc()
        latency.labels(route, method).observe(seconds)
    metrics.count("published", "a/b", 3)
    metrics.count("published", "a/b")
    published.labels("a/b").inc(4)
    families = ("dirmq_http_request", "dirmq_messages_published")
    ours = [line for line in _without_created(metrics.render()) if any(f in line for f in families)]
    assert ours == _without_created(generate_latest(registry))
    created = [line for line in metrics.render().decode().splitlines() if "_created{" in line]
    assert any(line.startswith("dirmq_http_request_duration_seconds_created") for line in created)
    assert any(line.startswith("dirmq_messages_published_created") for line in created)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

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
