"""A large body streamed to its file keeps its priority and its time to live (issue 35): the
level is in the file's name, the deadline in its head (written at publish, counted from
then), so such a publish no longer goes through the server's memory; delivered by priority
among small messages, expired as a small one is, and an upload cut short leaves nothing."""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

import httpx
import pytest

from dirmq.errors import InvalidArgument
from dirmq.store import OutgoingMessage, Queue, QueueConfig, Store, codec
from dirmq.store.backlog import SPILL_AT
from dirmq.store.fsck import fsck
from dirmq.store.streamed import StreamedFile

from .support.fixtures import serve
from .support.servers import ServerProcess
from .support.store_now import store_now
from .support.waiting import wait_until
from .test_large_bodies import (
    MIB,
    _body,
    _queue,
    assert_cut_upload_left_nothing,
    round_trip_peak_growth,
    upload_under_way,
)

server = serve("--max-body-bytes", "80MiB", yaq=True)


class Clock:
    """The store's clock, moved by the test."""

    def __init__(self, at_ms: int) -> None:
        self.at_ms = at_ms

    def now_ms(self) -> int:
        return self.at_ms


def _stream(
    queue: Queue, body: bytes, priority: int = 0, ttl_s: float | None = None
) -> StreamedFile:
    """A streamed file of `body`, written in uneven pieces, not yet published."""
    streamed = StreamedFile.create(queue, len(body), {}, priority=priority, ttl_s=ttl_s)
    for start in range(0, len(body), 300_001):
        streamed.write([body[start : start + 300_001]])
    return streamed


def _past(deadline_s: float) -> None:
    """Wait until the wall clock is past `deadline_s` (a TTL is wall-clock time: nothing
    happens when it runs out, the next claim finds it)."""
    wait_until(lambda: time.time() > deadline_s + 0.01, what="the TTL to run out")


# -- the store's streamed file -------------------------------------------------------------------
@pytest.mark.parametrize("own_ttl", [True, False])
@pytest.mark.parametrize("group", [None, "orders-1"])
def test_a_ranked_streamed_file_is_byte_for_byte_what_the_codec_writes(
    tmp_path: Path, group: str | None, own_ttl: bool
) -> None:
    """Its level in its name, its deadline in its head: the publish's time (not the upload's
    start) plus its time to live, its own or its queue's."""
    root = tmp_path / "root"
    config = QueueConfig(priority_levels=3, message_ttl_s=None if own_ttl else 90)
    queue = Store(root).create_queue("q", config)
    body = os.urandom(2 * MIB + 3)
    headers = {"Content-Type": "application/octet-stream", "X-Colour": "blé"}
    clock = Clock(1_795_000_000_000)
    with store_now(clock.now_ms):
        streamed = StreamedFile.create(
            queue, len(body), headers, group, priority=2, ttl_s=90 if own_ttl else None
        )
        clock.at_ms += 30_000  # the upload takes half a minute
        streamed.write([body])
        message_id = streamed.publish()
    (ready,) = (root / "q" / "@ready").iterdir()
    assert ready.name.startswith(message_id) and ready.name.split("~")[0].endswith("^2")
    system = {"Group": group} if group else {}
    system["Expires"] = str(clock.at_ms + 90_000)
    assert ready.read_bytes() == codec.encode(body, headers, system, message_id=message_id)
    with store_now(clock.now_ms):
        got = queue.get_one(visibility_s=60)
    assert got is not None and got.id == message_id and got.body == body
    assert got.priority == 2 and got.expires_at_s == (clock.at_ms + 90_000) / 1000
    assert not list((root / "q" / "@tmp").iterdir())
    assert fsck(root, repair=False).ok


def test_a_deadline_narrower_than_its_placeholder_is_zero_padded(tmp_path: Path) -> None:
    """A clock set back across a power of ten during the upload: the deadline written at
    publish has fewer digits than the placeholder, and still reads as itself."""
    queue = Store(tmp_path / "root").create_queue("q")
    clock = Clock(10**12 + 500)
    with store_now(clock.now_ms):
        streamed = _stream(queue, b"x" * MIB, ttl_s=1)
        clock.at_ms = 10**12 - 5_000
        message_id = streamed.publish()
        got = queue.get_one(visibility_s=60)
    assert got is not None and got.id == message_id
    assert got.expires_at_s == (10**12 - 4_000) / 1000
    (leased,) = (tmp_path / "root" / "q" / "@leased").iterdir()
    assert b"\nDirmq-Expires: 0999999996000\n" in leased.read_bytes()


