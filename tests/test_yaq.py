"""The yaq dialect (`dirmq serve --yaq-listen`) against a real server: first the yaq README's curl
session, step by step, then each promise of its REST API. docs/yaq.md says how we read the
README where it is silent or contradicts itself.

httpx is the client where it can be; a plain socket read with httptools where we need what
httpx hides: trailers, chunk boundaries, a response still streaming, a client that vanishes.
"""

from __future__ import annotations

import gzip
import re
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email import message_from_bytes, policy
from pathlib import Path
from urllib.parse import urlsplit

import httptools
import httpx
import pytest

import dirmq

from .support.fixtures import serve
from .support.servers import ServerProcess, start_server

FORM = "application/x-www-form-urlencoded"  # what `curl --data` sends
TEXT = "text/plain; charset=UTF-8"  # what the README's `cat` shows
TRAILER = "x-next-message-status"
STEP_S = 5.0  # the longest any one step may wait for the server
ONE_CONNECTION = httpx.Limits(max_connections=1)


# -- a raw HTTP/1.1 client ----------------------------------------------------------------------
class RawResponse:
    """One response read off a plain socket with httptools, as far as it has arrived."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-case names
        self.trailers: dict[str, str] = {}
        self.body = bytearray()  # de-chunked
        self.at_chunk_end = True  # the body so far ends where a chunk ended
        self.complete = False
        self._head_done = False
        self._parser = httptools.HttpResponseParser(self)

    # httptools callbacks; fields after the head are trailer fields
    def on_header(self, name: bytes, value: bytes) -> None:
        fields = self.trailers if self._head_done else self.headers
        fields[name.decode("latin-1").lower()] = value.decode("utf-8")

    def on_headers_complete(self) -> None:
        self._head_done = True
        self.status = self._parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        self.body += data
        self.at_chunk_end = False

    def on_chunk_complete(self) -> None:
        self.at_chunk_end = True

    def on_message_complete(self) -> None:
        self.complete = True

    def read_until(self, done: Callable[[], bool], timeout_s: float = STEP_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"stuck after {bytes(self.body)[-300:]!r}")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(256 * 1024)
            except TimeoutError:
                continue
            if not data:
                raise AssertionError(f"the server hung up after {bytes(self.body)[-300:]!r}")
            self._parser.feed_data(data)

    def read_head(self) -> None:
        self.read_until(lambda: self._head_done)

    def read_all(self, timeout_s: float = STEP_S) -> None:
        self.read_until(lambda: self.complete, timeout_s)

    def silent(self, seconds: float) -> bool:
        """True if the server sends nothing more for `seconds` (e.g. a blocked dequeue)."""
        readable, _, _ = select.select([self.sock], [], [], seconds)
        return not readable

    def vanish(self) -> None:
        """Hang up abruptly (RST), as a killed client does."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


@contextmanager
def raw_request(
    base_url: str,
    method: str,
    target: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    receive_buffer: int | None = None,
) -> Iterator[RawResponse]:
    """Send one request on a new connection; the socket is closed on leaving the block."""
    address = urlsplit(base_url)
    assert address.hostname is not None and address.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if receive_buffer is not None:  # before connect, so it limits the TCP window
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        sock.settimeout(STEP_S)
        sock.connect((address.hostname, address.port))
        lines = [f"{method} {target} HTTP/1.1", f"Host: {address.netloc}"]
        lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
        if method in ("POST", "PUT"):
            lines.append(f"Content-Length: {len(body)}")
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        yield RawResponse(sock)
    finally:
        sock.close()


# -- multipart/mixed (RFC 2046 5.1.1) -----------------------------------------------------------
@dataclass(frozen=True)
class Part:
    headers: dict[str, str]  # lower-case names
    body: bytes


def boundary_of(response: RawResponse) -> bytes:
    match = re.fullmatch(
        r'multipart/mixed;\s*boundary="?([^";]+)"?', response.headers["content-type"]
    )
    assert match, response.headers["content-type"]
    return match.group(1).encode()


