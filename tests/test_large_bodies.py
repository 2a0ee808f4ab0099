"""Large message bodies go to their file as they arrive and leave it by `sendfile` (issue 35):
a streamed file is byte for byte what the codec writes, a large body round-trips over plain TCP
and TLS, an upload that does not finish leaves nothing, and the server's memory does not grow
with the body's size (with a priority and a time to live: test_large_bodies_ranked.py)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from dirmq.errors import InvalidArgument
from dirmq.server.credentials import new_token, token_digest
from dirmq.store import QueueConfig, Store, codec, fsio
from dirmq.store.bodyfiles import FileBody, bodies_by_file
from dirmq.store.fsck import fsck
from dirmq.store.streamed import StreamedFile

from .support.disks import small_tmpfs
from .support.memory import peak_growth
from .support.servers import ServerProcess, start_server
from .support.waiting import wait_until
from .test_server_limits import Answers, connect, recv_exactly
from .test_tls import Certificates, make_certificates, tls_options

MIB = 1024 * 1024
SIZE = 20 * MIB  # large enough to stream, small enough for a quick suite


def _body(size: int, seed: int = 0) -> bytes:
    """Bytes no two pieces of which are alike (a misplaced piece shows)."""
    block = os.urandom(64 * 1024) if seed == 0 else bytes([seed]) * (64 * 1024)
    return (block * (size // len(block) + 1))[:size]


# -- the store's streamed file -------------------------------------------------------------------
@pytest.mark.parametrize("group", [None, "orders-1"])
def test_a_streamed_file_is_byte_for_byte_what_the_codec_writes(
    tmp_path: Path, group: str | None
) -> None:
    store = Store(tmp_path / "root")
    queue = store.create_queue("q")
    body = os.urandom(3 * MIB + 17)
    headers = {"Content-Type": "application/octet-stream", "X-Colour": "blé"}
    streamed = StreamedFile.create(queue, len(body), headers, group)
    for start in range(0, len(body), 700_001):  # uneven pieces
        streamed.write([body[start : start + 700_001]])
    message_id = streamed.publish()
    got = queue.get_one(visibility_s=60)
    assert got is not None and got.id == message_id
    assert got.body == body and got.headers == headers and got.group == group
    (leased,) = (tmp_path / "root" / "q" / "@leased").iterdir()
    system = {"Group": group} if group else {}
    assert leased.read_bytes() == codec.encode(body, headers, system, message_id=message_id)
    assert not list((tmp_path / "root" / "q" / "@tmp").iterdir())
    assert fsck(tmp_path / "root", repair=False).ok


def test_a_streamed_file_that_is_delayed_waits_in_delayed(tmp_path: Path) -> None:
    queue = Store(tmp_path / "root").create_queue("q")
    streamed = StreamedFile.create(queue, 5, {}, durability="memory")
    streamed.write([b"later"])
    streamed.publish(delay_s=3600)
    stats = queue.stats()
    assert (stats.ready, stats.delayed) == (0, 1)


def test_a_streamed_file_short_or_long_of_its_length_is_never_published(tmp_path: Path) -> None:
    queue = Store(tmp_path / "root").create_queue("q")
    short = StreamedFile.create(queue, 10, {})
    short.write([b"123", b"45"])
    with pytest.raises(InvalidArgument, match="ended after 5 of its 10 bytes"):
        short.publish()
    long = StreamedFile.create(queue, 3, {})
    with pytest.raises(InvalidArgument, match="longer than its Content-Length of 3"):
        long.write([b"1234"])
    assert queue.stats().ready == 0
    assert not list((tmp_path / "root" / "q" / "@tmp").iterdir())
    assert fsck(tmp_path / "root", repair=False).ok


def test_a_get_inside_bodies_by_file_leaves_a_large_body_in_its_checked_file(
    tmp_path: Path,
) -> None:
    queue = Store(tmp_path / "root").create_queue("q")
    small, large = b"small", os.urandom(3 * MIB)
    queue.put_many([small, large])
    with bodies_by_file(MIB):
        first, second = queue.get(2, visibility_s=60)
    assert first.body == small and type(first.body) is bytes
    assert isinstance(second.body, FileBody) and second.body.size == len(large)
    assert second.body.read() == large
    second.body.close()
    queue.put(large)  # damaged in place: the CRC, checked without holding the body, says so
    (ready,) = (tmp_path / "root" / "q" / "@ready").iterdir()
    with open(ready, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        f.write(bytes([large[-1] ^ 1]))
    with bodies_by_file(MIB):
        assert queue.get(1, visibility_s=60) == []  # set aside, never delivered
    assert list((tmp_path / "root" / "q" / "@corrupt").iterdir())


def test_a_dead_letter_written_during_such_a_get_keeps_its_body(tmp_path: Path) -> None:
    """Only the leases a get hands out leave bodies in files: a message the same get
    dead-letters (its receives used up) is rewritten with its bytes."""
    queue = Store(tmp_path / "root").create_queue("q", QueueConfig(max_receives=1))
    body = os.urandom(3 * MIB)
    queue.put(body)
    assert queue.get_one(visibility_s=0.001) is not None  # its one receive; the lease expires
    time.sleep(0.01)  # past its deadline (a lease's expiry is a time, not an event)
    with bodies_by_file(MIB):
        assert queue.get(1, visibility_s=60) == []  # it died here, of max_receives
    (dead,) = queue.browse(10, state="dead")
    assert dead.body == body and type(dead.body) is bytes
    assert fsck(tmp_path / "root", repair=False).ok


def test_without_o_tmpfile_a_named_temp_is_used_and_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem has no O_TMPFILE, the upload is a named temp in @tmp (recovery's to
    remove if its writer dies), gone once published or discarded."""
    queue = Store(tmp_path / "root").create_queue("q")
    tmp = tmp_path / "root" / "q" / "@tmp"
    monkeypatch.setattr(fsio, "_tmpfile_unsupported", {str(tmp)})
    body = os.urandom(2 * MIB)
    for publish in (True, False):
        streamed = StreamedFile.create(queue, len(body), {})
        (named,) = tmp.iterdir()
        assert named.name.endswith(".tmp")
        streamed.write([body])
        if publish:
            message_id = streamed.publish()
        else:
            streamed.discard()
        assert not list(tmp.iterdir())
    got = queue.get_one(visibility_s=60)
    assert got is not None and got.id == message_id and got.body == body
    assert fsck(tmp_path / "root", repair=False).ok


