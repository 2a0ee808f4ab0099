"""Crash safety with real SIGKILLs: leases come back, no partial message is ever visible,
no acknowledged message comes back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dirmq
from dirmq.store import layout
from dirmq.store.fsck import fsck
from dirmq.store.layout import parse_entry
from dirmq.store.processes import ProcessIdentity, current

from .support.pool_workers import kill_reading_all
from .support.procs import kill, spawn


def test_killed_consumer_leases_return_in_fifo_place(store: dirmq.Store) -> None:
    q = store.create_queue("work")
    ids = [q.put(f"m{i}".encode()) for i in range(10)]
    holder = spawn("hold", store.root, "work", 3, 1.0)
    assert holder.stdout is not None
    held = [holder.stdout.readline().strip() for _ in range(3)]
    assert holder.stdout.readline().strip() == "holding"
    kill(holder)
    assert held == ids[:3]
    later = q.get(7, visibility_s=60)
    assert [m.id for m in later] == ids[3:]
    started = time.monotonic()
    first_back = q.get_one(wait_s=5)  # wakes when the dead consumer's leases expire
    assert first_back is not None and first_back.id == ids[0]
    assert time.monotonic() - started < 1.5
    for message in later:
        q.nack(message.receipt or "")
    rest = q.get(10)
    assert [m.id for m in rest] == ids[1:], "requeued messages must keep their FIFO place"
    assert [m.receive_count for m in [first_back, *rest]] == [2, 2, 2] + [2] * 7


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared-mode"])
def test_killed_producer_never_exposes_a_partial_message(root: Path, shared: bool) -> None:
    """Killed while writing single, delayed and batched puts: in the shared-filesystem mode the
    temps sit beside their final names in @ready and @delayed (layout.temp_beside), and opening
    the queue removes those of the dead writer."""
    size = 512 * 1024
    confirmed: list[str] = []
    with dirmq.Store(root) as setup:
        setup.create_queue("big")
    for delay_s in (0.05, 0.13, 0.21, 0.3, 0.42):
        writer = spawn("write", root, "big", size, *(["shared"] if shared else []))
        # Its first stored message says it is writing (a slow start under load must not let
        # the kill land before any put): then kill it mid-stream, `delay_s` later.
        assert writer.stdout is not None
        first = writer.stdout.readline()
        assert first, "the writer ended before storing a message"
        confirmed.extend(first.split())
        time.sleep(delay_s)
        out = kill(writer)
        confirmed.extend(out.split())
    assert confirmed, "the writer never got a message stored"
    with dirmq.Store(root, shared=shared) as store:
        q = store.queue("big")
        q.sweep()
        buckets = [f"{layout.DELAYED}/{b}" for b in os.listdir(Path(q.path) / layout.DELAYED)]
        for state in (layout.TMP, layout.READY, *buckets):
            temps = [n for n in os.listdir(os.path.join(q.path, state)) if not parse_entry(n)]
            assert not temps, f"orphaned temp files remain in {state}: {temps}"
        time.sleep(0.25)  # the delayed ones come due
        seen = {}
        while (message := q.get_one()) is not None:
            assert len(message.body) == size, "a partial message was delivered"
            seen[message.id] = message
            q.ack(message.receipt or "")
        missing = set(confirmed) - set(seen)
        assert not missing, f"put returned but the message is gone: {sorted(missing)[:5]}"
        assert not os.listdir(os.path.join(q.path, layout.CORRUPT))
        report = fsck(root, repair=False)
        assert not report.problems, report.problems


def test_killed_acker_never_gets_an_acked_message_back(store: dirmq.Store) -> None:
    q = store.create_queue("acks", dirmq.QueueConfig(visibility_timeout_s=0.5))
    ids = set(q.put_many([str(i).encode() for i in range(400)]))
    acker = spawn("ack", store.root, "acks")
    assert acker.stdout is not None
    acked = [acker.stdout.readline().strip() for _ in range(150)]
    acked += kill_reading_all(acker).split()
    time.sleep(0.6)  # the killed process's last lease, if any, expires
    remaining = []
    while (message := q.get_one()) is not None:
        remaining.append(message.id)
        q.ack(message.receipt or "")
    assert not set(acked) & set(remaining), "an acknowledged message was delivered again"
    # At most one message can be in between: acked by the killed process but not yet reported.
    assert len(ids - set(acked) - set(remaining)) <= 1


def test_sweep_on_open_after_kill_requeues_and_cleans(root: Path) -> None:
    store = dirmq.Store(root)
    q = store.create_queue("s")
    q.put(b"a")
    holder = spawn("hold", root, "s", 1, 0.2)
    assert holder.stdout is not None
    holder.stdout.readline()
    holder.stdout.readline()
    kill(holder)
    # a temp file left by a dead process (one that never touched the queue)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    writer = ProcessIdentity(layout.HOST_TAG, current().pid_ns, dead.pid, 0)
    orphan = os.path.join(q.path, layout.TMP, f"{dirmq.store.ids.new_id()}.{writer.token()}.tmp")
    Path(orphan).write_bytes(b"partial")
    time.sleep(0.3)
    reopened = dirmq.Store(root).queue("s")
    assert reopened.stats().ready == 1  # opening recovers: the dead lease is ready again
    assert not os.path.exists(orphan), "opening the queue removes a dead writer's temp file"
    message = reopened.get_one()
    assert message is not None and message.receive_count == 2