def parts_of(response: RawResponse) -> list[Part]:
    """The parts received so far. The CRLF before a delimiter belongs to the delimiter; the last
    part counts once the body so far ends with a CRLF where a chunk ended (dirmq writes each
    part as one chunk, as soon as its message is dequeued)."""
    segments = bytes(response.body).split(b"--" + boundary_of(response))
    assert segments[0] == b"", f"unexpected preamble {segments[0]!r}"
    parts = []
    for index, segment in enumerate(segments[1:], start=1):
        if segment.startswith(b"--"):  # the close delimiter
            break
        if index == len(segments) - 1 and not (response.at_chunk_end and segment.endswith(b"\r\n")):
            break  # still arriving
        head, separator, rest = segment.partition(b"\r\n\r\n")
        assert head.startswith(b"\r\n") or head == b"", segment[:200]
        assert separator and rest.endswith(b"\r\n"), segment[:200]
        fields = [line.split(": ", 1) for line in head.decode().split("\r\n")[1:]]
        parts.append(Part({name.lower(): value for name, value in fields}, rest[:-2]))
    return parts


def closed(response: RawResponse) -> bool:
    """The close delimiter has arrived."""
    return b"--" + boundary_of(response) + b"--\r\n" in response.body


def read_parts(response: RawResponse, count: int) -> list[Part]:
    response.read_until(lambda: len(parts_of(response)) >= count)
    return parts_of(response)


# -- the store, read as any program may (docs/FORMAT.md) ----------------------------------------
def message_file(path: Path) -> tuple[dict[str, str], bytes]:
    """Headers and body of a message file."""
    head, _, body = path.read_bytes().partition(b"\n\n")
    headers = dict(line.split(": ", 1) for line in head.decode().split("\n"))
    assert int(headers["Content-Length"]) == len(body)
    return headers, body


def stats(root: Path, name: str) -> dirmq.QueueStats:
    with dirmq.Store(root) as store:
        return store.queue(name).stats()


def settle(client: httpx.Client) -> None:
    """Return once the server has finished with the previous response on `client`'s one
    keep-alive connection: the server answers the next request only after the previous
    one's acknowledgement ran, so this request is the event to wait for."""
    response = client.request("OPTIONS", "/")
    assert response.status_code == 405


# -- fixtures -----------------------------------------------------------------------------------
server = serve(yaq=True)


@pytest.fixture
def yaq(server: ServerProcess) -> Iterator[httpx.Client]:
    assert server.yaq_url is not None
    with httpx.Client(base_url=server.yaq_url, timeout=STEP_S, limits=ONE_CONNECTION) as client:
        yield client


@pytest.fixture
def yaq_url(server: ServerProcess) -> str:
    assert server.yaq_url is not None
    return server.yaq_url


def post(client: httpx.Client, path: str, body: bytes, content_type: str = FORM) -> str:
    response = client.post(path, content=body, headers={"Content-Type": content_type})
    assert (response.status_code, response.content) == (200, b""), response.text
    return response.headers["x-message-id"]