def test_a_streamed_file_past_its_deadline_is_dead_lettered_or_dropped(tmp_path: Path) -> None:
    store = Store(tmp_path / "root")
    dlq = store.create_queue("dlq")
    dead_lettered = store.create_queue("dl", QueueConfig(dead_letter_queue="dlq"))
    dropped = store.create_queue("drop", QueueConfig(ttl_action="drop", message_ttl_s=1))
    body = _body(2 * MIB, seed=3)
    clock = Clock(1_795_000_000_000)
    with store_now(clock.now_ms):
        _stream(dead_lettered, body, ttl_s=1).publish()
        _stream(dropped, body).publish()  # the queue's time to live
        dead_lettered.put(b"small, no ttl")
        clock.at_ms += 1_000  # at the deadline: never delivered at or after it
        assert [m.body for m in dead_lettered.get(10, visibility_s=60)] == [b"small, no ttl"]
        assert dropped.get(10, visibility_s=60) == []
    (dead,) = dlq.get(10, visibility_s=60)
    assert dead.body == body and dead.dead is not None and dead.dead.reason == "ttl-expired"
    assert dead.expires_at_s is None  # a dead letter keeps no deadline
    stats = dropped.stats()
    assert (stats.ready, stats.dead, stats.total) == (0, 0, 0)
    assert fsck(tmp_path / "root", repair=False).ok


def test_a_streamed_file_goes_behind_its_levels_full_ready(tmp_path: Path) -> None:
    """@ready full at level 1: a streamed level-1 message goes to that level's backlog tree
    (after the small ones, as a small one would), a level-2 one into @ready, a delayed one into
    its due minute's bucket with its level in the name; delivered highest level first, each
    level in publish order."""
    root = tmp_path / "root"
    queue = Store(root).create_queue("q", QueueConfig(priority_levels=3, durability="memory"))
    small = [OutgoingMessage(b"%d" % n, priority=1) for n in range(SPILL_AT)]
    queue.put_many(small)
    behind = _stream(queue, _body(MIB, seed=1), priority=1).publish()
    ahead = _stream(queue, _body(MIB, seed=2), priority=2).publish()
    later = _stream(queue, _body(MIB, seed=4), priority=2).publish(delay_s=3600)
    (spilled,) = (root / "q" / "@backlog" / "p1").glob("*/*/*")
    assert spilled.name == f"{behind}^1"
    assert (root / "q" / "@ready" / f"{ahead}^2").exists()
    (delayed,) = (root / "q" / "@delayed").glob("*/*")
    assert delayed.name.startswith(later) and delayed.name.endswith("^2")
    order = [m.id for m in queue.get(SPILL_AT + 2, visibility_s=60)]
    order += [m.id for m in queue.get(10, visibility_s=60)]  # the rest, refilled
    assert order[0] == ahead and order[-1] == behind and len(order) == SPILL_AT + 2
    assert fsck(root, repair=False).ok


def test_a_priority_the_queue_lacks_is_refused_before_any_file_is_made(tmp_path: Path) -> None:
    queue = Store(tmp_path / "root").create_queue("q", QueueConfig(priority_levels=2))
    with pytest.raises(InvalidArgument, match="from 0 to 1"):
        StreamedFile.create(queue, MIB, {}, priority=2)
    with pytest.raises(InvalidArgument, match="ttl_s"):
        StreamedFile.create(queue, MIB, {}, ttl_s=0)
    assert not list((tmp_path / "root" / "q" / "@tmp").iterdir())


