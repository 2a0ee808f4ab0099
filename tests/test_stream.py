"""The streaming receive (`GET /{queue}/messages` as a WebSocket), against real servers: the
Python client's `Consumer`, a raw wsproto client for what the client never sends, a consumer
SIGKILLed in a subprocess, TLS, credentials, shutdown."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    RejectConnection,
    Request,
    TextMessage,
)

import dirmq
from dirmq import errors
from dirmq.client import AsyncRemoteStore, RemoteStore
from dirmq.wire import stream as wire

from .support.fixtures import serve
from .support.servers import REPO, ServerProcess, start_server
from .test_tls import make_certificates, tls_options

server = serve()


@pytest.fixture
def store(server: ServerProcess) -> Iterator[RemoteStore]:
    with RemoteStore(server.url, timeout_s=10) as remote:
        yield remote


def _fresh(store: RemoteStore, name: str, count: int = 0) -> dirmq.client.RemoteQueue:
    queue = store.create_queue(name)
    queue.purge()
    if count:
        queue.put_many([b"%d" % i for i in range(count)])
    return queue


def _settled(queue: dirmq.client.RemoteQueue, timeout_s: float = 5.0) -> dirmq.QueueStats:
    """The queue's stats once nothing is in flight (or the last seen at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = queue.stats()
        if stats.in_flight == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.02)


def test_exactly_once_across_consumers_that_ack_everything(store: RemoteStore) -> None:
    queue = _fresh(store, "once", 900)
    seen: list[bytes] = []
    lock = threading.Lock()

    def consume() -> None:
        with queue.consume(prefetch=20) as consumer:
            while True:
                message = consumer.get(timeout_s=0.5)
                if message is None:
                    return
                with lock:
                    seen.append(message.body)
                consumer.ack(message)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(seen, key=int) == [b"%d" % i for i in range(900)]
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (0, 0)


def test_iterating_a_remote_queue_streams_and_its_acks_go_over_the_stream(
    store: RemoteStore,
) -> None:
    queue = _fresh(store, "iterate", 50)
    got = []
    for message in queue:
        got.append(message.body)
        assert message.receipt is not None
        queue.ack(message.receipt)
        if len(got) == 50:
            break
    queue.close()  # flushes the buffered acks
    assert got == [b"%d" % i for i in range(50)]
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (0, 0)


def test_credit_bounds_what_is_in_flight_and_acks_return_it(store: RemoteStore) -> None:
    queue = _fresh(store, "credit", 30)
    with queue.consume(prefetch=5) as consumer:
        first = _drain(consumer)
        assert len(first) == 5  # no more than the prefetch, however long we wait
        assert queue.stats().in_flight == 5
        consumer.ack(first[0])
        consumer.ack(first[1])
        second = _drain(consumer)  # the acks are sent before blocking: two slots free
        assert len(second) == 2
        assert [m.body for m in first + second] == [b"%d" % i for i in range(7)]


def test_cumulative_ack_settles_everything_up_to_a_delivery(store: RemoteStore) -> None:
    queue = _fresh(store, "cumulative", 20)
    with queue.consume(prefetch=10) as consumer:
        held = _drain(consumer)
        assert len(held) == 10
        consumer.ack_through(held[6])  # the first seven
        more = _drain(consumer)
        assert len(more) == 7
        stats = queue.stats()
        assert (stats.ready, stats.in_flight) == (3, 10)
        consumer.ack_through(more[-1])
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (3, 0)


def test_nack_and_close_give_messages_back_at_once(store: RemoteStore) -> None:
    queue = _fresh(store, "giveback", 4)
    consumer = queue.consume(prefetch=4, visibility_s=300)
    held = _drain(consumer)
    assert len(held) == 4
    consumer.nack(held[0])
    consumer.ack(held[1])
    consumer.close()  # the ack is flushed first; the other two go back, not in 300 s
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (3, 0)


