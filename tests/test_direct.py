"""The direct path (server/direct.py, store/direct_lease.py) on a real server: a publish that
finds a consumer waiting in the same worker is stored straight into its lease. That it took the
path is read from /metrics (`dirmq_direct_deliveries_total`); a publish the path must not take
leaves that count alone and is delivered the usual way. A SIGKILL at the moment the lease file
appears loses nothing: the message comes back once its lease expires, once, and fsck is clean."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.client import RemoteStore
from dirmq.store import layout, watch
from dirmq.store.direct_lease import DirectLease
from dirmq.store.fsck import fsck

from .support.fixtures import http_client, serve
from .support.metrics_helpers import value
from .support.raw_poll import RawPoll
from .support.servers import ServerProcess, fresh, start_server

server = serve()
http = http_client()
ATTEMPTS = 20  # a poll must be waiting when the publish comes: tried again until one is


def _direct(http: httpx.Client) -> float:
    return value(http.get("/metrics").text, "dirmq_direct_deliveries_total") or 0.0


def _poll_and_publish(
    server: ServerProcess, http: httpx.Client, queue: str, body: bytes, **publish: str
) -> tuple[httpx.Response, httpx.Response]:
    poll = RawPoll(server.url, f"/{queue}/messages?wait=10")
    published = http.post(f"/{queue}/messages", content=body, params=publish)
    return published, poll.answer()


def _until_direct(
    server: ServerProcess, http: httpx.Client, queue: str, ack: bool = True
) -> tuple[httpx.Response, httpx.Response]:
    """A publish to a waiting long poll, again until one went the direct way (its delivery
    acknowledged unless `ack` is false)."""
    for attempt in range(ATTEMPTS):
        before = _direct(http)
        published, got = _poll_and_publish(server, http, queue, b"probe %d" % attempt)
        assert published.status_code == 201 and got.status_code == 200
        assert got.content == b"probe %d" % attempt
        if _direct(http) == before + 1:
            if ack:
                assert (
                    http.delete(f"/{queue}/messages/{got.headers['X-Receipt']}").status_code == 204
                )
            return published, got
        assert http.delete(f"/{queue}/messages/{got.headers['X-Receipt']}").status_code == 204
    raise AssertionError(f"no publish of {ATTEMPTS} took the direct path")


def _ack(http: httpx.Client, queue: str, got: httpx.Response) -> None:
    assert http.delete(f"/{queue}/messages/{got.headers['X-Receipt']}").status_code == 204


def test_a_waiting_long_poll_gets_a_publish_through_the_direct_path(
    server: ServerProcess, http: httpx.Client
) -> None:
    queue = fresh("direct-poll")
    http.put(f"/{queue}", json={"visibility_timeout_s": 30})
    published, got = _until_direct(server, http, queue, ack=False)
    assert got.headers["X-Message-Id"] == published.headers["X-Message-Id"]
    assert got.headers["X-Receive-Count"] == "1"
    # An ordinary lease in every way: what the store lists, and the ack of its receipt.
    leased = os.listdir(server.root / queue / layout.LEASED)
    assert [name.split(".")[:2] for name in leased] == [[published.headers["X-Message-Id"], "1"]]
    assert not os.listdir(server.root / queue / layout.READY)
    _ack(http, queue, got)
    assert http.get(f"/{queue}").json()["stats"]["in_flight"] == 0
    assert not fsck(server.root, repair=False).problems


def test_a_stream_consumer_gets_a_publish_through_the_direct_path(
    server: ServerProcess, http: httpx.Client
) -> None:
    queue = fresh("direct-stream")
    before = _direct(http)
    with RemoteStore(server.url, timeout_s=10) as store:
        remote = store.create_queue(queue)
        with remote.consume(prefetch=10) as consumer:
            received = []
            for i in range(ATTEMPTS):
                assert consumer.get(timeout_s=0.2) is None  # its credit waits in the line
                remote.put(b"m%d" % i)
                message = consumer.get(timeout_s=5)
                assert message is not None and message.receive_count == 1
                received.append(message.body)
                consumer.ack(message)
                if _direct(http) > before:
                    break
    assert received == [b"m%d" % i for i in range(len(received))]
    assert _direct(http) > before, f"no publish of {ATTEMPTS} took the direct path"


def test_a_stream_with_credit_takes_a_burst_of_publishes_directly(
    server: ServerProcess, http: httpx.Client
) -> None:
    """A stream's wait stays in the line while it has credit (waiter.SideDelivery): every
    publish of a burst is leased straight for it, not only the first while the stream waits
    again. Its credit over what one lease call on the event loop takes (256) too: a wake-up's
    look for it runs there, not on a pool thread, during which the path could not take it."""
    queue = fresh("direct-burst")
    burst = 8
    with RemoteStore(server.url, timeout_s=10) as store:
        remote = store.create_queue(queue)
        with remote.consume(prefetch=300) as consumer:
            assert consumer.get(timeout_s=0.3) is None  # its credit waits in the line
            before = _direct(http)
            start = threading.Barrier(burst)

            def publish(i: int) -> int:
                with httpx.Client(base_url=server.url, timeout=10) as client:
                    client.get("/health")  # connected before the burst
                    start.wait()
                    return client.post(f"/{queue}/messages", content=b"b%d" % i).status_code

            with ThreadPoolExecutor(burst) as pool:
                assert list(pool.map(publish, range(burst))) == [201] * burst
            got = [consumer.get(timeout_s=5) for _ in range(burst)]
            assert sorted(m.body for m in got if m is not None) == sorted(
                b"b%d" % i for i in range(burst)
            )
            assert _direct(http) == before + burst
            for message in got:
                assert message is not None
                consumer.ack(message)


def test_two_streams_with_credit_take_publishes_in_turn(
    server: ServerProcess, http: httpx.Client
) -> None:
    """A stream that stays in the line once served goes to its back: a second stream of the
    queue gets its turn, as when each waited again after its delivery."""
    queue = fresh("direct-turns")
    with RemoteStore(server.url, timeout_s=10) as store:
        remote = store.create_queue(queue)
        with remote.consume(prefetch=20) as first, remote.consume(prefetch=20) as second:
            assert first.get(timeout_s=0.3) is None and second.get(timeout_s=0.3) is None
            for i in range(10):
                remote.put(b"t%d" % i)
            taken: list[list[bytes]] = [[], []]
            for _ in range(10):
                for n, consumer in enumerate((first, second)):
                    message = consumer.get(timeout_s=0.05)
                    if message is not None:
                        taken[n].append(message.body)
                        consumer.ack(message)
            for _ in range(10):  # the rest, if any came late
                if sum(map(len, taken)) == 10:
                    break
                for n, consumer in enumerate((first, second)):
                    message = consumer.get(timeout_s=1)
                    if message is not None:
                        taken[n].append(message.body)
                        consumer.ack(message)
    assert sorted(taken[0] + taken[1]) == sorted(b"t%d" % i for i in range(10))
    assert len(taken[0]) >= 3 and len(taken[1]) >= 3, taken


def test_fifo_kept_when_something_is_ready(server: ServerProcess, http: httpx.Client) -> None:
    """A poll waits while a group's next message is held back by its leased head: a publish
    then finds something ready and goes the usual way, behind it."""
    queue = fresh("direct-fifo")
    http.put(f"/{queue}", json={"visibility_timeout_s": 30})
    _until_direct(server, http, queue)  # this poll and publish do take it on this queue
    for body in (b"g1", b"g2"):
        http.post(f"/{queue}/messages", content=body, params={"group": "g"})
    head = http.get(f"/{queue}/messages", params={"wait": "0"})
    assert head.content == b"g1"
    before = _direct(http)
    published, got = _poll_and_publish(server, http, queue, b"later")
    assert published.status_code == 201
    assert got.content == b"later"  # g2 is ready but its group held: FIFO of what may go
    assert _direct(http) == before


@pytest.mark.parametrize(
    ("setting", "publish"),
    [
        ({"paused": True}, {}),
        ({"delivery_rate_per_s": 1000}, {}),
        ({}, {"delay": "0.2s"}),
    ],
    ids=["paused", "rate", "delay"],
)
def test_paused_rate_and_delay_fall_back(
    server: ServerProcess, http: httpx.Client, setting: dict[str, object], publish: dict[str, str]
) -> None:
    queue = fresh("direct-fallback")
    http.put(f"/{queue}", json={"visibility_timeout_s": 30})
    _until_direct(server, http, queue)
    if setting:
        assert http.put(f"/{queue}", json=setting).status_code == 200
    before = _direct(http)
    poll = RawPoll(server.url, f"/{queue}/messages?wait=2")
    assert http.post(f"/{queue}/messages", content=b"x", params=publish).status_code == 201
    got = poll.answer()
    if setting.get("paused"):
        assert got.status_code == 204  # nothing delivered while paused
        http.put(f"/{queue}", json={"paused": False})
        got = http.get(f"/{queue}/messages", params={"wait": "5"})
    assert got.status_code == 200 and got.content == b"x"
    assert _direct(http) == before


def test_a_priority_below_what_may_be_ready_falls_back(
    server: ServerProcess, http: httpx.Client
) -> None:
    """With a high message ready (held back by its group), a low one is not delivered ahead
    of it by the direct path: it goes to @ready, and the poll gets it there."""
    queue = fresh("direct-priority")
    http.put(f"/{queue}", json={"visibility_timeout_s": 30, "priority_levels": 3})
    _until_direct(server, http, queue)
    for body in (b"h1", b"h2"):
        http.post(f"/{queue}/messages", content=body, params={"group": "g", "priority": "2"})
    assert http.get(f"/{queue}/messages", params={"wait": "0"}).content == b"h1"
    before = _direct(http)
    published, got = _poll_and_publish(server, http, queue, b"low")
    assert published.status_code == 201 and got.content == b"low"
    assert _direct(http) == before


def _watch(*directories: Path) -> tuple[int, dict[int, str]]:
    fd = int(watch._libc.inotify_init1(watch.IN_CLOEXEC))
    assert fd >= 0
    wds = {
        watch.add_watch(fd, str(d), watch.IN_CREATE | watch.IN_MOVED_TO): d.name
        for d in directories
    }
    return fd, wds


def _publish_and_kill_at_the_create(
    running: ServerProcess, http: httpx.Client, body: bytes
) -> bool:
    """Publish `body` to a waiting poll; if its file appears in @leased first (the direct path),
    SIGKILL the server at once and say True. If it appears in @ready first (the poll was not
    waiting yet: the usual path), take and acknowledge it and say False."""
    queue = running.root / "crash"
    fd, wds = _watch(queue / layout.LEASED, queue / layout.READY)
    first: list[str] = []

    def kill_if_direct() -> None:
        data = os.read(fd, 4096)
        first.append(wds[int.from_bytes(data[:4], "little", signed=True)])
        if first[0] == layout.LEASED:
            os.kill(running.proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_if_direct)
    killer.start()
    try:
        poll = RawPoll(running.url, "/crash/messages?wait=10")
        try:
            http.post("/crash/messages", content=body)
        except httpx.HTTPError:
            pass
        killer.join(timeout=10)
    finally:
        os.close(fd)
    try:
        got = poll.answer()
    except OSError:
        return True  # killed before it could answer
    if first == [layout.LEASED]:
        return True  # killed after its answers: still a lease nobody acknowledged
    assert got.content == body
    _ack(http, "crash", got)
    return False


def test_sigkill_between_the_create_and_the_answers_loses_nothing(tmp_path: Path) -> None:
    """The server is killed as soon as the lease file appears (before its directory fsync and
    both answers, most often): neither client hears back, and the message, leased once, comes
    back when its lease expires and is delivered exactly once more. fsck finds nothing wrong."""
    running = start_server(tmp_path / "root")
    try:
        with httpx.Client(base_url=running.url, timeout=10) as http:
            http.put("/crash", json={"visibility_timeout_s": 1})
            for attempt in range(ATTEMPTS):
                body = b"in the balance %d" % attempt
                if _publish_and_kill_at_the_create(running, http, body):
                    break
            else:
                pytest.fail(f"no publish of {ATTEMPTS} took the direct path")
        running.proc.wait(timeout=10)
    finally:
        running.stop(signal.SIGKILL)
    with dirmq.Store(running.root) as store:
        q = store.queue("crash")
        message = q.get_one(wait_s=5)  # once its lease (1 s) expires
        assert message is not None and message.body == body
        assert message.receive_count == 2
        q.ack(message.receipt or "")
        assert q.get_one(wait_s=1.5) is None, "delivered twice"
    assert not fsck(running.root, repair=False).problems


def test_the_store_admits_only_what_keeps_every_promise(tmp_path: Path) -> None:
    """`DirectLeases.admits`, each rule on its own, in the library (no server)."""
    with dirmq.Store(tmp_path / "root") as store:
        q = store.create_queue("q", dirmq.QueueConfig(priority_levels=3))

        def admits(message: dirmq.OutgoingMessage, durability: str | None = None) -> bool:
            q.validate(message)
            return q.direct.admits(message, durability)

        assert admits(dirmq.OutgoingMessage(b"plain"))
        assert not q.direct.admits(dirmq.OutgoingMessage(b"never validated"), None)
        assert not admits(dirmq.OutgoingMessage(b"g", group="g"))
        assert not admits(dirmq.OutgoingMessage(b"d", dedup_id="d"))
        assert not admits(dirmq.OutgoingMessage(b"later", delay_s=1))
        assert not admits(dirmq.OutgoingMessage(b"wb"), "writeback")
        assert admits(dirmq.OutgoingMessage(b"ttl", ttl_s=0.5, priority=2))
        q.put(b"ready")
        assert not admits(dirmq.OutgoingMessage(b"behind a ready one", priority=2))
        got = q.get_one()
        assert got is not None
        for setting in ({"paused": True}, {"delivery_rate_per_s": 5.0}, {"capacity": 10}):
            store.configure("q", **setting)
            q.reload_config()
            assert not admits(dirmq.OutgoingMessage(b"x")), setting
            store.configure("q", paused=False, delivery_rate_per_s=None, capacity=None)
        q.reload_config()
        message = dirmq.OutgoingMessage(b"now", ttl_s=60)
        assert admits(message)
        [leased] = q.direct.put_leased([DirectLease(message, 0.2, "alice")])
        assert (leased.receive_count, leased.state, leased.body) == (1, "leased", b"now")
        assert leased.expires_at_s is not None
        [browsed] = [m for m in q.browse(state="leased") if m.id == leased.id]
        assert browsed.holder is not None and browsed.holder.label == "alice"
        again = q.get_one(wait_s=2)  # its lease (0.2 s) expired: ready again, as any lease
        assert again is not None and again.id == leased.id and again.receive_count == 2
        q.ack(again.receipt or "")
        pair = [dirmq.OutgoingMessage(b"one"), dirmq.OutgoingMessage(b"two")]
        both = q.direct.put_leased([DirectLease(m, None, None) for m in pair])  # one commit
        assert [m.body for m in both] == [b"one", b"two"] and both[0].id < both[1].id
        assert q.ack_each(m.receipt or "" for m in both) == {}
    assert not fsck(tmp_path / "root", repair=False).problems
