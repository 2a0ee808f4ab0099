"""The native HTTP API end to end, against a real `dirmq serve` on 127.0.0.1 port 0."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

import dirmq
from dirmq.client import RemoteStore

from .support.fixtures import http_client, serve
from .support.servers import ServerProcess

server = serve("--header-timeout", "1", "--max-body-bytes", "1048576", "--max-header-bytes", "4096")


http = http_client(scope="function")


_names = iter(range(10**6))


@pytest.fixture
def queue(http: httpx.Client) -> str:
    name = f"s{next(_names)}/work"
    assert http.put(f"/{name}").status_code == 201
    return name


def raw(server: ServerProcess, data: bytes, *, pause_s: float = 0.0) -> bytes:
    """Send raw bytes on a fresh connection and return everything the server answers."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        if pause_s:
            time.sleep(pause_s)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


# -- queues --------------------------------------------------------------------------------
def test_queue_lifecycle_and_status_codes(http: httpx.Client) -> None:
    assert http.get("/life/q").status_code == 404
    created = http.put("/life/q", json={"visibility_timeout_s": 5, "max_receives": 3})
    assert created.status_code == 201
    assert created.json()["config"]["visibility_timeout_s"] == 5
    again = http.put("/life/q", json={"delay_s": 1})
    assert again.status_code == 200 and again.json()["config"]["delay_s"] == 1
    assert http.put("/life/q").status_code == 200
    info = http.get("/life/q").json()
    assert info["name"] == "life/q" and info["stats"]["total"] == 0
    assert "life/q" in http.get("/").json()["queues"]
    assert http.get("/", params={"prefix": "life/"}).json()["queues"] == ["life/q"]
    assert http.delete("/life/q").status_code == 204
    assert http.delete("/life/q").status_code == 404


def test_mq_readme_queue_name_works(http: httpx.Client) -> None:
    assert http.put("/queue001").status_code == 201
    assert http.get("/queue001").status_code == 200
    assert http.delete("/queue001").status_code == 204


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[1, 2]",
        b'{"visibility_timeout_s": -1}',
        b'{"durability": "x"}',
        b'{"bogus": 1}',
    ],
)
def test_bad_queue_configuration_is_400(http: httpx.Client, body: bytes) -> None:
    response = http.put("/badconf", content=body)
    assert response.status_code == 400
    assert response.json()["message"]
    assert http.get("/badconf").status_code == 404


def test_deleting_a_queue_removes_in_flight_messages(http: httpx.Client, queue: str) -> None:
    http.post(f"/{queue}/messages", content=b"x")
    assert http.get(f"/{queue}/messages").status_code == 200
    assert http.delete(f"/{queue}").status_code == 204
    assert http.put(f"/{queue}").status_code == 201
    assert http.get(f"/{queue}").json()["stats"]["total"] == 0


# -- publishing and receiving ---------------------------------------------------------------
def test_publish_and_receive_keep_headers(http: httpx.Client, queue: str) -> None:
    headers = {
        "Content-Type": "text/plain; charset=UTF-8",
        "Content-Encoding": "identity",
        "X-Attr-Colour": "blue",
        "User-Agent": "not stored",
    }
    posted = http.post(f"/{queue}/messages", content=b"tuna", headers=headers)
    assert posted.status_code == 201
    message_id = posted.headers["X-Message-Id"]
    assert posted.json() == {"id": message_id}
    got = http.get(f"/{queue}/messages")
    assert got.status_code == 200 and got.content == b"tuna"
    assert got.headers["X-Message-Id"] == message_id
    assert got.headers["Content-Type"] == "text/plain; charset=UTF-8"
    assert got.headers["Content-Encoding"] == "identity"
    assert got.headers["X-Attr-Colour"] == "blue"
    assert got.headers["X-Receive-Count"] == "1"
    assert "User-Agent" not in dict(got.headers) or got.headers.get("user-agent") is None
    assert http.get(f"/{queue}/messages").status_code == 204


def test_publish_to_a_missing_queue_is_404_and_strands_nothing(
    http: httpx.Client, server: ServerProcess
) -> None:
    response = http.post("/nowhere/messages", content=b"lost?")
    assert response.status_code == 404
    assert not (server.root / "nowhere").exists()


def test_message_too_large_is_413(http: httpx.Client) -> None:
    http.put("/small", json={"max_message_bytes": 10})
    assert http.post("/small/messages", content=b"x" * 11).status_code == 413
    assert http.post("/small/messages", content=b"x" * 10).status_code == 201
    assert http.get("/small").json()["stats"]["ready"] == 1