# -- through the server --------------------------------------------------------------------------
def test_large_and_small_bodies_are_delivered_by_priority_then_in_order(
    server: ServerProcess,
) -> None:
    _queue(server.url, "ranked", priority_levels=3)
    sent = [  # (priority, body): large ones streamed, small ones held
        (0, b"small low"),
        (2, _body(2 * MIB, seed=21)),
        (1, b"small mid"),
        (0, _body(2 * MIB, seed=22)),
        (1, _body(2 * MIB, seed=23)),
        (2, b"small high"),
    ]
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for priority, body in sent:
            posted = http.post("/ranked/messages", content=body, params={"priority": priority})
            assert posted.status_code == 201, posted.text
        got = []
        for _ in sent:
            answer = http.get("/ranked/messages")
            assert answer.status_code == 200
            got.append((int(answer.headers.get("x-priority", "0")), answer.content))
        assert http.get("/ranked/messages").status_code == 204
    expected = [m for level in (2, 1, 0) for m in sent if m[0] == level]
    assert got == expected
    assert fsck(server.root, repair=False).ok


@pytest.mark.parametrize("action", ["dead-letter", "drop"])
@pytest.mark.parametrize("whose", ["own", "queue"])
def test_a_large_body_past_its_ttl_is_taken_out_as_a_small_one(
    server: ServerProcess, whose: str, action: str
) -> None:
    name = f"ttl-{whose}-{action}"
    config: dict[str, object] = {"ttl_action": action}
    if action == "dead-letter":
        _queue(server.url, f"{name}-dlq")
        config["dead_letter_queue"] = f"{name}-dlq"
    if whose == "queue":
        config["message_ttl_s"] = 0.3
    _queue(server.url, name, **config)
    params = {"ttl": "300ms"} if whose == "own" else {}
    large = _body(2 * MIB, seed=31)
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for body in (large, b"small"):
            posted = http.post(f"/{name}/messages", content=body, params=params)
            assert posted.status_code == 201, posted.text
        _past(time.time() + 0.3)  # each deadline counts from its publish, before this
        assert http.get(f"/{name}/messages").status_code == 204
        if action == "dead-letter":
            dead = [http.get(f"/{name}-dlq/messages") for _ in range(2)]
            assert [d.content for d in dead] == [large, b"small"]
            assert {d.headers["x-dead-reason"] for d in dead} == {"ttl-expired"}
        else:
            stats = http.get(f"/{name}").json()["stats"]
            assert (stats["ready"], stats["dead"], stats["in_flight"]) == (0, 0, 0)


def test_a_yaq_enqueue_keeps_its_queues_ttl(server: ServerProcess) -> None:
    """yaq's enqueue streams into a queue that exists: its `message_ttl_s` is in the file."""
    assert server.yaq_url is not None
    _queue(server.url, "yaqttl", message_ttl_s=0.3, ttl_action="drop")
    with httpx.Client(base_url=server.yaq_url, timeout=60) as yaq:
        assert yaq.post("/yaqttl", content=_body(2 * MIB, seed=41)).status_code == 200
        _past(time.time() + 0.3)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/yaqttl/messages").status_code == 204
        stats = http.get("/yaqttl").json()["stats"]
        assert (stats["ready"], stats["dead"]) == (0, 0)


@pytest.mark.parametrize("door", ["native", "yaq"])
def test_a_ranked_upload_cut_short_leaves_no_message_and_no_temp_file(
    server: ServerProcess, door: str
) -> None:
    """With a priority and a time to live (yaq: its queue's) the body goes to its file as it
    arrives (the temp file shows it), and a client gone mid-body leaves nothing."""
    queue = f"cut-ranked-{door}"
    _queue(server.url, queue, priority_levels=3, message_ttl_s=3600)
    with upload_under_way(server, queue, door, "?priority=2&ttl=1h") as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    assert_cut_upload_left_nothing(server, queue)


def test_the_servers_memory_does_not_grow_with_a_ranked_body(tmp_path: Path) -> None:
    """A 48 MiB message with a priority and a time to live in and out: the server's peak RSS
    grows by a window, not by the body (it grew by twice the body when such a publish was
    read into memory)."""
    size = 48 * MIB
    grown, got = round_trip_peak_growth(
        tmp_path / "root", _body(size), {"priority": "1"}, priority_levels=2, message_ttl_s=3600
    )
    assert got.headers["x-priority"] == "1"
    assert grown < 24, f"the server's peak RSS grew by {grown} MiB for a {size // MIB} MiB body"