# -- the README's session -----------------------------------------------------------------------
def test_readme_session(tmp_path: Path) -> None:
    root = tmp_path / "queues"
    queue_dir = root / "fish" / "saltwater"
    ready = queue_dir / "@ready"
    server = start_server(root, yaq=True)  # ./yaq /tmp/queues 127.0.0.1:1337 &
    try:
        assert server.yaq_url is not None
        with httpx.Client(base_url=server.yaq_url, timeout=STEP_S, limits=ONE_CONNECTION) as curl:
            # curl --request POST --data 'tuna' (then 'swordfish') .../fish/saltwater
            ids = [post(curl, "/fish/saltwater", fish) for fish in (b"tuna", b"swordfish")]
            # find /tmp/queues; cat .../@0000000001 -- our files are named by message id
            assert sorted(p.name for p in ready.iterdir()) == ids
            files = [message_file(ready / message_id) for message_id in ids]
            assert [(h["Content-Type"], body) for h, body in files] == [
                (FORM, b"tuna"),
                (FORM, b"swordfish"),
            ]

            # curl .../fish/saltwater  ->  tuna, then swordfish
            response = curl.get("/fish/saltwater")
            assert (response.status_code, response.content) == (200, b"tuna")
            assert response.headers["content-type"] == FORM
            assert [p.name for p in ready.iterdir()] == [ids[1]]  # what @oldest tracked
            response = curl.get("/fish/saltwater")
            assert (response.status_code, response.content) == (200, b"swordfish")
            assert response.headers["content-type"] == FORM

            # curl .../fish/saltwater  ^C  -- waits on the empty queue; the client gives up
            with raw_request(server.yaq_url, "GET", "/fish/saltwater") as abandoned:
                assert abandoned.silent(0.3)

            # curl --write-out '%{http_code}' .../fish/saltwater?timeout=2s  ->  504
            started = time.monotonic()
            response = curl.get("/fish/saltwater", params={"timeout": "2s"})
            elapsed = time.monotonic() - started
            assert (response.status_code, response.content) == (504, b"")
            assert 1.9 <= elapsed < 3.0, elapsed

            # curl .../fish/saltwater | sed ... &  then  curl --request POST --data 'wrasse'
            with raw_request(server.yaq_url, "GET", "/fish/saltwater") as background:
                assert background.silent(0.5)  # blocked: the queue is empty
                post(curl, "/fish/saltwater", b"wrasse")
                posted = time.monotonic()
                background.read_all()
                assert time.monotonic() - posted < 1.0
                assert (background.status, bytes(background.body)) == (200, b"wrasse")
                assert background.headers["content-type"] == FORM

            # curl --request POST --data 'shark'; find; cat .../@0000000003
            shark = post(curl, "/fish/saltwater", b"shark", TEXT)
            assert [p.name for p in ready.iterdir()] == [shark]
            headers, body = message_file(ready / shark)
            assert (headers["Content-Type"], body) == (TEXT, b"shark")
            text = (ready / shark).read_text()
            assert "\nContent-Type: text/plain; charset=UTF-8\n\nshark" in text
    finally:
        exit_code = server.stop()  # kill %1
    assert exit_code == 0
    # find /tmp/queues/ -- the message outlives the server. (That wrasse is gone from @leased
    # too is test_a_client_that_hangs_up_after_reading_does_not_leave_its_message_leased.)
    assert [p.name for p in ready.iterdir()] == [shark]
    with dirmq.Store(root) as store:
        queue = store.queue("fish/saltwater")
        assert queue.stats().ready == 1
        message = queue.get_one()
        assert message is not None
        assert (message.body, message.content_type) == (b"shark", TEXT)


# -- POST ---------------------------------------------------------------------------------------
def test_content_type_and_encoding_are_kept(server: ServerProcess, yaq_url: str) -> None:
    compressed = gzip.compress(b"hello, fish")
    headers = {"Content-Type": TEXT, "Content-Encoding": "gzip", "X-Not-Kept": "1"}
    with raw_request(yaq_url, "POST", "/t/kept", compressed, headers) as posted:
        posted.read_all()
        assert posted.status == 200
        message_id = posted.headers["x-message-id"]
    stored, body = message_file(server.root / "t" / "kept" / "@ready" / message_id)
    assert (stored["Content-Type"], stored["Content-Encoding"], body) == (TEXT, "gzip", compressed)
    assert "X-Not-Kept" not in stored
    with raw_request(yaq_url, "GET", "/t/kept") as got:  # httpx would gunzip the body
        got.read_all()
    assert (got.status, bytes(got.body)) == (200, compressed)
    assert (got.headers["content-type"], got.headers["content-encoding"]) == (TEXT, "gzip")
    assert "x-not-kept" not in got.headers


def test_a_dead_letter_says_why_over_yaq(server: ServerProcess, yaq_url: str) -> None:
    with dirmq.Store(server.root, create=False) as store:
        store.create_queue("t/dlq")
        jobs = store.create_queue("t/jobs", dirmq.QueueConfig(dead_letter_queue="t/dlq"))
        jobs.put(b"poison")
        (message,) = jobs.get()
        jobs.dead_letter(message.receipt or "", "no such sku")
    with raw_request(yaq_url, "GET", "/t/dlq") as got:
        got.read_all()
    assert (got.status, bytes(got.body)) == (200, b"poison")
    assert got.headers["x-dead-reason"] == "rejected"
    assert got.headers["x-dead-source"] == "t/jobs"
    assert got.headers["x-dead-detail"] == "no such sku"


