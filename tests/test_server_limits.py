"""Bounded resources per client and in total, against a real `dirmq serve` (issue 15, defect 7).

A connection that pipelines requests without reading the answers, a slow reader of big bodies,
many big uploads at once, and bodies over a limit announced by their Content-Length: the
server's memory stays bounded (its RSS, read from /proc), other clients are still served, and
every refused request gets a status that says which limit, before its body is read.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.store.reading import read_message

from .support.fixtures import serve
from .support.memory import peak_growth, status_field
from .support.servers import ServerProcess, start_server

MIB = 1024 * 1024
GROWTH_BOUND_MIB = 200  # what a few buffers may cost; the defect cost gigabytes
PATIENCE_S = 30.0  # a generous deadline for anything a busy machine may delay
PROMPT_S = 10.0  # "promptly" for another client, on a busy machine (a stuck server: never)


def connect(server: ServerProcess, timeout_s: float = PATIENCE_S) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=timeout_s)


class Answers:
    """HTTP/1.1 responses read one by one from a socket (Content-Length framed)."""

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb")

    def next(self) -> tuple[int, dict[str, str], bytes]:
        status_line = self._file.readline()
        if not status_line:
            raise EOFError("the server closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while (line := self._file.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if status == 100:
            return self.next()
        body = self._file.read(int(headers.get("content-length", "0")))
        return status, headers, body

    def at_eof(self) -> bool:
        return self._file.read(1) == b""


def make_queue(server: ServerProcess, name: str, **config: object) -> None:
    with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
        assert http.put(f"/{name}", json=config).status_code == 201


def health_within(server: ServerProcess, seconds: float) -> float:
    """How long another client's GET /health takes (it must take less than `seconds`)."""
    started = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=seconds) as http:
        assert http.get("/health").status_code == 200
    return time.monotonic() - started


def send_without_reading(sock: socket.socket, data: bytes, give_up_s: float = 5.0) -> int:
    """Send as much of `data` as the server takes, never reading; stop once sending has been
    blocked for `give_up_s` (the server stopped reading: what we want). Returns bytes sent."""
    sock.setblocking(False)
    sent, blocked_since = 0, None
    while sent < len(data):
        try:
            sent += sock.send(data[sent : sent + 65536])
            blocked_since = None
        except BlockingIOError:
            now = time.monotonic()
            blocked_since = blocked_since or now
            if now - blocked_since > give_up_s:
                break
            time.sleep(0.01)
    sock.settimeout(PATIENCE_S)
    return sent


def peak_rss_while(pid: int, seconds: float) -> int:
    """The highest VmRSS seen over `seconds` (sampled), in MiB."""
    peak, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, status_field(pid, "VmRSS"))
        time.sleep(0.05)
    return peak


server = serve(scope="function")


# -- defect 7: one connection pipelining without reading ---------------------------------------
def test_pipelining_without_reading_keeps_memory_bounded_and_answers_in_order(
    server: ServerProcess,
) -> None:
    pid = server.proc.pid
    count = 6000  # ~100 KiB of answer each: 600 MiB if the server buffered them all
    paths = ["/health" if i % 10 == 0 else "/openapi.json" for i in range(count)]
    requests = b"".join(f"GET {p} HTTP/1.1\r\nHost: x\r\n\r\n".encode() for p in paths)
    before = status_field(pid, "VmRSS")
    with connect(server) as sock:
        sent = send_without_reading(sock, requests)
        peak = peak_rss_while(pid, 3.0)
        assert peak - before < GROWTH_BOUND_MIB, f"RSS {before} -> {peak} MiB"
        assert health_within(server, PROMPT_S) < PROMPT_S  # another client is served meanwhile
        answers = Answers(sock)
        done = threading.Event()

        def send_rest() -> None:  # the server takes the rest as we read the answers
            sock.sendall(requests[sent:])
            done.set()

        sender = threading.Thread(target=send_rest)
        sender.start()
        for i, path in enumerate(paths):
            status, _headers, body = answers.next()
            assert status == 200
            is_health = body.startswith(b'{"status"')
            assert is_health == (path == "/health"), f"answer {i} out of order"
        sender.join(PATIENCE_S)
        assert done.is_set()
    assert status_field(pid, "VmRSS") - before < GROWTH_BOUND_MIB


