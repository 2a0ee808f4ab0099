"""The direct path's consumer that has gone by the time its message is linked (server/direct.py,
`_Line._finish`): its long poll's wait ended, its client hung up, or its stream closed, between
the admission and the link. The publisher still gets its 201; the lease is given back (a nack
without delay), so the message is ready again, counted once, for the next consumer, and
`dirmq_direct_released_total` counts it, not `dirmq_direct_deliveries_total`.

The server runs under a launcher (`_LAUNCHER`) that holds a direct create of a body starting
with "hold" before it writes anything, until the test lets it go, and tells the test when a
consumer the direct path took has gone without its message: each event is a connection to the
test's gate (an abstract Unix socket), so the test acts on events, not on time."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from dirmq.client import RemoteStore
from dirmq.store import layout
from dirmq.store.fsck import fsck

from .support.metrics_helpers import value
from .support.raw_poll import RawPoll
from .support.servers import ServerProcess, fresh, start_server
from .support.waiting import wait_until

ATTEMPTS = 20  # a poll must be waiting when the publish comes: tried again until one is

_LAUNCHER = """
import os, runpy, socket, sys
from dirmq.server import direct, longpolls
from dirmq.store import direct_lease

GATE = "\\0" + os.environ["DIRMQ_TEST_GATE"]  # an abstract name

def tell(word, wait):
    with socket.socket(socket.AF_UNIX) as gate:
        gate.connect(GATE)
        gate.sendall(word)
        gate.shutdown(socket.SHUT_WR)
        if wait:
            gate.recv(1)  # b"" once the test closes its end

# Every create on the pool: the event loop stays free (timers, hang-ups) while one is held.
direct.INLINE_BELOW_S = 0.0
put_leased = direct_lease.DirectLeases.put_leased

def held_put_leased(self, leases, linked=None):
    if any(lease.message.body.startswith(b"hold") for lease in leases):
        tell(b"held", wait=True)
    return put_leased(self, leases, linked)

direct_lease.DirectLeases.put_leased = held_put_leased
take_waiter = longpolls.LongPolls.take_waiter

def told_take_waiter(self, admit):
    waiter = take_waiter(self, admit)
    if waiter is not None:  # taken by the direct path: told if it goes without its message
        waiter.future.add_done_callback(gone)
    return waiter

def gone(future):
    if future.cancelled() or not future.result():
        tell(b"gone", wait=False)

longpolls.LongPolls.take_waiter = told_take_waiter
sys.argv = ["dirmq", *sys.argv[3:]]  # the launcher's own name, "-m", "dirmq" dropped
runpy.run_module("dirmq", run_name="__main__", alter_sys=True)
"""


class Gate:
    """The test's end of the launcher's events: each is one connection, its word sent whole."""

    def __init__(self) -> None:
        self.name = f"dirmq-gate-{uuid.uuid4().hex}"  # abstract: no file, no length limit
        self.address = "\0" + self.name
        self._listener = socket.socket(socket.AF_UNIX)
        self._listener.bind(self.address)
        self._listener.listen(16)
        self._listener.settimeout(30)

    def next(self) -> tuple[bytes, socket.socket]:
        """The next event's word, and its connection (a held create goes on once it is
        closed)."""
        conn, _ = self._listener.accept()
        conn.settimeout(30)
        word = b""
        while chunk := conn.recv(64):
            word += chunk
        return word, conn

    def tell(self, word: bytes) -> None:
        """An event of the test's own (a publish answered), in the same order."""
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(self.address)
            conn.sendall(word)

    def close(self) -> None:
        self._listener.close()


@dataclass
class Gated:
    server: ServerProcess
    gate: Gate


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gated]:
    root = tmp_path_factory.mktemp("direct-gone")
    launcher = root.parent / f"{root.name}-launcher.py"
    launcher.write_text(_LAUNCHER)
    gate = Gate()
    try:
        server = start_server(root, launcher=[str(launcher)], env={"DIRMQ_TEST_GATE": gate.name})
        try:
            yield Gated(server, gate)
        finally:
            gate.close()  # a create still held goes on (its connection closed)
            assert server.stop() == 0, server.output
    finally:
        gate.close()
    assert "Traceback" not in server.output, server.output


def _counts(http: httpx.Client) -> tuple[float, float]:
    text = http.get("/metrics").text
    return (
        value(text, "dirmq_direct_deliveries_total") or 0.0,
        value(text, "dirmq_direct_released_total") or 0.0,
    )


@dataclass
class Held:
    publish: Future[httpx.Response]
    create: socket.socket  # closing it lets the create go on
    body: bytes


def _publish(url: str, queue: str, body: bytes, gate: Gate) -> httpx.Response:
    with httpx.Client(base_url=url, timeout=30) as http:
        published = http.post(f"/{queue}/messages", content=body)
    gate.tell(b"published")
    return published