def test_message_without_content_type_is_delivered_as_octet_stream(yaq_url: str) -> None:
    with raw_request(yaq_url, "POST", "/t/untyped", b"\x00\x01") as posted:
        posted.read_all()
        assert posted.status == 200
    with raw_request(yaq_url, "GET", "/t/untyped") as got:
        got.read_all()
    assert (got.status, bytes(got.body)) == (200, b"\x00\x01")
    assert got.headers["content-type"] == "application/octet-stream"


def test_post_at_capacity_waits_then_times_out_with_504(
    server: ServerProcess, yaq: httpx.Client, yaq_url: str
) -> None:
    created = httpx.put(f"{server.url}/t/full", json={"capacity": 1}, timeout=STEP_S)
    assert created.status_code == 201, created.text
    post(yaq, "/t/full", b"first")

    started = time.monotonic()
    refused = yaq.post("/t/full", params={"timeout": "300ms"}, content=b"second")
    elapsed = time.monotonic() - started
    assert refused.status_code == 504
    assert refused.headers["content-type"].startswith("text/plain") and refused.text.strip()
    assert 0.25 <= elapsed < 2.0, elapsed

    target = "/t/full?timeout=10s"
    with raw_request(yaq_url, "POST", target, b"second", {"Content-Type": FORM}) as blocked:
        assert blocked.silent(0.5)  # waits for room
        assert yaq.get("/t/full").content == b"first"  # room, once acknowledged
        blocked.read_all()
        assert blocked.status == 200
    assert yaq.get("/t/full").content == b"second"
    settle(yaq)
    assert stats(server.root, "t/full").total == 0


# -- GET ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("timeout", "seconds"), [("0", 0.0), ("250ms", 0.25), ("0.25", 0.25)])
def test_get_timeout_on_an_empty_queue_is_504_without_a_body(
    yaq: httpx.Client, timeout: str, seconds: float
) -> None:
    started = time.monotonic()
    response = yaq.get("/t/empty", params={"timeout": timeout})
    elapsed = time.monotonic() - started
    assert (response.status_code, response.content) == (504, b"")
    assert seconds - 0.02 <= elapsed < seconds + 1.0, elapsed


def test_dequeued_messages_are_gone_from_the_store(
    server: ServerProcess, yaq: httpx.Client
) -> None:
    ids = [post(yaq, "/t/gone", body) for body in (b"a", b"b")]
    assert stats(server.root, "t/gone").ready == 2
    response = yaq.get("/t/gone")
    assert (response.content, response.headers["x-message-id"]) == (b"a", ids[0])
    settle(yaq)
    after = stats(server.root, "t/gone")
    assert (after.ready, after.in_flight, after.dead) == (1, 0, 0)
    assert [p.name for p in (server.root / "t" / "gone" / "@ready").iterdir()] == [ids[1]]


def test_a_client_that_hangs_up_after_reading_does_not_leave_its_message_leased(
    server: ServerProcess, yaq: httpx.Client, yaq_url: str
) -> None:
    count = 20  # each hang-up races the acknowledgement: most lose
    for i in range(count):
        post(yaq, "/t/hangup", str(i).encode())
    for i in range(count):
        with raw_request(yaq_url, "GET", "/t/hangup") as got:  # like curl: read, then exit
            got.read_all()
            assert (got.status, bytes(got.body)) == (200, str(i).encode())
    # An acknowledgement is no event we can wait for from here: give them a bounded while.
    deadline = time.monotonic() + 1.0
    while (left := stats(server.root, "t/hangup")).in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (left.ready, left.in_flight) == (0, 0)


def test_quantity_n_is_a_chunked_multipart_of_n_parts_in_fifo_order(
    server: ServerProcess, yaq: httpx.Client, yaq_url: str
) -> None:
    sent = [(b"one", FORM), (b"two\r\n\r\nlines", TEXT), (b"\x00three", "image/png"), (b"4", FORM)]
    ids = [post(yaq, "/t/many", body, content_type) for body, content_type in sent]
    with raw_request(yaq_url, "GET", "/t/many?quantity=3") as response:
        response.read_all()
    assert response.status == 202
    assert response.headers["transfer-encoding"] == "chunked"
    assert response.headers["trailer"].lower() == TRAILER
    assert response.trailers == {}  # all three came: no X-Next-Message-Status
    assert closed(response)
    parts = parts_of(response)
    assert [(p.body, p.headers["content-type"]) for p in parts] == sent[:3]
    assert [p.headers["x-message-id"] for p in parts] == ids[:3]
    # The standard library's MIME parser reads the same three parts.
    document = message_from_bytes(
        f"Content-Type: {response.headers['content-type']}\r\n\r\n".encode() + response.body,
        policy=policy.HTTP,
    )
    assert [p.get_payload(decode=True) for p in document.iter_parts()] == [b for b, _ in sent[:3]]
    # Every part was acknowledged before the close delimiter was sent.
    after = stats(server.root, "t/many")
    assert (after.ready, after.in_flight) == (1, 0)


