"""Percent-decoded query strings and paths that are not UTF-8: a clean 400 on every HTTP door
(native, yaq, pub/sub), never U+FFFD stored as if sent, never a 500."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

from .support.fixtures import serve
from .support.servers import ServerProcess

server = serve(yaq=True)


def send(url: str, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
    """`target` exactly as written (http.client does not re-quote it)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request(method, target, body=body if method in ("POST", "PUT") else None)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def ready(server: ServerProcess, queue: str) -> int:
    status, body = send(server.url, "GET", f"/{queue}")
    assert status == 200, body
    return int(json.loads(body)["stats"]["ready"])


def test_a_native_query_value_not_utf8_is_refused_and_nothing_stored(
    server: ServerProcess,
) -> None:
    assert send(server.url, "PUT", "/orders", b"{}")[0] == 201
    for target in (
        "/orders/messages?dedup=%FF%FE",  # was stored with dedup id U+FFFD U+FFFD
        "/orders/messages?group=caf%E9",  # Latin-1, not UTF-8
        "/orders/messages?%FF=1",
    ):
        status, body = send(server.url, "POST", target, b"hello")
        assert status == 400, (target, body)
        error = json.loads(body)
        assert error["error"] == "InvalidArgument"
        assert "not valid UTF-8" in error["message"], error
    assert ready(server, "orders") == 0
    status, body = send(server.url, "GET", "/?prefix=%C3")  # a truncated sequence
    assert status == 400 and b"not valid UTF-8" in body, body
    # Valid UTF-8 still passes.
    assert send(server.url, "POST", "/orders/messages?dedup=caf%C3%A9", b"hello")[0] == 201
    assert ready(server, "orders") == 1


def test_a_pubsub_query_value_not_utf8_is_refused(server: ServerProcess) -> None:
    status, body = send(server.url, "POST", "/@pubsub/publish?channel=news&subject=%FF", b"x")
    assert status == 400, body
    assert "not valid UTF-8" in json.loads(body)["message"]


@pytest.mark.parametrize(
    "target",
    [
        "/@pubsub/retained?channel=news&channel=%FF",  # a repeat: not in the first values
        "/@pubsub/retained?subject=a&subject=caf%E9",
        "/@pubsub/subscribe?channel=news&channel=%FF",
    ],
)
def test_a_repeated_pubsub_value_not_utf8_is_refused(server: ServerProcess, target: str) -> None:
    status, body = send(server.url, "GET", target)
    assert status == 400, body
    assert "not valid UTF-8" in json.loads(body)["message"]


def test_a_yaq_query_value_not_utf8_is_refused(server: ServerProcess) -> None:
    assert server.yaq_url is not None
    status, body = send(server.yaq_url, "POST", "/jobs?timeout=%FF", b"x")
    assert status == 400, body
    assert b"not valid UTF-8" in body


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("GET", "/%FF"),
        ("PUT", "/%FF"),
        ("POST", "/%FF/messages"),  # the fast publish path, and the Content-Length check
        ("GET", "/%FF/messages"),
        ("GET", "/orders/messages/%FF"),
        ("DELETE", "/orders/messages/%FF%FE?receipt=x"),
        ("POST", "/orders/messages/%FF/nack"),
        ("GET", "/@pubsub/subscriptions/%FF"),
        ("POST", "/@pubsub/subscriptions/%FF/deliveries/%FF/ack"),
    ],
)
def test_a_native_or_pubsub_path_not_utf8_is_400(
    server: ServerProcess, method: str, target: str
) -> None:
    status, body = send(server.url, method, target, b"x")
    assert status == 400, body
    assert b"UTF-8" in body


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_yaq_path_not_utf8_is_400(server: ServerProcess, method: str) -> None:
    assert server.yaq_url is not None
    status, body = send(server.yaq_url, method, "/%FF%FE", b"x")
    assert status == 400, body
    assert b"UTF-8" in body