def test_delay_via_query_or_header(http: httpx.Client, queue: str) -> None:
    http.post(f"/{queue}/messages", content=b"q", params={"delay": "300ms"})
    http.post(f"/{queue}/messages", content=b"h", headers={"X-Delay": "0.3"})
    assert http.get(f"/{queue}/messages").status_code == 204
    first = http.get(f"/{queue}/messages", params={"wait": "3s"})
    second = http.get(f"/{queue}/messages", params={"wait": "3s"})
    assert {first.content, second.content} == {b"q", b"h"}


@pytest.mark.parametrize("value", ["soon", "-1s", "1x", "5 s", "1e400", ""])
def test_bad_durations_are_400(http: httpx.Client, queue: str, value: str) -> None:
    response = http.get(f"/{queue}/messages", params={"wait": value})
    assert response.status_code == 400
    assert "wait" in response.json()["message"]


def test_go_durations(http: httpx.Client, queue: str) -> None:
    started = time.monotonic()
    assert http.get(f"/{queue}/messages", params={"wait": "1h2m"[:0] + "250ms"}).status_code == 204
    assert 0.2 < time.monotonic() - started < 2
    http.post(f"/{queue}/messages", content=b"x")
    got = http.get(f"/{queue}/messages", params={"visibility": "1m30s"})
    assert float(got.headers["X-Lease-Deadline"]) - time.time() == pytest.approx(90, abs=5)


def test_batch_publish_multipart_and_receive_multipart(http: httpx.Client, queue: str) -> None:
    boundary = "b0undary"
    parts = [
        (b"one", "text/plain"),
        (bytes(range(256)), "application/octet-stream"),
        (b"three\r\n--b0und", "text/plain"),
    ]
    body = (
        b"".join(
            f"--{boundary}\r\nContent-Type: {ct}\r\nX-Attr-N: {i}\r\n\r\n".encode() + data + b"\r\n"
            for i, (data, ct) in enumerate(parts)
        )
        + f"--{boundary}--\r\n".encode()
    )
    posted = http.post(
        f"/{queue}/messages",
        content=body,
        headers={"Content-Type": f"multipart/mixed; boundary={boundary}"},
    )
    assert posted.status_code == 201
    ids = posted.json()["ids"]
    assert len(ids) == 3
    with RemoteStore(str(http.base_url)) as remote:
        got = remote.queue(queue).get(10)
    assert [m.body for m in got] == [p[0] for p in parts]
    assert [m.headers["X-Attr-N"] for m in got] == ["0", "1", "2"]
    assert [m.id for m in got] == ids


def test_batch_publish_json_lines(http: httpx.Client, queue: str) -> None:
    lines = [
        {"body": "plain text", "headers": {"Content-Type": "text/plain"}},
        {"body_base64": "AAEC", "delay": "0s"},
    ]
    body = "\n".join(json.dumps(line) for line in lines).encode()
    posted = http.post(
        f"/{queue}/messages", content=body, headers={"Content-Type": "application/x-ndjson"}
    )
    assert posted.status_code == 201 and len(posted.json()["ids"]) == 2
    response = http.get(f"/{queue}/messages", params={"max": "5"})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("multipart/mixed")
    assert b"plain text" in response.content and b"\x00\x01\x02" in response.content


@pytest.mark.parametrize(
    "body",
    [b'{"body": 1}', b"not json", b'{"body_base64": "!!!"}', b'{"body": "x", "headers": [1]}'],
)
def test_bad_batches_are_400_and_store_nothing(http: httpx.Client, queue: str, body: bytes) -> None:
    response = http.post(
        f"/{queue}/messages",
        content=b'{"body": "ok"}\n' + body,
        headers={"Content-Type": "application/x-ndjson"},
    )
    assert response.status_code == 400
    assert http.get(f"/{queue}").json()["stats"]["total"] == 0


def test_ack_by_receipt_and_stale_receipt_is_409(http: httpx.Client, queue: str) -> None:
    http.post(f"/{queue}/messages", content=b"x")
    first = http.get(f"/{queue}/messages", params={"visibility": "0.2"})
    receipt = first.headers["X-Receipt"]
    time.sleep(0.3)
    second = http.get(f"/{queue}/messages")
    assert second.headers["X-Receive-Count"] == "2"
    stale = http.delete(f"/{queue}/messages/{receipt}")
    assert stale.status_code == 409 and stale.json()["error"] == "StaleReceipt"
    assert http.delete(f"/{queue}/messages/{second.headers['X-Receipt']}").status_code == 204