def test_fewer_than_quantity_ends_with_a_504_trailer(
    server: ServerProcess, yaq: httpx.Client, yaq_url: str
) -> None:
    for body in (b"x", b"y"):
        post(yaq, "/t/fewer", body)
    started = time.monotonic()
    with raw_request(yaq_url, "GET", "/t/fewer?quantity=5&timeout=1s") as response:
        response.read_all()
    elapsed = time.monotonic() - started
    assert response.status == 202
    assert [p.body for p in parts_of(response)] == [b"x", b"y"]
    assert closed(response)
    assert response.trailers == {TRAILER: "504"}
    assert 0.95 <= elapsed < 2.5, elapsed  # one timeout, for the third message
    assert stats(server.root, "t/fewer").total == 0


def test_quantity_timeout_restarts_with_each_message(yaq: httpx.Client, yaq_url: str) -> None:
    gap_s = 0.7  # each wait is shorter than the 1 s timeout; together they are longer
    with raw_request(yaq_url, "GET", "/t/reset?quantity=3&timeout=1s") as response:
        response.read_head()
        assert response.status == 202
        for count, body in enumerate((b"m1", b"m2", b"m3"), start=1):
            if count > 1:
                assert response.silent(gap_s)
            post(yaq, "/t/reset", body)
            assert [p.body for p in read_parts(response, count)] == [b"m1", b"m2", b"m3"][:count]
        response.read_all()
    assert response.trailers == {}


def test_unlimited_streams_what_is_published_until_the_client_leaves(
    yaq: httpx.Client, yaq_url: str
) -> None:
    with raw_request(yaq_url, "GET", "/t/stream?quantity=unlimited") as response:
        response.read_head()  # the 202 comes at once, before any message
        assert response.status == 202
        assert response.headers["content-type"].startswith("multipart/mixed")
        bodies = [f"fish {i}".encode() for i in range(5)]
        for count, body in enumerate(bodies, start=1):
            post(yaq, "/t/stream", body)
            assert [p.body for p in read_parts(response, count)] == bodies[:count]
        assert response.silent(0.3)  # and it keeps waiting: no close delimiter, no trailer
        assert not closed(response) and not response.complete


@pytest.mark.parametrize("quantity", ["1", "3", "unlimited"])
def test_a_consumer_that_left_while_waiting_takes_nothing_with_it(
    yaq: httpx.Client, yaq_url: str, quantity: str
) -> None:
    name = f"/t/left-{quantity}"
    with raw_request(yaq_url, "GET", f"{name}?quantity={quantity}") as gone:
        if quantity != "1":
            gone.read_head()  # a stream's 202 comes at once
            assert gone.status == 202
        assert gone.silent(0.3)  # waiting for a message
        gone.vanish()
    post(yaq, name, b"for whoever is next")
    assert yaq.get(name, params={"timeout": "3s"}).content == b"for whoever is next"


def test_a_message_leased_for_a_client_that_vanished_goes_to_the_next(
    server: ServerProcess, yaq: httpx.Client, yaq_url: str
) -> None:
    # Bigger than every socket buffer between us, so the server cannot have written it all
    # when the client, which never reads it, hangs up.
    big = bytes(range(256)) * (8 * 4096)  # 8 MiB
    target = "/t/vanish?quantity=unlimited"
    with raw_request(yaq_url, "GET", target, receive_buffer=4096) as stream:
        stream.read_head()
        post(yaq, "/t/vanish", big, "application/octet-stream")
        stream.read_until(lambda: len(stream.body) > 0)  # leased for this client, being sent
        stream.vanish()
    response = yaq.get("/t/vanish", params={"timeout": "5s"})
    assert (response.status_code, len(response.content)) == (200, len(big))
    assert response.content == big
    settle(yaq)
    assert stats(server.root, "t/vanish").total == 0