def test_a_killed_consumer_gives_its_leases_back_at_once(
    server: ServerProcess, store: RemoteStore
) -> None:
    queue = _fresh(store, "killed", 40)
    script = (
        "import sys\n"
        "from dirmq.client import RemoteStore\n"
        "consumer = RemoteStore(sys.argv[1]).queue('killed').consume(prefetch=40, "
        "visibility_s=600)\n"
        "got = [consumer.get(5) for _ in range(40)]\n"
        "print(sum(m is not None for m in got), flush=True)\n"
        "sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script, server.url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "40"
        assert queue.stats().in_flight == 40
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(10)
        if child.stdin is not None:
            child.stdin.close()
        if child.stdout is not None:
            child.stdout.close()
    began = time.monotonic()
    with queue.consume(prefetch=40) as consumer:
        again = _drain(consumer, want=40, timeout_s=5)
        assert sorted(m.body for m in again) == sorted(b"%d" % i for i in range(40))
        assert all(m.receive_count == 2 for m in again)
        consumer.ack_through(again[-1])
    assert time.monotonic() - began < 5  # not the 600 s lease


def test_a_waiting_consumer_is_woken_by_a_publish(store: RemoteStore) -> None:
    queue = _fresh(store, "wake")
    with queue.consume(prefetch=10) as consumer:
        assert consumer.get(timeout_s=0.3) is None

        def publish() -> None:
            time.sleep(0.2)
            queue.put(b"late")

        thread = threading.Thread(target=publish)
        thread.start()
        began = time.monotonic()
        message = consumer.get(timeout_s=5)
        thread.join()
        assert message is not None and message.body == b"late"
        assert time.monotonic() - began < 2
        consumer.ack(message)


def test_deleting_the_queue_ends_its_streams_with_the_error(store: RemoteStore) -> None:
    queue = _fresh(store, "doomed")
    with queue.consume() as consumer:
        assert consumer.get(timeout_s=0.2) is None  # waiting on the empty queue
        store.delete_queue("doomed")
        with pytest.raises(errors.QueueNotFound):
            consumer.get(timeout_s=5)
        assert consumer.closed


def test_a_large_body_streams_whole(store: RemoteStore) -> None:
    queue = _fresh(store, "large")
    body = os.urandom(1024 * 1024)
    queue.put(body, {"Content-Type": "application/x-blob", "X-Attr-Kind": "big"})
    queue.put(b"small")
    with queue.consume(prefetch=2) as consumer:
        first, second = _drain(consumer, want=2, timeout_s=5)
        assert first.body == body
        assert first.headers == {"Content-Type": "application/x-blob", "X-Attr-Kind": "big"}
        assert first.receive_count == 1 and first.lease_deadline_s is not None
        assert second.body == b"small"
        consumer.ack(first)
        consumer.ack(second)


def test_a_missing_queue_and_bad_parameters_are_refused_before_the_upgrade(
    store: RemoteStore,
) -> None:
    with pytest.raises(errors.QueueNotFound):
        store.queue("nosuch-stream").consume()
    with pytest.raises(errors.InvalidArgument, match="prefetch"):
        _fresh(store, "params").consume(prefetch=5000)


def test_the_async_consumer(server: ServerProcess, store: RemoteStore) -> None:
    queue = _fresh(store, "async", 30)

    async def main() -> list[bytes]:
        got = []
        async with AsyncRemoteStore(server.url, timeout_s=10) as remote:
            async with (await remote.queue("async")).consume(prefetch=8) as consumer:
                async for message in consumer:
                    got.append(message.body)
                    await consumer.ack(message)
                    if len(got) == 30:
                        break
                assert await consumer.get(timeout_s=0.2) is None
            consumer = await (await remote.queue("async")).consume()
            queue.put(b"late")
            message = await consumer.get(timeout_s=5)
            assert message is not None
            await consumer.nack(message, delay_s=0)
            await consumer.aclose()
        return got

    assert asyncio.run(main()) == [b"%d" % i for i in range(30)]
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (1, 0)


# -- what the Python client never sends: a raw WebSocket ---------------------------------------
def _raw(server: ServerProcess, path: str) -> tuple[socket.socket, WSConnection]:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    ws = WSConnection(ConnectionType.CLIENT)
    sock.sendall(ws.send(Request(host=host, target=path)))
    while True:
        ws.receive_data(sock.recv(65536))
        for event in ws.events():
            if isinstance(event, AcceptConnection):
                return sock, ws  # frames read with the answer stay in `ws`: see _next_events
            assert not isinstance(event, RejectConnection), event


def _next_events(sock: socket.socket, ws: WSConnection) -> list[Event]:
    """The events wsproto already holds, else those of the next reads. The read that carried
    the handshake's answer may carry the first deliveries too: reading the socket first would
    wait for a frame that has already come."""
    while not (events := list(ws.events())):
        data = sock.recv(65536)
        assert data, "closed without a close frame"
        ws.receive_data(data)
    return events


def _closed_with(sock: socket.socket, ws: WSConnection) -> tuple[int, str, int]:
    """(close code, reason, deliveries seen) once the server closes."""
    deliveries = 0
    while True:
        for event in _next_events(sock, ws):
            if isinstance(event, BytesMessage):
                deliveries += 1
            elif isinstance(event, CloseConnection):
                sock.close()
                return event.code, event.reason or "", deliveries


@pytest.mark.parametrize(
    ("frame", "code", "words"),
    [
        (BytesMessage(data=b"\x00"), 1003, "text (JSON) messages only"),
        (TextMessage(data="{not json"), 1007, "bad settle message"),
        (TextMessage(data='{"ack": [999]}'), 1008, "never delivered"),
        (TextMessage(data='{"ack": 5}'), 1007, "must be a list"),
        (TextMessage(data='{"acknowledge": [1]}'), 1007, "not an object of ack"),
    ],
)
def test_bad_frames_close_with_a_code_and_give_the_messages_back(
    server: ServerProcess,
    store: RemoteStore,
    frame: BytesMessage | TextMessage,
    code: int,
    words: str,
) -> None:
    queue = _fresh(store, "badframes", 3)
    sock, ws = _raw(server, "/badframes/messages?prefetch=3&visibility=600")
    deadline = time.monotonic() + 5
    while queue.stats().in_flight < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    sock.sendall(ws.send(frame))
    got_code, reason, _deliveries = _closed_with(sock, ws)
    assert (got_code, words in reason) == (code, True), reason
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (3, 0)


def test_the_raw_protocol_acks_by_receipt_and_grants_credit(
    server: ServerProcess, store: RemoteStore
) -> None:
    queue = _fresh(store, "raw", 5)
    sock, ws = _raw(server, "/raw/messages?prefetch=1")
    received = []
    while len(received) < 5:
        for event in _next_events(sock, ws):
            assert isinstance(event, BytesMessage)
            tag, message = wire.decode_delivery(bytes(event.data))
            received.append((tag, message))
            if len(received) == 1:
                # One by receipt (returns its slot), and credit for three more at once.
                text = f'{{"ack": ["{message.receipt}"], "credit": 3}}'
                sock.sendall(ws.send(TextMessage(data=text)))
            elif len(received) == 4:
                sock.sendall(ws.send(TextMessage(data='{"ack_through": 4}')))
    assert [tag for tag, _ in received] == [1, 2, 3, 4, 5]
    assert [m.body for _, m in received] == [b"0", b"1", b"2", b"3", b"4"]
    sock.sendall(ws.send(CloseConnection(code=1000)))
    assert _closed_with(sock, ws)[0] == 1000
    stats = _settled(queue)
    assert (stats.ready, stats.in_flight) == (1, 0)  # the fifth went back


def test_handshakes_that_are_not_websockets_get_http_answers(server: ServerProcess) -> None:
    host, port = server.url.removeprefix("http://").split(":")

    def exchange(request: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(request)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer

    head = "GET /badframes/messages HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
    bad_key = exchange(
        (
            head + "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            "Sec-WebSocket-Key: short\r\n\r\n"
        ).encode()
    )
    assert bad_key.startswith(b"HTTP/1.1 400 ") and b"Sec-WebSocket-Key" in bad_key
    key = base64.b64encode(b"0123456789abcdef").decode()
    old = exchange(
        (
            head + f"Connection: Upgrade\r\nSec-WebSocket-Version: 8\r\n"
            f"Sec-WebSocket-Key: {key}\r\n\r\n"
        ).encode()
    )
    assert old.startswith(b"HTTP/1.1 400 ") and b"only 13" in old
    # An upgrade the server does not speak: the request is answered, the connection closed.
    h2c = exchange(
        b"GET /health HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n"
    )
    assert h2c.startswith(b"HTTP/1.1 200 ") and b"Connection: close" in h2c
    post = exchange(
        b"POST /badframes/messages HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nContent-Length: 2\r\n\r\nhi"
    )
    assert post.startswith(b"HTTP/1.1 400 ") and b"upgrades are not supported" in post
    accept = base64.b64encode(hashlib.sha1((key + wire_guid()).encode()).digest())
    ok = (
        head + f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}"
        "\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(ok)
        switched = sock.recv(65536)
    assert switched.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"Sec-WebSocket-Accept: " + accept + b"\r\n" in switched


def wire_guid() -> str:
    return "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


# -- servers of their own ----------------------------------------------------------------------
def test_shutdown_closes_streams_cleanly_and_gives_back(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root")
    try:
        with RemoteStore(server.url) as store:
            queue = _fresh(store, "shutdown", 10)
            consumer = queue.consume(prefetch=10, visibility_s=600)
            held = _drain(consumer)
            assert len(held) == 10
            consumer.ack(held[0])
            consumer.flush()
            time.sleep(0.1)
            outcome: list[object] = []
            reader = threading.Thread(target=lambda: outcome.append(consumer.get(timeout_s=5)))
            reader.start()  # reading: it answers the server's close frame at once
            store.close()  # (an idle keep-alive connection counts as cut by the drain)
            began = time.monotonic()
            assert server.stop() == 0
            assert time.monotonic() - began < 1.5  # not cut after the close timeout
            reader.join(5)
            assert outcome == [None]  # the stream ended, not an error
            assert consumer.closed
            consumer.close()
    finally:
        server.stop()
    assert any(" drained " in line and "cut=0" in line for line in server.lines)
    stats = dirmq.Store(tmp_path / "root").queue("shutdown").stats()
    assert (stats.ready, stats.in_flight) == (9, 0)


def test_credentials_and_tls(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path)
    token, other = "dmq_stream-reader-0123456789abcdef", "dmq_stream-writer-0123456789abcdef"
    credentials = tmp_path / "credentials.toml"
    credentials.write_text(
        "[principals.reader]\n"
        f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
        'read = ["jobs"]\nwrite = ["jobs"]\nadmin = ["jobs"]\n'
        "[principals.writer]\n"
        f'token_sha256 = "{hashlib.sha256(other.encode()).hexdigest()}"\n'
        'write = ["jobs"]\nadmin = ["jobs"]\n'
    )
    credentials.chmod(0o600)
    server = start_server(tmp_path / "root", *tls_options(certs), "--credentials", str(credentials))
    ca = str(certs.ca)
    try:
        with RemoteStore(server.url, cafile=ca, token=token) as store:
            queue = store.create_queue("jobs")
            queue.put(b"over tls")
            with queue.consume() as consumer:
                message = consumer.get(timeout_s=5)
                assert message is not None and message.body == b"over tls"
                consumer.ack(message)
        anonymous = RemoteStore(server.url, cafile=ca, token="")
        with anonymous, pytest.raises(errors.Unauthenticated):  # 401
            dirmq.client.RemoteQueue(anonymous, "jobs").consume()
        writer = RemoteStore(server.url, cafile=ca, token=other)
        with writer, pytest.raises(errors.AccessDenied):  # 403: write, admin, but no read
            writer.queue("jobs").consume()
        untrusting = RemoteStore(server.url, token=token)
        with untrusting, pytest.raises(errors.StorageIOError, match="cafile"):
            dirmq.client.RemoteQueue(untrusting, "jobs").consume()
    finally:
        assert server.stop() == 0


def _drain(
    consumer: dirmq.client.stream.Consumer, want: int | None = None, timeout_s: float = 0.4
) -> list[dirmq.Message]:
    """Every message that comes until none has for `timeout_s` (or `want` came)."""
    got = []
    while want is None or len(got) < want:
        message = consumer.get(timeout_s=timeout_s)
        if message is None:
            break
        got.append(message)
    return got