def test_many_pipelining_connections_hold_little_each(server: ServerProcess) -> None:
    """What one read brings (256 KiB: thousands of small requests) is not all parsed and queued
    at once: a connection that reads no answers costs well under 1 MiB."""
    pid = server.proc.pid
    connections = 100
    requests = b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 20_000
    before = status_field(pid, "VmRSS")
    socks = [connect(server) for _ in range(connections)]
    try:
        for sock in socks:
            sock.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                sock.send(requests)  # what the kernel takes at once: hundreds of KiB
        peak = peak_rss_while(pid, 3.0)
        assert peak - before < connections * 0.5, f"RSS {before} -> {peak} MiB"
        assert health_within(server, PROMPT_S) < PROMPT_S
    finally:
        for sock in socks:
            sock.close()


def test_input_held_unparsed_counts_against_the_body_budget(tmp_path: Path) -> None:
    """What a pipelining connection sent but the server does not parse yet is in memory: it is
    charged to the body budget, so uploads wait (503) instead of the sum growing, and it is
    given back when the connection goes."""
    server = start_server(
        tmp_path / "root", "--max-body-bytes", str(MIB), "--max-body-memory", str(MIB)
    )
    try:
        make_queue(server, "up")
        requests = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" * 100_000  # tiny answers
        socks = [connect(server) for _ in range(8)]
        try:
            for sock in socks:
                sock.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    sock.send(requests)
            upload = b"u" * (MIB // 2)
            deadline = time.monotonic() + PATIENCE_S
            with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
                while (status := http.post("/up/messages", content=upload).status_code) != 503:
                    assert status == 201
                    assert time.monotonic() < deadline, "unparsed input was never charged"
                    time.sleep(0.05)
        finally:
            for sock in socks:
                sock.close()
        deadline = time.monotonic() + PATIENCE_S
        with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
            while (status := http.post("/up/messages", content=upload).status_code) == 503:
                assert time.monotonic() < deadline, "the charge was not given back"
                time.sleep(0.05)
            assert status == 201
    finally:
        server.stop()


def test_a_slow_reader_of_big_bodies_holds_one_at_a_time(server: ServerProcess) -> None:
    make_queue(server, "big")
    payload = bytes(range(256)) * (64 * 1024)  # 16 MiB
    with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
        message_id = http.post("/big/messages", content=payload).headers["X-Message-Id"]
    pid = server.proc.pid
    count = 40  # 640 MiB of answers if the server wrote them all into its buffers
    request = f"GET /big/messages/{message_id} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    before = status_field(pid, "VmRSS")
    with connect(server) as sock:
        send_without_reading(sock, request * count)
        peak = peak_rss_while(pid, 3.0)
        assert peak - before < GROWTH_BOUND_MIB, f"RSS {before} -> {peak} MiB"
        assert health_within(server, PROMPT_S) < PROMPT_S
        answers = Answers(sock)
        for _ in range(count):
            status, _headers, body = answers.next()
            assert status == 200 and body == payload


def test_a_big_message_costs_about_its_size_to_deliver(tmp_path: Path) -> None:
    size = 64 * MIB
    with dirmq.Store(tmp_path / "root") as store:  # stored beforehand: only the read is measured
        queue = store.create_queue("big", dirmq.QueueConfig(max_message_bytes=size))
        message_id = queue.put(b"d" * size)
    server = start_server(tmp_path / "root")
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            assert http.get("/health").status_code == 200
            with peak_growth(server.proc.pid) as growth:
                assert len(http.get(f"/big/messages/{message_id}").content) == size
                assert len(http.get("/big/messages").content) == size
        assert growth.mib < 1.5 * size / MIB, f"{growth.mib} MiB to deliver {size // MIB} MiB"
    finally:
        server.stop()


def test_a_damaged_big_message_is_still_corrupt(tmp_path: Path) -> None:
    """A large file's body is read on its own (no copy): its length and checksum still hold."""
    with dirmq.Store(tmp_path / "root") as store:
        queue = store.create_queue("big")
        body = b"d" * (4 * MIB)
        message_id = queue.put(body)
    (path,) = (tmp_path / "root" / "big").glob(f"@ready/**/{message_id}*")
    assert read_message(str(path), message_id).body == body
    data = path.read_bytes()
    for damaged in (data[:-1] + b"e", data[:-1], data + b"d"):  # flipped, truncated, grown
        path.write_bytes(damaged)
        with pytest.raises(dirmq.CorruptMessage):
            read_message(str(path), message_id)


def test_a_slow_reader_of_an_event_stream_holds_little(server: ServerProcess) -> None:
    pid = server.proc.pid
    count, size = 200, MIB  # ~270 MiB of events (base64) if the server buffered them all
    with connect(server) as sock:
        sock.sendall(b"GET /@pubsub/subscribe?channel=c&window=1000 HTTP/1.1\r\nHost: x\r\n\r\n")
        stream = sock.makefile("rb")
        while b"event: attached" not in stream.readline():  # attached: now read nothing more
            pass
        before = status_field(pid, "VmRSS")
        with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
            for i in range(count):
                published = http.post(
                    "/@pubsub/publish", params={"channel": "c"}, content=bytes([i]) * size
                )
                assert published.status_code == 201
        peak = peak_rss_while(pid, 2.0)
        assert peak - before < GROWTH_BOUND_MIB, f"RSS {before} -> {peak} MiB"
        assert health_within(server, PROMPT_S) < PROMPT_S
        events = 0
        while events < count:  # and every event arrives once read
            line = stream.readline()
            assert line, "the stream ended early"
            events += line.startswith(b"event: message")


# -- the server-wide budget for bodies in memory -----------------------------------------------
CONTINUE = b"\r\nExpect: 100-continue\r\n\r\n"
CONTINUED = b"HTTP/1.1 100 Continue\r\n\r\n"


def recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "the server closed the connection"
        data += chunk
    return data


def upload_head(queue: str, size: int, extra: str = "") -> bytes:
    return (
        f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\n{extra}Content-Length: {size}\r\n\r\n"
    ).encode()


# A publish with a dedup id is read into memory whatever its size (a large one without goes to
# its file as it arrives, charging only its window: docs/http-api.md, "Large bodies").
HELD = "X-Dedup-Id: held-in-memory\r\n"


def test_parallel_uploads_stay_within_the_memory_budget(tmp_path: Path) -> None:
    """Four 64 MiB uploads at once against a budget of two: two wait (503, retried), none is
    lost, and the server never holds much more than the budget (four at once, unbudgeted, took
    it to ~440 MiB more)."""
    budget_mib = 128
    server = start_server(tmp_path / "root", "--max-body-memory", str(budget_mib * MIB))
    try:
        make_queue(server, "up", max_message_bytes=64 * MIB)
        pid = server.proc.pid
        before = status_field(pid, "VmRSS")
        bodies = [bytes([i]) * (64 * MIB) for i in range(4)]

        def upload(body: bytes) -> tuple[int, int]:
            """(final status, 503s met before it)"""
            refused = 0
            deadline = time.monotonic() + 120
            with httpx.Client(base_url=server.url, timeout=120) as http:
                while True:
                    # Held in memory (a dedup id of its own), as every body was before large
                    # ones went to their files as they arrive.
                    held = {"X-Dedup-Id": f"held-{body[0]}"}
                    status = http.post("/up/messages", content=body, headers=held).status_code
                    if status != 503 or time.monotonic() > deadline:
                        return status, refused
                    refused += 1
                    time.sleep(0.05)

        with ThreadPoolExecutor(4) as pool:
            outcomes = list(pool.map(upload, bodies))
        peak = status_field(pid, "VmHWM")  # the process's high-water mark
        assert [status for status, _ in outcomes] == [201] * 4
        assert peak - before < budget_mib + GROWTH_BOUND_MIB, f"RSS {before} -> peak {peak} MiB"
        with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
            got = http.get("/up/messages", params={"max": "4"})
            assert got.status_code == 200
            assert http.get("/up").json()["stats"]["in_flight"] == 4
    finally:
        server.stop()


def test_the_budget_is_the_servers_across_workers(tmp_path: Path) -> None:
    """With --workers 2 one worker's reserved upload leaves no room in the other: new bodies are
    refused on every connection, whichever worker the kernel hands it to, until it is done."""
    size = 64 * MIB
    server = start_server(tmp_path / "root", "--workers", "2", "--max-body-memory", str(size))
    try:
        make_queue(server, "up", max_message_bytes=size)
        with connect(server) as holder:
            holder.sendall(upload_head("up", size, HELD).replace(b"\r\n\r\n", CONTINUE))
            assert recv_exactly(holder, len(CONTINUED)) == CONTINUED  # reserved
            statuses = []
            for _ in range(12):  # new connections spread over both workers
                with connect(server) as other:
                    other.sendall(upload_head("up", 1024) + b"x" * 1024)
                    statuses.append(Answers(other).next()[0])
            assert statuses == [503] * 12
            holder.sendall(b"a" * size)
            assert Answers(holder).next()[0] == 201
        with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
            for _ in range(12):  # given back: both workers take bodies again
                assert http.post("/up/messages", content=b"x" * 1024).status_code == 201
    finally:
        server.stop()


def test_an_upload_over_the_budget_gets_503_before_its_body_and_a_retry_succeeds(
    tmp_path: Path,
) -> None:
    size = 64 * MIB
    server = start_server(tmp_path / "root", "--max-body-memory", str(2 * size))
    try:
        make_queue(server, "up", max_message_bytes=size)
        holders = [connect(server) for _ in range(2)]
        try:
            for i, sock in enumerate(holders):  # two uploads under way fill the budget
                held = HELD.replace("memory", f"memory-{i}")  # two messages, not a repeat
                head = upload_head("up", size, held).replace(b"\r\n\r\n", CONTINUE)
                sock.sendall(head)
                # The server says 100 Continue once the body's memory is reserved.
                assert recv_exactly(sock, len(CONTINUED)) == CONTINUED
                sock.sendall(b"a" * MIB)
            with connect(server) as third:
                third.sendall(upload_head("up", size))  # and no body: it must not be needed
                status, headers, body = Answers(third).next()
                assert status == 503
                assert headers["retry-after"] == "1"
                assert "--max-body-memory" in json.loads(body)["message"]
                assert Answers(third).at_eof()  # closed, cleanly
            for sock in holders:
                sock.sendall(b"a" * (size - MIB))
                assert Answers(sock).next()[0] == 201
        finally:
            for sock in holders:
                sock.close()
        with httpx.Client(base_url=server.url, timeout=120) as http:
            assert http.post("/up/messages", content=b"c" * size).status_code == 201
            assert http.get("/up").json()["stats"]["ready"] == 3
    finally:
        server.stop()


@pytest.mark.parametrize("sent_mib", [1, 64], ids=["mid-body", "without-its-answer"])
def test_a_client_that_vanishes_gives_its_budget_back(tmp_path: Path, sent_mib: int) -> None:
    size = 64 * MIB
    server = start_server(tmp_path / "root", "--max-body-memory", str(size))
    try:
        make_queue(server, "up", max_message_bytes=size)
        for _ in range(3):
            with connect(server) as sock:
                sock.sendall(upload_head("up", size, HELD) + b"a" * (sent_mib * MIB))
        deadline = time.monotonic() + PATIENCE_S
        with httpx.Client(base_url=server.url, timeout=120) as http:
            while True:  # the server notices the hang-up asynchronously
                status = http.post("/up/messages", content=b"b" * size).status_code
                if status != 503 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert status == 201
    finally:
        server.stop()


# -- bodies over a limit are refused from their Content-Length ----------------------------------
def test_a_body_over_its_queue_limit_is_413_before_it_is_sent(server: ServerProcess) -> None:
    make_queue(server, "small", max_message_bytes=1024)
    with connect(server, timeout_s=10) as sock:  # the body timeout is 60 s: no waiting for it
        sock.sendall(upload_head("small", 10 * MIB))
        answers = Answers(sock)
        status, _headers, body = answers.next()
        assert status == 413
        error = json.loads(body)
        assert error == {
            "error": "MessageTooLarge",
            "message": f"message is {10 * MIB} bytes; queue 'small' accepts at most 1024: raise "
            "its max_message_bytes (`dirmq configure small --max-bytes SIZE`, or PUT /small "
            '{"max_message_bytes": N})',
        }
        assert answers.at_eof()
    with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as http:
        assert http.get("/small").json()["stats"]["ready"] == 0


@pytest.mark.parametrize(
    ("queue", "length", "says"),
    [("small", 10 * MIB, "accepts at most 1024"), ("any", 1 << 40, "server's limit")],
)
def test_a_refused_body_already_on_its_way_still_gets_its_answer_and_a_clean_close(
    server: ServerProcess, queue: str, length: int, says: str
) -> None:
    make_queue(server, queue, max_message_bytes=1024)
    with connect(server, timeout_s=10) as sock:
        # Part of the body is sent before the answer is read: closing on unread data would
        # reset the connection and could destroy the answer.
        send_without_reading(sock, upload_head(queue, length) + b"x" * (2 * MIB), give_up_s=1.0)
        answers = Answers(sock)
        status, _headers, body = answers.next()
        assert status == 413 and says in json.loads(body)["message"]
        assert answers.at_eof()


def test_a_refusal_waits_for_the_answers_pipelined_before_it(server: ServerProcess) -> None:
    make_queue(server, "small", max_message_bytes=1024)
    make_queue(server, "other")
    with connect(server, timeout_s=PATIENCE_S) as sock:
        # A long poll in progress, then a body refused from its Content-Length: the poll's
        # answer must not be lost to the refusal's close.
        sock.sendall(
            b"GET /other/messages?wait=1s HTTP/1.1\r\nHost: x\r\n\r\n" + upload_head("small", 4096)
        )
        answers = Answers(sock)
        assert answers.next()[0] == 204
        assert answers.next()[0] == 413
        assert answers.at_eof()


def test_expect_100_continue_over_the_limit_gets_413_not_continue(server: ServerProcess) -> None:
    make_queue(server, "small", max_message_bytes=1024)
    head = upload_head("small", 4096).replace(b"\r\n\r\n", CONTINUE)
    with connect(server, timeout_s=10) as sock:
        sock.sendall(head)
        assert sock.makefile("rb").readline().startswith(b"HTTP/1.1 413")


def test_serve_refuses_a_budget_smaller_than_the_body_limit(tmp_path: Path) -> None:
    # Else a body under the size limit could never fit: a 503 that no retry would cure.
    args = ["serve", "--root", str(tmp_path / "root"), "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        [sys.executable, "-m", "dirmq", *args, "--max-body-memory", "1000"],
        capture_output=True,
        check=False,
        text=True,
        timeout=PATIENCE_S,
    )
    assert done.returncode == 2
    assert "--max-body-memory (1000) must be at least --max-body-bytes" in done.stderr
