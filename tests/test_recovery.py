"""Recovery on open and by sweep, file recycling, and damaged configuration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dirmq
from dirmq.store import layout, ownpool

from .support.procs import kill, spawn


def test_sweep_reports_what_opening_the_queue_recovered(root: Path) -> None:
    q = dirmq.Store(root).create_queue("s", dirmq.QueueConfig(visibility_timeout_s=0))
    q.put(b"a")
    holder = spawn("hold", root, "s", 1, 0)
    assert holder.stdout is not None
    holder.stdout.readline()
    kill(holder)
    report = dirmq.Store(root).queue("s").sweep()
    assert report.leases_requeued == 1
    assert dirmq.Store(root).queue("s").sweep().leases_requeued == 0


def test_acked_files_are_recycled_for_later_puts(store: dirmq.Store) -> None:
    q = store.create_queue("r")
    q.put(b"first message")
    message = q.get_one()
    assert message is not None
    (leased,) = os.listdir(os.path.join(q.path, layout.LEASED))
    inode = os.stat(os.path.join(q.path, layout.LEASED, leased)).st_ino
    q.ack(message.receipt or "")
    assert ownpool.wait_reaped(5)  # blanked: only then may a put reuse it
    (own,) = os.listdir(os.path.join(q.path, layout.FREE))  # this process's own pool
    own_pool = os.path.join(q.path, layout.FREE, own)
    assert os.listdir(own_pool) == [message.id]
    new_id = q.put(b"second, a longer message body than the first")
    assert os.listdir(own_pool) == []
    assert os.stat(os.path.join(q.path, layout.READY, new_id)).st_ino == inode
    again = q.get_one()
    assert again is not None and again.body == b"second, a longer message body than the first"
    q.put(b"x")  # shorter than the recycled file's old content: truncated exactly
    q.ack(again.receipt or "")
    q.put(b"y")
    assert [m.body for m in q.get(5)] == [b"x", b"y"]


def test_large_files_are_not_recycled(store: dirmq.Store) -> None:
    q = store.create_queue("big")
    q.put(b"z" * (200 * 1024))
    message = q.get_one()
    assert message is not None
    q.ack(message.receipt or "")
    assert ownpool.wait_reaped(5)  # the reaper unlinks it
    assert [f for _, _, files in os.walk(os.path.join(q.path, layout.FREE)) for f in files] == []


def test_unreadable_configuration_is_a_clear_error(store: dirmq.Store) -> None:
    store.create_queue("c")
    Path(store.root, "c", layout.CONFIG_FILE).write_bytes(b"\xff\xfe")
    with pytest.raises(dirmq.ConfigError, match="'c'"):
        dirmq.Store(store.root).queue("c")
    Path(store.root, "c", layout.CONFIG_FILE).write_text('{"dead_letter_queue": "../x"}')
    with pytest.raises(dirmq.ConfigError, match="'c'"):
        dirmq.Store(store.root).queue("c")


def test_concurrent_publishers_with_one_dedup_id_store_one_message(root: Path) -> None:
    import threading

    dirmq.Store(root).create_queue("d")
    results: list[str] = []
    barrier = threading.Barrier(8)

    def publish() -> None:
        queue = dirmq.Store(root).queue("d")  # a Store each: as separate processes would
        barrier.wait()
        results.append(queue.put(b"once", dedup_id="same"))

    threads = [threading.Thread(target=publish) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    assert dirmq.Store(root).queue("d").stats().ready == 1