def test_a_part_the_client_read_is_not_delivered_again(yaq: httpx.Client, yaq_url: str) -> None:
    with raw_request(yaq_url, "GET", "/t/once?quantity=unlimited") as stream:
        stream.read_head()
        post(yaq, "/t/once", b"only once")
        assert [p.body for p in read_parts(stream, 1)] == [b"only once"]
    again = yaq.get("/t/once", params={"timeout": "1s"})
    assert (again.status_code, again.content) == (504, b"")


def test_head_does_not_consume_a_message(yaq: httpx.Client) -> None:
    post(yaq, "/t/head", b"still here")
    yaq.head("/t/head", params={"timeout": "0"})
    settle(yaq)
    assert yaq.get("/t/head", params={"timeout": "0"}).content == b"still here"


# -- queue names --------------------------------------------------------------------------------
def test_nested_and_percent_encoded_queue_names(
    server: ServerProcess, yaq: httpx.Client, yaq_url: str
) -> None:
    for path, name in [
        ("/profile-updates/v2/user12345", "profile-updates/v2/user12345"),
        ("/profile-updates/v2/user43554", "profile-updates/v2/user43554"),
        ("/snazzy%20party", "snazzy party"),
    ]:
        with raw_request(yaq_url, "POST", path, name.encode(), {"Content-Type": TEXT}) as r:
            r.read_all()
            assert r.status == 200
        assert (server.root / name / "@queue.json").is_file()
        assert stats(server.root, name).ready == 1
        with raw_request(yaq_url, "GET", path) as r:
            r.read_all()
        assert (r.status, bytes(r.body)) == (200, name.encode())
    # An encoded slash is a slash: the same nested queue.
    post(yaq, "/profile-updates%2Fv2/user12345", b"again")
    assert yaq.get("/profile-updates/v2/user12345").content == b"again"


def test_the_root_queue(server: ServerProcess, yaq: httpx.Client) -> None:
    post(yaq, "/", b"at the root")
    assert stats(server.root, "_root").ready == 1
    response = yaq.get("/")
    assert (response.status_code, response.content) == (200, b"at the root")
    settle(yaq)
    assert stats(server.root, "_root").total == 0


@pytest.mark.parametrize(
    "target", ["/%40ready", "/fish/%40leased", "/a/../b", "/a/%2E%2E/%2E%2E/etc", "/%FF"]
)
def test_names_that_are_not_queues_are_400(yaq_url: str, target: str) -> None:
    with raw_request(yaq_url, "POST", target, b"x") as response:
        response.read_all()
    assert response.status == 400
    assert response.headers["content-type"].startswith("text/plain") and response.body.strip()


# -- bad requests -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "query", "parameter"),
    [
        ("GET", "quantity=0", "quantity"),
        ("GET", "quantity=-1", "quantity"),
        ("GET", "quantity=1.5", "quantity"),
        ("GET", "quantity=many", "quantity"),
        ("GET", "quantity=", "quantity"),
        ("GET", "timeout=soon", "timeout"),
        ("GET", "timeout=-1s", "timeout"),
        ("GET", "timeout=2x", "timeout"),
        ("GET", "quantity=2&timeout=1y", "timeout"),
        ("POST", "timeout=soon", "timeout"),
    ],
)
def test_bad_parameters_are_400_with_a_text_body(
    server: ServerProcess, yaq: httpx.Client, method: str, query: str, parameter: str
) -> None:
    response = yaq.request(method, f"/t/bad?{query}", content=b"x" if method == "POST" else None)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("text/plain")
    assert parameter in response.text
    assert not (server.root / "t" / "bad").exists()  # refused before the queue is created


def test_a_superscript_quantity_is_400_not_500(yaq: httpx.Client) -> None:
    response = yaq.get("/t/bad", params={"quantity": "²", "timeout": "0"})
    assert response.status_code == 400


def test_other_methods_are_405(yaq: httpx.Client) -> None:
    for method in ("PUT", "DELETE", "PATCH"):
        response = yaq.request(method, "/t/methods")
        assert response.status_code == 405
        assert response.headers["content-type"].startswith("text/plain")
