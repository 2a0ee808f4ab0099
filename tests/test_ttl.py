"""Message time to live (issue 36): a message not delivered within its TTL reaches the
dead-letter queue with `X-Dead-Reason: ttl-expired` (or is dropped), and is never delivered
after it; on every door (library, CLI, native HTTP, batches), across a SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import dirmq
from dirmq.store.fsck import fsck

from .support.fixtures import http_client, serve
from .support.procs import kill, spawn
from .support.servers import fresh
from .support.waiting import wait_until

server = serve()
http = http_client()


def _past(deadline_s: float) -> None:
    """Wait until the wall clock is past `deadline_s` (a TTL is wall-clock time; nothing
    happens when it runs out: the next claim finds it)."""
    wait_until(lambda: time.time() > deadline_s + 0.01, what="the TTL to run out")


def test_an_expired_message_is_dead_lettered_never_delivered(tmp_path: Path) -> None:
    store = dirmq.Store(str(tmp_path / "root"))
    store.create_queue("dlq")
    queue = store.create_queue("jobs", dirmq.QueueConfig(dead_letter_queue="dlq"))
    queue.put(b"late", ttl_s=0.2)
    queue.put(b"kept")
    _past(time.time() + 0.2)
    assert [m.body for m in queue.get(10)] == [b"kept"]
    (dead,) = store.queue("dlq").get(10)
    assert dead.body == b"late"
    assert dead.dead is not None and (dead.dead.reason, dead.dead.source) == ("ttl-expired", "jobs")
    assert dead.expires_at_s is None  # a dead letter keeps no deadline: it is kept, redrivable


def test_the_queue_default_ttl_and_drop(tmp_path: Path) -> None:
    store = dirmq.Store(str(tmp_path / "root"))
    config = dirmq.QueueConfig(message_ttl_s=0.2, ttl_action="drop")
    queue = store.create_queue("jobs", config)
    queue.put(b"gone")
    queue.put(b"kept", ttl_s=60)  # a publish's own TTL wins over the queue's
    published = time.time()
    _past(published + 0.2)
    assert [m.body for m in queue.get(10)] == [b"kept"]
    stats = queue.stats()
    assert (stats.ready, stats.dead, stats.total) == (0, 0, 1)


def test_never_delivered_after_its_ttl_under_a_slow_consumer(tmp_path: Path) -> None:
    """More messages than the consumer reaches within their TTL (a rate limit slows it): each
    one delivered was claimed before its deadline; every other one is dead, as ttl-expired;
    none is lost. Nacked ones come back and expire too."""
    store = dirmq.Store(str(tmp_path / "root"))
    queue = store.create_queue(
        "jobs", dirmq.QueueConfig(delivery_rate_per_s=40, visibility_timeout_s=60)
    )
    ids = queue.put_many([dirmq.OutgoingMessage(b"%d" % n, ttl_s=1.0) for n in range(120)])
    delivered = set()
    end = time.time() + 2.5  # past every TTL; then until the rest is reached, bounded
    while time.time() < end or (queue.stats().ready and time.time() < end + 10):
        for message in queue.get(4, wait_s=0.2):
            claimed = (message.lease_deadline_s or 0) - 60
            assert message.expires_at_s is not None and claimed <= message.expires_at_s
            if int(message.body) % 10 == 0 and message.receive_count == 1:
                queue.nack(message.receipt or "")  # returned: it may still expire
                continue
            delivered.add(message.id)
            queue.ack(message.receipt or "")
    dead = {m.id: m for m in queue.browse(state="dead")}
    assert 0 < len(delivered) < len(ids)
    assert {m.dead.reason for m in dead.values() if m.dead} == {"ttl-expired"}
    assert delivered | set(dead) == set(ids) and not delivered & set(dead)


def test_native_x_ttl_reaches_the_dlq_with_its_reason(http: httpx.Client) -> None:
    queue, dlq = fresh("ttl"), fresh("ttl-dlq")
    http.put(f"/{dlq}").raise_for_status()
    http.put(f"/{queue}", json={"dead_letter_queue": dlq}).raise_for_status()
    http.post(f"/{queue}/messages", content=b"x-ttl", headers={"X-TTL": "300ms"})
    http.post(f"/{queue}/messages", params={"ttl": "0.3"}, content=b"query ttl")
    batch = b'{"body": "line ttl", "ttl": "300ms"}\n{"body": "no ttl"}\n'
    sent = http.post(
        f"/{queue}/messages", content=batch, headers={"Content-Type": "application/x-ndjson"}
    )
    assert sent.status_code == 201
    # Each TTL runs from its own publish, the last one before this answer (taken before the
    # first post, a loaded machine's later posts were still alive at the check).
    published = time.time()
    _past(published + 0.3)
    got = http.get(f"/{queue}/messages", params={"max": 10})
    assert b"no ttl" in got.content
    assert not [b for b in (b"x-ttl", b"query ttl", b"line ttl") if b in got.content]
    dead = [http.get(f"/{dlq}/messages", params={"wait": "2"}) for _ in range(3)]
    assert sorted(d.text for d in dead) == ["line ttl", "query ttl", "x-ttl"]
    assert {d.headers["x-dead-reason"] for d in dead} == {"ttl-expired"}
    assert {d.headers["x-dead-source"] for d in dead} == {queue}
    bad = http.post(f"/{queue}/messages", content=b"x", headers={"X-TTL": "soon"})
    assert bad.status_code == 400


def test_queue_ttl_over_http_and_the_cli(http: httpx.Client, server: object) -> None:
    queue = fresh("ttl-cli")
    answer = http.put(f"/{queue}", json={"message_ttl_s": 0.2, "ttl_action": "drop"})
    answer.raise_for_status()
    config = http.get(f"/{queue}").json()["config"]
    assert (config["message_ttl_s"], config["ttl_action"], config["paused"]) == (0.2, "drop", False)
    root = str(server.root)  # type: ignore[attr-defined]
    put = subprocess.run(
        [sys.executable, "-m", "dirmq", "--root", root, "put", queue, "--ttl", "1h"],
        input=b"long lived",
        capture_output=True,
        check=True,
    )
    http.post(f"/{queue}/messages", content=b"short lived")
    _past(time.time() + 0.2)
    got = http.get(f"/{queue}/messages", params={"max": 10})
    assert b"long lived" in got.content and b"short lived" not in got.content
    assert put.stdout.decode().strip().encode() in got.content  # its id, in the part's head
    assert http.get(f"/{queue}").json()["stats"]["dead"] == 0


@pytest.mark.parametrize("action", ["dead-letter", "drop"])
def test_sigkill_of_a_holder_past_the_ttl(tmp_path: Path, action: str) -> None:
    """A process holding leases of messages with a TTL is SIGKILLed; once the leases expire
    (after the TTL), the messages are never delivered: dead-lettered or dropped, fsck clean."""
    root = str(tmp_path / "root")
    store = dirmq.Store(root)
    queue = store.create_queue("jobs", dirmq.QueueConfig(ttl_action=action))
    # Started first: an interpreter that starts slower than the TTL would find them expired.
    holder = spawn("hold-on-go", root, "jobs", 5, 2.0, stdin=True)
    try:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline() == "ready\n"
        ids = queue.put_many([dirmq.OutgoingMessage(b"%d" % n, ttl_s=1.0) for n in range(5)])
        holder.stdin.write("go\n")
        holder.stdin.flush()
        held = []  # until it says it holds them (or ends)
        while (line := holder.stdout.readline()) not in ("holding\n", ""):
            held.append(line.strip())
    finally:
        kill(holder)
    assert sorted(held) == sorted(ids)
    wait_until(lambda: queue.stats().in_flight == 0 and not queue.get(10), what="the leases")
    dead = list(queue.browse(state="dead"))
    assert len(dead) == (5 if action == "dead-letter" else 0)
    assert queue.stats().total == 0
    assert fsck(root, repair=False).ok


def test_planned_claims_never_hand_out_an_expired_message(tmp_path: Path) -> None:
    """The Spark source's way (ready_names, claim_named or lease_named + read_leases): an
    expired message is dead-lettered there too, not returned."""
    store = dirmq.Store(str(tmp_path / "root"))
    queue = store.create_queue("planned")
    queue.put_many([dirmq.OutgoingMessage(b"late", ttl_s=0.1), dirmq.OutgoingMessage(b"kept")])
    queue.put_many([dirmq.OutgoingMessage(b"late too", ttl_s=0.1), dirmq.OutgoingMessage(b"ok")])
    _past(time.time() + 0.1)
    names = queue.ready_names()
    assert len(names) == 4
    claimed = queue.claim_named(names[:2])
    assert [m.body for _lease, m in claimed] == [b"kept"]
    leases = queue.lease_named(names[2:])
    assert [m.body for m in queue.read_leases(leases)] == [b"ok"]
    dead = list(queue.browse(state="dead"))
    assert sorted(m.body for m in dead) == [b"late", b"late too"]
    assert {m.dead.reason for m in dead if m.dead} == {"ttl-expired"}


def test_sigkill_of_a_consumer_while_it_expires_messages(tmp_path: Path) -> None:
    """A consumer SIGKILLed while its gets dead-letter expired messages: none is delivered, by it
    or after; each reaches the dead-letter queue (a kill between the copy and the retire may
    leave one in the source's @dead too: one copy too many, never none); fsck is clean."""
    root = str(tmp_path / "root")
    store = dirmq.Store(root)
    store.create_queue("dlq")
    config = dirmq.QueueConfig(dead_letter_queue="dlq", visibility_timeout_s=1)
    queue = store.create_queue("jobs", config)
    ids = queue.put_many([dirmq.OutgoingMessage(b"%d" % n, ttl_s=0.05) for n in range(400)])
    _past(time.time() + 0.05)
    consumer = spawn("consume", root, "jobs", 5)
    wait_until(lambda: store.queue("dlq").stats().ready > 20, what="dead letters")
    printed = kill(consumer)
    assert printed == ""  # it acked (was delivered) nothing
    wait_until(lambda: queue.stats().in_flight == 0, what="its leases to expire")
    assert queue.get(10) == []  # the rest, reached now: dead-lettered, not delivered
    dead = {m.id for m in store.queue("dlq").browse()} | {m.id for m in queue.browse(state="dead")}
    assert dead == set(ids)
    assert queue.stats().total == 0
    store.queue("dlq").sweep()  # a dead letter's temp the kill interrupted: recovery's
    assert fsck(root, repair=False).ok