def test_delete_by_id_mq_semantics(http: httpx.Client, queue: str) -> None:
    message_id = http.post(f"/{queue}/messages", content=b"x").headers["X-Message-Id"]
    assert http.get(f"/{queue}/messages/{message_id}").content == b"x"  # peek
    assert http.get(f"/{queue}/messages").status_code == 200  # leased by someone
    assert http.delete(f"/{queue}/messages/{message_id}").status_code == 204
    assert http.delete(f"/{queue}/messages/{message_id}").status_code == 404
    assert http.get(f"/{queue}/messages/{message_id}").status_code == 404


def test_nack_extend_dead_letter(http: httpx.Client) -> None:
    http.put("/ops/dlq")
    http.put("/ops/q", json={"dead_letter_queue": "ops/dlq"})
    http.post("/ops/q/messages", content=b"x")
    receipt = http.get("/ops/q/messages").headers["X-Receipt"]
    assert http.post(f"/ops/q/messages/{receipt}/nack", params={"delay": "0"}).status_code == 204
    receipt = http.get("/ops/q/messages", params={"visibility": "0.3"}).headers["X-Receipt"]
    assert (
        http.post(f"/ops/q/messages/{receipt}/extend", params={"visibility": "30s"}).status_code
        == 204
    )
    time.sleep(0.4)
    assert http.get("/ops/q/messages").status_code == 204, "extend kept the lease"
    assert http.post(f"/ops/q/messages/{receipt}/extend").status_code == 400
    assert http.post(f"/ops/q/messages/{receipt}/dead-letter").status_code == 204
    assert http.get("/ops/dlq/messages").content == b"x"
    assert http.post("/ops/q/messages/nonsense/nack").status_code == 400


def test_purge_and_browse(http: httpx.Client, queue: str) -> None:
    for i in range(5):
        http.post(f"/{queue}/messages", content=f"m{i}".encode())
    browsed = http.get(f"/{queue}/messages", params={"peek": "1", "max": "3"}).json()
    assert [m["body"] for m in browsed["messages"]] == ["m0", "m1", "m2"]
    assert http.delete(f"/{queue}/messages").json() == {"purged": 5}
    assert http.get(f"/{queue}").json()["stats"]["total"] == 0


def test_method_not_allowed_lists_allowed_methods(http: httpx.Client, queue: str) -> None:
    response = http.patch(f"/{queue}/messages")
    assert response.status_code == 405
    assert response.headers["Allow"] == "DELETE, GET, POST"


def test_capacity_timeout_is_504(http: httpx.Client) -> None:
    http.put("/cap", json={"capacity": 1})
    assert http.post("/cap/messages", content=b"1").status_code == 201
    started = time.monotonic()
    full = http.post("/cap/messages", content=b"2", params={"timeout": "300ms"})
    assert full.status_code == 504 and full.json()["error"] == "QueueFull"
    assert time.monotonic() - started >= 0.25


# -- long polling ----------------------------------------------------------------------------
def test_long_poll_is_woken_by_a_library_publish_in_another_process(
    http: httpx.Client, server: ServerProcess, queue: str
) -> None:
    store = f"dirmq.Store({str(server.root)!r})"
    code = f"import dirmq, time; time.sleep(0.5); {store}.queue({queue!r}).put(b'hello')"
    publisher = subprocess.Popen([sys.executable, "-c", code])
    started = time.monotonic()
    got = http.get(f"/{queue}/messages", params={"wait": "10s"})
    waited = time.monotonic() - started
    publisher.wait(timeout=30)
    assert got.status_code == 200 and got.content == b"hello"
    assert waited < 3


def test_long_poll_is_woken_by_a_cli_publish(
    http: httpx.Client, server: ServerProcess, queue: str
) -> None:
    def publish() -> None:
        time.sleep(0.3)
        subprocess.run(
            [sys.executable, "-m", "dirmq", "put", "--root", str(server.root), queue],
            input=b"from the cli",
            check=True,
            capture_output=True,
        )

    thread = threading.Thread(target=publish)
    thread.start()
    got = http.get(f"/{queue}/messages", params={"wait": "10s"})
    thread.join()
    assert got.content == b"from the cli"


def test_long_poll_times_out_with_204(http: httpx.Client, queue: str) -> None:
    started = time.monotonic()
    assert http.get(f"/{queue}/messages", params={"wait": "0.5"}).status_code == 204
    assert 0.4 < time.monotonic() - started < 3


