"""Many real processes on one queue: nothing lost, nothing delivered twice, prompt wake-ups."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest

import dirmq

from .support.procs import kill, spawn

MESSAGES = 20_000
PRODUCERS = 4
CONSUMERS = 4


def test_four_producers_four_consumers_lose_nothing_and_duplicate_nothing(root: Path) -> None:
    dirmq.Store(root).create_queue("load")
    per_producer = MESSAGES // PRODUCERS
    consumers = [spawn("consume", root, "load", 3.0) for _ in range(CONSUMERS)]
    producers = [
        spawn("produce", root, "load", i * per_producer, per_producer, 1 if i == 0 else 25)
        for i in range(PRODUCERS)
    ]
    for p in producers:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0 and out.strip() == "done"
    received: Counter[str] = Counter()
    for c in consumers:
        out, _ = c.communicate(timeout=240)
        assert c.returncode == 0
        received.update(out.split())
    assert len(received) == MESSAGES, f"lost {MESSAGES - len(received)} messages"
    duplicates = [body for body, n in received.items() if n > 1]
    assert not duplicates, f"delivered twice: {duplicates[:10]}"
    assert set(received) == {str(n) for n in range(MESSAGES)}
    assert dirmq.Store(root).queue("load").stats().total == 0


def test_blocking_get_wakes_on_publish_from_another_process(store: dirmq.Store) -> None:
    q = store.create_queue("wake")
    consumer = spawn("consume", store.root, "wake", 5.0, "announce")
    assert consumer.stdout is not None
    assert consumer.stdout.readline() == "ready\n"  # started (however slowly), about to get
    q.put(b"ping")
    started = time.monotonic()
    # The consumer prints the body when it acks; it then waits idle_s for more and exits.
    line = consumer.stdout.readline().strip()
    latency = time.monotonic() - started
    kill(consumer)
    assert line == "ping"
    # Not woken, its get would have found the message only at the end of its 5 s wait.
    assert latency < 2.0


def test_delete_by_id_from_a_process_that_did_not_receive_it(store: dirmq.Store) -> None:
    q = store.create_queue("del")
    q.put(b"first")
    holder = spawn("hold", store.root, "del", 1, 60)
    assert holder.stdout is not None
    message_id = holder.stdout.readline().strip()
    assert holder.stdout.readline().strip() == "holding"
    assert q.delete(message_id), "delete by id must work on another process's lease"
    kill(holder)
    assert q.stats().total == 0


def test_ack_many_sees_what_another_store_did_to_the_leases(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ack_many syncs its index once per chunk. A lease that another store (process) extends
    right after that sync is still acked (looked up again), one it acks is reported stale, and
    the rest of the batch is acked all the same."""
    with dirmq.Store(root) as here, dirmq.Store(root) as there:
        here.create_queue("q")
        q_here, q_there = here.queue("q"), there.queue("q")
        for i in range(5):
            q_here.put(f"m{i}".encode())
        receipts = [m.receipt or "" for m in q_here.get(5, visibility_s=60)]
        synced = q_here._view.synced
        behind_its_back: list[str] = []

        def sync_then_change() -> object:
            index = synced()
            if not behind_its_back:  # once: between the chunk's sync and its acks
                q_there.extend(receipts[1], 120)
                q_there.ack(receipts[3])
                behind_its_back.append("done")
            return index

        monkeypatch.setattr(q_here._view, "synced", sync_then_change)
        failures = q_here.ack_many(receipts)
        assert behind_its_back == ["done"]
        assert list(failures) == [receipts[3]]
        assert isinstance(failures[receipts[3]], dirmq.StaleReceipt)
        monkeypatch.undo()
        stats = q_here.stats()
        assert (stats.ready, stats.in_flight) == (0, 0)