def _until_held(
    gated: Gated, pool: ThreadPoolExecutor, queue: str, wait: Callable[[], Callable[[bytes], None]]
) -> Held:
    """`wait()` (a consumer starts waiting; it returns what takes and acknowledges a message
    delivered the usual way), then a publish: again until the publish found the consumer
    waiting and its create is held."""
    for attempt in range(ATTEMPTS):
        body = b"hold %d" % attempt
        usual = wait()
        publish = pool.submit(_publish, gated.server.url, queue, body, gated.gate)
        word, conn = gated.gate.next()
        if word == b"held":
            return Held(publish, conn, body)
        conn.close()
        assert word == b"published" and publish.result().status_code == 201
        usual(body)
    raise AssertionError(f"no publish of {ATTEMPTS} took the direct path")


def _given_back(
    gated: Gated, http: httpx.Client, queue: str, held: Held, counts: tuple[float, float]
) -> None:
    """The consumer has gone (the server said so): the create goes on, its publisher gets its
    201, and the message, given back, goes once to the next consumer."""
    word, conn = gated.gate.next()
    conn.close()
    assert word == b"gone"
    held.create.close()
    published = held.publish.result()
    word, conn = gated.gate.next()
    conn.close()
    assert word == b"published"
    assert published.status_code == 201
    message_id = published.headers["X-Message-Id"]
    delivered, released = counts
    assert _counts(http) == (delivered, released + 1)
    # Given back as a nack without delay gives it: ready, received once, no lease left.
    ready = gated.server.root / queue / layout.READY
    [name] = wait_until(lambda: os.listdir(ready), what=f"{message_id} back in @ready")
    assert name.partition("~")[0].split(".") == [message_id, "1"]
    assert not os.listdir(ready.parent / layout.LEASED)
    got = http.get(f"/{queue}/messages", params={"wait": "5"})
    assert got.status_code == 200 and got.content == held.body
    assert got.headers["X-Message-Id"] == message_id
    assert got.headers["X-Receive-Count"] == "2"
    assert http.delete(f"/{queue}/messages/{got.headers['X-Receipt']}").status_code == 204
    assert http.get(f"/{queue}/messages", params={"wait": "0"}).status_code == 204
    assert http.get(f"/{queue}").json()["stats"]["in_flight"] == 0
    assert _counts(http) == (delivered, released + 1)
    assert not fsck(gated.server.root, repair=False).problems


@pytest.mark.parametrize("hang_up", [False, True], ids=["wait-ended", "hung-up"])
def test_a_long_poll_gone_before_the_link_leaves_the_message_to_the_next(
    gated: Gated, hang_up: bool
) -> None:
    """The poll's wait ends (it is answered empty), or its client hangs up, while the create
    meant for it is held."""
    queue = fresh("direct-gone")
    wait_s = 30 if hang_up else 1  # a hang-up comes before the wait's end
    polls: list[RawPoll] = []
    with httpx.Client(base_url=gated.server.url, timeout=30) as http, ThreadPoolExecutor(1) as pool:
        assert http.put(f"/{queue}", json={"visibility_timeout_s": 30}).status_code == 201

        def wait() -> Callable[[bytes], None]:
            poll = RawPoll(gated.server.url, f"/{queue}/messages?wait={wait_s}")
            polls.append(poll)

            def usual(body: bytes) -> None:
                got = poll.answer()
                if got.status_code == 204:  # its wait was over before the publish came
                    got = http.get(f"/{queue}/messages", params={"wait": "5"})
                assert got.content == body
                assert (
                    http.delete(f"/{queue}/messages/{got.headers['X-Receipt']}").status_code == 204
                )

            return usual

        counts = _counts(http)
        held = _until_held(gated, pool, queue, wait)
        if hang_up:
            polls[-1].hang_up()
        else:
            assert polls[-1].answer().status_code == 204  # before its message was even written
        _given_back(gated, http, queue, held, counts)


def test_a_stream_closed_before_the_link_leaves_the_message_to_the_next(gated: Gated) -> None:
    """A stream consumer whose credit waited in the line closes while the create is held."""
    queue = fresh("direct-gone-stream")
    with (
        httpx.Client(base_url=gated.server.url, timeout=30) as http,
        ThreadPoolExecutor(1) as pool,
        RemoteStore(gated.server.url, timeout_s=10) as store,
    ):
        remote = store.create_queue(queue)
        consumer = remote.consume(prefetch=1)

        def wait() -> Callable[[bytes], None]:
            assert consumer.get(timeout_s=0.2) is None  # its credit waits in the line

            def usual(body: bytes) -> None:
                message = consumer.get(timeout_s=5)
                assert message is not None and message.body == body
                consumer.ack(message)

            return usual

        counts = _counts(http)
        try:
            held = _until_held(gated, pool, queue, wait)
        finally:
            consumer.close()
        _given_back(gated, http, queue, held, counts)