def test_many_long_polls_each_get_one_message(server: ServerProcess, queue: str) -> None:
    results: list[bytes] = []
    lock = threading.Lock()

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            response = client.get(f"/{queue}/messages", params={"wait": "10s"})
            with lock:
                results.append(response.content)

    threads = [threading.Thread(target=poll) for _ in range(20)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    with httpx.Client(base_url=server.url) as client:
        for i in range(20):
            client.post(f"/{queue}/messages", content=f"m{i}".encode())
    for t in threads:
        t.join()
    assert sorted(results) == sorted(f"m{i}".encode() for i in range(20))


# -- hostile input ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path",
    [
        "/%2e%2e/etc/messages",
        "/a/%2E%2E/b",
        "/..%2f..%2fx",
        "/@ready/messages",
        "/a%00b",
        "/%ff%fe",
    ],
)
def test_traversal_attempts_are_400(http: httpx.Client, server: ServerProcess, path: str) -> None:
    assert http.put(path).status_code == 400
    assert not (server.root.parent / "etc").exists()


def test_oversize_headers_are_431(server: ServerProcess) -> None:
    request = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n"
    assert status_of(raw(server, request)) == 431


def test_oversize_body_is_413_before_it_is_read(server: ServerProcess) -> None:
    request = b"POST /big/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 5000000\r\n\r\n"
    assert status_of(raw(server, request)) == 413


def test_chunked_oversize_body_is_413(
    server: ServerProcess, http: httpx.Client, queue: str
) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(40):
            yield b"x" * 65536

    with pytest.raises(httpx.HTTPError):
        response = http.post(f"/{queue}/messages", content=chunks())
        assert response.status_code == 413
        raise httpx.RemoteProtocolError("answered")
    assert http.get(f"/{queue}").json()["stats"]["total"] == 0


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x01\x02\x03\r\n\r\n",
        b"GET / HTTP/9.9\r\n\r\n",
        b"HELLO\r\n\r\n",
        b"POST /q/messages HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\n\r\n",
    ],
)
def test_garbage_gets_400_and_the_server_keeps_serving(
    server: ServerProcess, http: httpx.Client, garbage: bytes
) -> None:
    answer = raw(server, garbage)
    assert status_of(answer) == 400
    assert http.get("/health").json() == {"status": "ok"}


def test_slowloris_gets_408(server: ServerProcess, http: httpx.Client) -> None:
    started = time.monotonic()
    answer = raw(server, b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ", pause_s=0)
    assert status_of(answer) == 408
    assert time.monotonic() - started < 5
    assert http.get("/health").status_code == 200


def test_pipelined_requests_are_answered_in_order(server: ServerProcess, queue: str) -> None:
    requests = (
        b"".join(
            f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nm{i}".encode()
            for i in range(5)
        )
        + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    answer = raw(server, requests)
    assert answer.count(b"HTTP/1.1 201 Created") == 5
    assert answer.rstrip().endswith(b'{"status": "ok"}')


def test_expect_100_continue(server: ServerProcess, queue: str) -> None:
    request = (
        f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        "Content-Length: 3\r\nConnection: close\r\n\r\nabc"
    ).encode()
    answer = raw(server, request)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created")


# -- server paths ------------------------------------------------------------------------------
def test_health_metrics_openapi(http: httpx.Client, queue: str) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    http.post(f"/{queue}/messages", content=b"x")
    metrics = http.get("/metrics")
    assert metrics.headers["Content-Type"].startswith("text/plain")
    text = metrics.text
    assert f'dirmq_queue_messages{{queue="{queue}",state="ready"}} 1.0' in text
    assert "dirmq_http_request_duration_seconds_bucket" in text
    assert "dirmq_messages_published_total" in text
    spec = http.get("/openapi.json").json()
    assert spec["openapi"].startswith("3.")
    assert http.post("/health").status_code == 405


def test_queue_names_are_percent_decoded(http: httpx.Client, server: ServerProcess) -> None:
    assert http.put("/snazzy%20party").status_code == 201
    assert (server.root / "snazzy party" / "@queue.json").exists()


def test_library_sees_server_messages_and_back(
    http: httpx.Client, server: ServerProcess, queue: str
) -> None:
    http.post(f"/{queue}/messages", content=b"from http")
    local = dirmq.Store(server.root).queue(queue)
    message = local.get_one()
    assert message is not None and message.body == b"from http"
    local.ack(message.receipt or "")
    local.put(b"from the library")
    assert http.get(f"/{queue}/messages").content == b"from the library"


def test_server_paths_are_not_queues(http: httpx.Client) -> None:
    assert http.put("/health").status_code == 405
    assert http.get("/nothing-here/messages").status_code == 404