# -- through the server --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bodies") / "root"
    running = start_server(root, "--max-body-bytes", "80MiB", yaq=True)
    try:
        yield running
    finally:
        assert running.stop() == 0, running.output[-2000:]


def _queue(url: str, name: str, verify: ssl.SSLContext | bool = True, **config: object) -> None:
    config.setdefault("max_message_bytes", 80 * MIB)
    with httpx.Client(base_url=url, timeout=30, verify=verify) as http:
        assert http.put(f"/{name}", json=config).status_code == 201


def assert_cut_upload_left_nothing(server: ServerProcess, queue: str) -> None:
    """After a client left mid-body: its temp file goes, no message is there, fsck is clean."""
    wait_until(lambda: not _temps_open(server), what="the temp file's removal")
    assert not list((server.root / queue / "@tmp").iterdir())
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get(f"/{queue}").json()["stats"]["ready"] == 0
        assert http.get(f"/{queue}/messages").status_code == 204
    assert fsck(server.root, repair=False).ok


def _temps_open(server: ServerProcess) -> list[str]:
    """What the server holds open in some @tmp (an O_TMPFILE inode shows as @tmp/#N)."""
    found = []
    for fd in Path(f"/proc/{server.proc.pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if "/@tmp/" in target:
            found.append(target)
    return found


def _round_trip(url: str, queue: str, body: bytes, verify: ssl.SSLContext | bool = True) -> None:
    with httpx.Client(base_url=url, timeout=60, verify=verify) as http:
        headers = {"Content-Type": "application/x-test", "X-Attr-Colour": "blue"}
        posted = http.post(f"/{queue}/messages", content=body, headers=headers)
        assert posted.status_code == 201, posted.text
        message_id = posted.json()["id"]
        got = http.get(f"/{queue}/messages")
        assert got.status_code == 200
        assert got.headers["x-message-id"] == message_id
        assert got.headers["content-type"] == "application/x-test"
        assert got.headers["x-attr-colour"] == "blue"
        assert int(got.headers["content-length"]) == len(body)
        assert got.content == body
        assert http.delete(f"/{queue}/messages/{got.headers['x-receipt']}").status_code == 204
        assert http.get(f"/{queue}").json()["stats"]["ready"] == 0
        # With the publish's options: durability, delay, group (kept in the file's head).
        options = {"durability": "writeback", "delay": "1h", "group": "g-1"}
        posted = http.post(f"/{queue}/messages", content=body, params=options)
        assert posted.status_code == 201, posted.text
        peeked = http.get(f"/{queue}/messages/{posted.json()['id']}")
        assert peeked.headers["x-group"] == "g-1" and peeked.content == body
        assert http.get(f"/{queue}").json()["stats"]["delayed"] == 1
        assert http.delete(f"/{queue}/messages/{posted.json()['id']}").status_code == 204


def test_a_large_body_round_trips_over_plain_tcp(server: ServerProcess) -> None:
    _queue(server.url, "plain")
    _round_trip(server.url, "plain", _body(SIZE))
    assert not list((server.root / "plain" / "@tmp").iterdir())
    assert not _temps_open(server)
    assert fsck(server.root, repair=False).ok


def test_a_body_just_under_the_threshold_and_one_over_it_round_trip(
    server: ServerProcess,
) -> None:
    _queue(server.url, "edges")
    for size in (MIB - 1, MIB, MIB + 1):
        _round_trip(server.url, "edges", _body(size, seed=size % 251 + 1))


def test_large_bodies_in_a_multipart_receive_and_a_long_poll_are_whole(
    server: ServerProcess,
) -> None:
    """Only a plain GET sends a body from its file; a multipart receive and a long poll's
    answer carry the bodies they read."""
    _queue(server.url, "many")
    first, second = _body(2 * MIB, seed=1), _body(3 * MIB, seed=2)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for body in (first, second):
            assert http.post("/many/messages", content=body).status_code == 201
        got = http.get("/many/messages", params={"max": "2"})
        assert got.status_code == 200
        assert first in got.content and second in got.content
    _queue(server.url, "polled")
    body = _body(2 * MIB, seed=3)
    answers: list[httpx.Response] = []

    def poll() -> None:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            answers.append(http.get("/polled/messages", params={"wait": "20s"}))

    with ThreadPoolExecutor(1) as pool:
        polling = pool.submit(poll)
        with httpx.Client(base_url=server.url, timeout=60) as http:
            assert http.post("/polled/messages", content=body).status_code == 201
        polling.result(60)
    assert answers[0].status_code == 200 and answers[0].content == body


def test_a_large_body_round_trips_through_yaq(server: ServerProcess) -> None:
    """yaq's enqueue into an existing queue streams to the file too, and its dequeue sends
    from it (then acknowledges, as yaq does once the answer is out)."""
    assert server.yaq_url is not None
    _queue(server.url, "yaqbig")
    body = _body(SIZE, seed=5)
    with httpx.Client(base_url=server.yaq_url, timeout=60) as yaq:
        posted = yaq.post("/yaqbig", content=body, headers={"X-Attr-Kind": "big"})
        assert posted.status_code == 200, posted.text
        got = yaq.get("/yaqbig")
        assert got.status_code == 200
        assert got.headers["x-message-id"] == posted.headers["x-message-id"]
        assert got.headers["x-attr-kind"] == "big"
        assert got.content == body
    with httpx.Client(base_url=server.url, timeout=30) as http:
        wait_until(lambda: http.get("/yaqbig").json()["stats"]["in_flight"] == 0, what="the ack")
        assert http.get("/yaqbig").json()["stats"]["ready"] == 0
    assert not _temps_open(server)


def test_a_body_all_in_the_socket_before_a_cancel_counts_as_sent(tmp_path: Path) -> None:
    """The sending thread put the whole body in the socket and the client read it and hung up
    before the event loop saw the thread end (a loaded machine): the hang-up's cancel finds
    the answer out, so the send returns and its follow-up runs (yaq's ack; without it the
    message the client has stays leased, to be delivered again: the test above waited in vain
    for its ack in a parallel run)."""
    from dirmq.server import filesend

    path = tmp_path / "body"
    body = _body(3 * MIB, seed=7)
    path.write_bytes(body)
    closed = threading.Event()

    class File:
        def __init__(self) -> None:
            self.fd, self.offset, self.size = os.open(path, os.O_RDONLY), 0, len(body)

        def close(self) -> None:  # by the thread, once it is done
            os.close(self.fd)
            closed.set()

    async def main() -> bytes:
        ours, client = socket.socketpair()
        with ours, client:
            ours.setblocking(False)
            sender = filesend.SocketSender(ours.fileno(), File(), timeout_s=30)
            sending = asyncio.create_task(sender.send(b"head\n"))
            await asyncio.sleep(0)  # the task hands the sending to a thread
            # The loop runs nothing now: the client reads it all, and the thread ends unseen.
            received = recv_exactly(client, 5 + len(body))
            assert closed.wait(30), "the thread did not end"
            sending.cancel()  # as connection_lost does when the client hangs up
            await sending  # returns: the answer is out
            return received

    assert asyncio.run(main()) == b"head\n" + body


def test_a_request_pipelined_after_an_upload_is_answered_in_order(server: ServerProcess) -> None:
    _queue(server.url, "piped")
    body = _body(3 * MIB, seed=13)
    with connect(server) as sock:
        sock.sendall(
            _upload_head("piped", len(body))
            + body
            + b"GET /piped/messages HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answers = Answers(sock)
        assert answers.next()[0] == 201
        status, _headers, got = answers.next()
        assert status == 200 and got == body


def test_concurrent_uploads_each_store_their_own_bytes(server: ServerProcess) -> None:
    """More uploads at once than writer threads: every file gets its own pieces, in order."""
    _queue(server.url, "together")
    bodies = [_body(6 * MIB, seed=20 + i) for i in range(6)]

    def upload(body: bytes) -> str:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            posted = http.post("/together/messages", content=body)
            assert posted.status_code == 201, posted.text
            return str(posted.json()["id"])

    with ThreadPoolExecutor(len(bodies)) as pool:
        ids = list(pool.map(upload, bodies))
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for message_id, body in zip(ids, bodies, strict=True):
            assert http.get(f"/together/messages/{message_id}").content == body
    assert not _temps_open(server)


def _open_under(server: ServerProcess, directory: Path) -> list[str]:
    found = []
    for fd in Path(f"/proc/{server.proc.pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith(f"{directory}/"):
            found.append(target)
    return found


def test_a_reader_that_stalls_then_leaves_mid_body_frees_the_file(server: ServerProcess) -> None:
    """A GET whose client stops reading holds its message file (and the lease) while others are
    served; once it leaves, the file is closed and the lease runs its course as before."""
    _queue(server.url, "slow")
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.post("/slow/messages", content=_body(SIZE, seed=11)).status_code == 201
    leased = server.root / "slow" / "@leased"
    with connect(server) as sock:
        sock.sendall(b"GET /slow/messages?visibility=1h HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(64 * 1024)  # the head and the start of the body, then nothing read
        assert wait_until(lambda: _open_under(server, leased), what="the file being sent")
        with httpx.Client(base_url=server.url, timeout=30) as other:  # not held up meanwhile
            assert other.get("/health").status_code == 200
            assert other.get("/slow").json()["stats"]["in_flight"] == 1
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wait_until(lambda: not _open_under(server, leased), what="the file's descriptor closed")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/slow").json()["stats"]["in_flight"] == 1  # leased, as a receive is


def _upload_head(queue: str, size: int) -> bytes:
    return f"POST /{queue}/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n".encode()


@contextmanager
def upload_under_way(
    server: ServerProcess, queue: str, door: str, query: str = ""
) -> Iterator[socket.socket]:
    """A connection uploading SIZE bytes to `queue` through `door` ("native", its URL's
    `query` appended, or "yaq"), 5 MiB of them sent: its file is open in @tmp by then."""
    url = server.url if door == "native" else server.yaq_url
    assert url is not None
    host, port = url.removeprefix("http://").split(":")
    path = f"/{queue}/messages{query}" if door == "native" else f"/{queue}"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {SIZE}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + _body(5 * MIB))
        wait_until(lambda: _temps_open(server), what="the upload's temp file")
        yield sock


@pytest.mark.parametrize("door", ["native", "yaq"])
@pytest.mark.parametrize("how", ["reset", "half-close"])
def test_an_upload_cut_short_leaves_no_message_and_no_temp_file(
    server: ServerProcess, how: str, door: str
) -> None:
    queue = f"cut-{how}-{door}"
    _queue(server.url, queue)
    with upload_under_way(server, queue, door) as sock:
        if how == "half-close":  # the body ends short of its Content-Length
            sock.shutdown(socket.SHUT_WR)
            assert sock.recv(1024) == b""  # closed without an answer: there is no request
        else:
            # Closed with a reset (SO_LINGER on, 0 s): the client is gone mid-body.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert_cut_upload_left_nothing(server, queue)


def test_a_server_killed_mid_upload_leaves_no_message_and_a_clean_root(tmp_path: Path) -> None:
    """SIGKILL while a large body is being written: nothing is visible, fsck finds nothing to
    repair, and the next server takes uploads as before."""
    root = tmp_path / "root"
    server = start_server(root, "--max-body-bytes", "80MiB")
    try:
        _queue(server.url, "crash")
        with connect(server) as sock:
            sock.sendall(_upload_head("crash", SIZE) + _body(5 * MIB))
            wait_until(lambda: _temps_open(server), what="the upload's temp file")
            server.proc.kill()
            server.proc.wait()
    finally:
        server.stop()
    report = fsck(root, repair=False)
    assert report.ok and report.problems == (), report.problems
    again = start_server(root, "--max-body-bytes", "80MiB")
    try:
        with httpx.Client(base_url=again.url, timeout=60) as http:
            assert http.get("/crash").json()["stats"]["ready"] == 0
            body = _body(2 * MIB, seed=17)
            assert http.post("/crash/messages", content=body).status_code == 201
            assert http.get("/crash/messages").content == body
    finally:
        assert again.stop() == 0
    assert not list((root / "crash" / "@tmp").iterdir())


def test_a_body_that_stops_short_is_answered_408_and_leaves_nothing(tmp_path: Path) -> None:
    server = start_server(tmp_path / "root", "--body-timeout", "1s")
    try:
        _queue(server.url, "stalled")
        with connect(server) as sock:
            sock.sendall(_upload_head("stalled", SIZE) + _body(2 * MIB))
            status, _headers, body = Answers(sock).next()  # the client sends no more
            assert status == 408
            assert "did not arrive in time" in json.loads(body)["message"]
        wait_until(lambda: not _temps_open(server), what="the temp file's removal")
        assert not list((server.root / "stalled" / "@tmp").iterdir())
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/stalled").json()["stats"]["ready"] == 0
    finally:
        assert server.stop() == 0


def test_a_disk_that_fills_mid_upload_answers_503_and_keeps_nothing(tmp_path: Path) -> None:
    """The writer meets ENOSPC half-way: the rest of the body is read and dropped, the answer
    says why, and the space is free again (the file discarded)."""
    with small_tmpfs(tmp_path, "8m") as mount_point:
        server = start_server(mount_point / "root", "--max-body-bytes", "80MiB")
        try:
            _queue(server.url, "full")
            with httpx.Client(base_url=server.url, timeout=60) as http:
                refused = http.post("/full/messages", content=_body(SIZE))
                assert refused.status_code == 503, refused.text
                assert "No space left on device" in refused.json()["message"]
                assert not list((mount_point / "root" / "full" / "@tmp").iterdir())
                wait_until(lambda: not _temps_open(server), what="the temp file's removal")
                # The space is back: a message that fits is stored.
                assert http.post("/full/messages", content=_body(2 * MIB)).status_code == 201
                assert http.get("/full").json()["stats"]["ready"] == 1
        finally:
            assert server.stop() == 0


def test_a_body_over_its_queue_limit_gets_413_before_any_file_is_made(
    server: ServerProcess,
) -> None:
    _queue(server.url, "limited", max_message_bytes=2 * MIB)
    with connect(server) as sock:
        sock.sendall(_upload_head("limited", SIZE))  # the head alone: the body is never needed
        status, _headers, body = Answers(sock).next()
        assert status == 413
        assert "accepts at most 2097152" in json.loads(body)["message"]
    assert not _temps_open(server)
    assert not list((server.root / "limited" / "@tmp").iterdir())


def test_a_publish_with_100_continue_streams_too(server: ServerProcess) -> None:
    _queue(server.url, "continued")
    body = _body(2 * MIB, seed=7)
    with connect(server) as sock:
        head = _upload_head("continued", len(body))
        sock.sendall(head.replace(b"\r\n\r\n", b"\r\nExpect: 100-continue\r\n\r\n"))
        assert recv_exactly(sock, 25) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        assert Answers(sock).next()[0] == 201
    with httpx.Client(base_url=server.url, timeout=60) as http:
        assert http.get("/continued/messages").content == body


WRITER, READER = new_token(), new_token()
GUARDED = f"""
[principals.writer]
token_sha256 = "{token_digest(WRITER)}"
write = ["big"]
admin = ["big"]

[principals.reader]
token_sha256 = "{token_digest(READER)}"
read = ["big"]
"""


def test_only_a_principal_that_may_publish_gets_a_file(tmp_path: Path) -> None:
    """A body is streamed to a file only for a token allowed to publish there: anyone else's
    is read (and refused) as before, and never touches the disk."""
    path = tmp_path / "credentials.toml"
    path.write_text(GUARDED)
    path.chmod(0o600)
    server = start_server(tmp_path / "root", "--credentials", str(path))
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            made = http.put("/big", headers={"Authorization": f"Bearer {WRITER}"})
            assert made.status_code == 201
        body = _body(2 * MIB, seed=9)
        for token, status, files in ((READER, 403, 0), ("", 401, 0), (WRITER, 201, 1)):
            auth = f"Authorization: Bearer {token}\r\n" if token else ""
            head = (
                f"POST /big/messages HTTP/1.1\r\nHost: x\r\n{auth}Expect: 100-continue\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            with connect(server) as sock:
                sock.sendall(head)
                # Said once the head is judged: a file is open by then, or never will be.
                assert recv_exactly(sock, 25) == b"HTTP/1.1 100 Continue\r\n\r\n"
                assert len(_temps_open(server)) == files, token
                sock.sendall(body)
                assert Answers(sock).next()[0] == status
        wait_until(lambda: not _temps_open(server), what="the temp file's removal")
        with httpx.Client(base_url=server.url, timeout=30) as http:
            got = http.get("/big/messages", headers={"Authorization": f"Bearer {WRITER}"})
            assert got.status_code == 403  # the writer may not read: the message is there
            stats = http.get("/big", headers={"Authorization": f"Bearer {WRITER}"}).json()
            assert stats["stats"]["ready"] == 1
    finally:
        assert server.stop() == 0


def round_trip_peak_growth(
    root: Path, body: bytes, params: dict[str, str] | None = None, **config: object
) -> tuple[int, httpx.Response]:
    """A server's peak RSS growth, in MiB, while `body` is published (with `params`) to a new
    queue made with `config` and received; and the GET's response. A warm-up message goes in
    and out first (what a first request allocates is not the body's), and fsck is clean after."""
    running = start_server(root, "--max-body-bytes", "80MiB")
    try:
        _queue(running.url, "big", **config)
        with httpx.Client(base_url=running.url, timeout=120) as http:
            assert http.post("/big/messages", content=b"warm-up").status_code == 201
            assert http.get("/big/messages").status_code == 200
            with peak_growth(running.proc.pid) as grown:
                posted = http.post("/big/messages", content=body, params=params)
                assert posted.status_code == 201, posted.text
                got = http.get("/big/messages")
        assert got.status_code == 200 and got.content == body
        assert fsck(running.root, repair=False).ok
    finally:
        assert running.stop() == 0
    return grown.mib, got


def test_the_servers_memory_does_not_grow_with_the_body(tmp_path: Path) -> None:
    """A 64 MiB message in and out: the server's peak RSS grows by a window, not by the body
    (it grew by 128 MiB for the POST and 64 MiB for the GET when bodies were held)."""
    size = 64 * MIB
    grown, _ = round_trip_peak_growth(tmp_path / "root", _body(size))
    assert grown < 24, f"the server's peak RSS grew by {grown} MiB for a {size // MIB} MiB body"


# -- over TLS --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("certs"))


def test_a_large_body_round_trips_over_tls(tmp_path: Path, certs: Certificates) -> None:
    server = start_server(tmp_path / "root", *tls_options(certs), "--max-body-bytes", "80MiB")
    try:
        assert server.url.startswith("https://")
        trusting = ssl.create_default_context(cafile=str(certs.ca))
        _queue(server.url, "secret", verify=trusting)
        _round_trip(server.url, "secret", _body(SIZE), verify=trusting)
        assert fsck(server.root, repair=False).ok
    finally:
        assert server.stop() == 0
