"""Message priorities in the store (docs/FORMAT.md "Priorities"): the level in every name, one
heap per level in the index, one backlog tree per level, order across processes and kills."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import ConfigError, InvalidArgument
from dirmq.store import backlog, layout
from dirmq.store.fsck import fsck
from dirmq.store.message import OutgoingMessage

from .support.procs import REPO
from .support.waiting import wait_until

MEMORY = dirmq.QueueConfig(durability="memory", priority_levels=3)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


def _drain(queue: dirmq.Queue, batch: int = 10) -> list[dirmq.Message]:
    got: list[dirmq.Message] = []
    while messages := queue.get(batch):
        got += messages
        assert queue.ack_many([m.receipt or "" for m in messages]) == {}
    return got


def test_names_carry_the_level_and_level_zero_names_are_unchanged() -> None:
    message_id = "1716000000000000-0123456789ab"
    assert layout.ready_name(message_id, 0) == message_id
    assert layout.ready_name(message_id, 2, "a" * 12, 3) == f"{message_id}.2^3~{'a' * 12}"
    lease = layout.timed_name(message_id, 1, 99, None, "b" * 12, 9)
    assert lease == f"{message_id}.1.99+{'b' * 12}^9"
    entry = layout.parse_entry(lease)
    assert entry is not None and (entry.level, entry.holder, entry.at_ms) == (9, "b" * 12, 99)
    assert layout.parse_entry(f"{message_id}^0") is None  # level 0 is never written
    assert layout.parse_entry(f"{message_id}~{'a' * 12}^1") is None  # the level goes first


def test_higher_levels_first_fifo_within_a_level(store: dirmq.Store) -> None:
    q = store.create_queue("prio", MEMORY)
    sent = [(i, i % 3) for i in range(30)]
    ids = {q.put(b"%d" % i, priority=level): (i, level) for i, level in sent}
    got = _drain(q, 4)
    order = [ids[m.id] for m in got]
    assert order == sorted(sent, key=lambda s: (-s[1], s[0]))
    assert [m.priority for m in got] == [level for _i, level in order]


def test_a_bad_priority_is_refused_saying_the_range(store: dirmq.Store) -> None:
    q = store.create_queue("range", MEMORY)
    for bad in (3, -1, True, "1"):
        with pytest.raises(InvalidArgument, match="from 0 to 2"):
            q.put(b"x", priority=bad)  # type: ignore[arg-type]
    flat = store.create_queue("flat", dirmq.QueueConfig(durability="memory"))
    with pytest.raises(InvalidArgument, match="one priority level"):
        flat.put(b"x", priority=1)
    with pytest.raises(InvalidArgument):
        q.put_many([OutgoingMessage(b"a", priority=1), OutgoingMessage(b"b", priority=7)])
    assert q.stats().ready == 0  # nothing of a refused batch
    with pytest.raises(ConfigError, match="priority_levels"):
        dirmq.QueueConfig(priority_levels=11)
    with pytest.raises(ConfigError, match="priority_levels"):
        dirmq.QueueConfig(priority_levels=0)


def test_nack_expiry_and_delay_keep_the_level(store: dirmq.Store) -> None:
    q = store.create_queue("keep", MEMORY)
    low = q.put(b"low")
    high = q.put(b"high", priority=2)
    (m,) = q.get(1, visibility_s=30)
    assert (m.id, m.priority) == (high, 2)
    q.nack(m.receipt or "")  # back at level 2: ahead of the older level-0 message
    assert os.listdir(Path(q.path) / layout.READY).count(f"{high}.1^2") == 1
    (m,) = q.get(1, visibility_s=0.05)
    assert m.id == high
    delayed = q.put(b"later", priority=1, delay_s=0.05)
    names = [p.name for p in (Path(q.path) / layout.DELAYED).rglob("*") if p.is_file()]
    assert any(n.startswith(delayed) and n.endswith("^1") for n in names)
    # Both the lease and the delay fall due on the clock (not an event): the gets below then
    # find them in @ready at their levels, ahead of the level-0 message.
    due = (m.lease_deadline_s or 0) + 0.06
    wait_until(lambda: time.time() > due, 5.0, "the lease and the delay to fall due")
    got = []
    while len(got) < 3:
        for message in q.get(1, wait_s=2):
            got.append((message.id, message.priority))
            q.ack(message.receipt or "")
    assert got == [(high, 2), (delayed, 1), (low, 0)]  # the expired lease first, at its level


def test_lowering_the_levels_keeps_stored_messages_at_theirs(store: dirmq.Store) -> None:
    q = store.create_queue("lowered", MEMORY)
    low = q.put(b"low")
    high = q.put(b"high", priority=2)
    store.configure("lowered", priority_levels=1)
    q.reload_config()
    with pytest.raises(InvalidArgument):
        q.put(b"x", priority=2)
    assert [m.id for m in _drain(q)] == [high, low]


def test_deep_backlog_per_level_keeps_order(store: dirmq.Store) -> None:
    """5,000 messages per level with the thresholds as they are: each level spills into its
    own tree, and a full @ready of low messages never holds a high one back."""
    q = store.create_queue("deep", dirmq.QueueConfig(durability="memory", priority_levels=3))
    per_level = 5_000
    sent: dict[str, tuple[int, int]] = {}
    for level in (0, 1, 2):  # the highest last: behind full trees of the others
        for start in range(0, per_level, 1000):
            batch = [OutgoingMessage(b"%d" % i, priority=level) for i in range(start, start + 1000)]
            for i, message_id in enumerate(q.put_many(batch)):
                sent[message_id] = (level, start + i)
    tree = Path(q.path) / layout.BACKLOG
    assert sorted(os.listdir(tree)) != [] and {"p1", "p2"} <= set(os.listdir(tree))
    assert len(os.listdir(Path(q.path) / layout.READY)) == 3 * backlog.SPILL_AT
    assert q.stats().ready == 3 * per_level
    browsed = [m.id for m in q.browse(limit=None)]
    assert browsed == sorted(sent)  # @ready and every level's tree, in id order
    got = [sent[m.id] for m in _drain(q, 100)]
    assert got == sorted(sent.values(), key=lambda s: (-s[0], s[1]))
    # emptied (the last seconds' buckets, epochs and trees may stay a while, holding nothing)
    assert not any(backlog.occupied(q.path, level, 3) for level in (0, 1, 2))
    assert fsck(store.root, repair=False).ok


CONSUMER = """
import json, sys
import dirmq
root, name, out = sys.argv[1:4]
with dirmq.Store(root) as store:
    q = store.queue(name)
    got = []
    while True:
        messages = q.get(1, wait_s=1.0)
        if not messages:
            break
        for m in messages:
            got.append([m.id, m.priority])
            q.ack(m.receipt)
with open(out, "w") as f:
    json.dump(got, f)
"""


def test_eight_consumer_processes_take_each_message_once_highest_first(
    store: dirmq.Store, tmp_path: Path
) -> None:
    """8 processes drain a queue of 4 levels: every message once, none lost; each consumer
    sees the levels in descending order (all were published before any consumer started),
    and FIFO within a level."""
    q = store.create_queue("many", dirmq.QueueConfig(durability="memory", priority_levels=4))
    sent: dict[str, tuple[int, int]] = {}
    for i in range(2_000):
        level = (i * 7) % 4
        sent[q.put(b"%d" % i, priority=level)] = (level, i)
    outs = [tmp_path / f"c{n}.json" for n in range(8)]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CONSUMER, store.root, "many", str(out)], env=_env(), cwd=REPO
        )
        for out in outs
    ]
    for child in children:
        assert child.wait(timeout=300) == 0
    seen: list[str] = []
    for out in outs:
        got = json.loads(out.read_text())
        seen += [message_id for message_id, _level in got]
        levels = [level for _id, level in got]
        assert levels == sorted(levels, reverse=True)  # higher levels first, in each consumer
        for level in range(4):  # FIFO within a level, in each consumer
            ids = [message_id for message_id, lv in got if lv == level]
            assert ids == sorted(ids)
        assert all(sent[message_id][0] == level for message_id, level in got)
    assert sorted(seen) == sorted(sent)  # every message exactly once


WRITER = """
import sys
import dirmq
from dirmq.store.message import OutgoingMessage
root, name = sys.argv[1:3]
with dirmq.Store(root) as store:
    q = store.queue(name)
    n = 0
    while True:
        q.put_many([OutgoingMessage(b"x" * 300, priority=(n + k) % 3) for k in range(50)])
        n += 1
        if n == 1:
            print("stored", flush=True)
"""


def test_a_kill_during_priority_publishes_leaves_nothing_partial(
    store: dirmq.Store,
) -> None:
    q = store.create_queue(
        "killed", dirmq.QueueConfig(priority_levels=3, durability="writethrough")
    )
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, store.root, "killed"],
        env=_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline() == "stored\n"
    # Killed once every level spills into its own backlog tree: mid-publish, mid-bucket.
    tree = Path(q.path) / layout.BACKLOG
    wait_until(lambda: {"p1", "p2"} <= set(os.listdir(tree)), 120.0, "every level's tree")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    child.stdout.close()
    report = fsck(store.root, repair=False)
    assert report.ok, report
    got = _drain(q, 100)
    assert len(got) >= 3 * backlog.SPILL_AT
    levels = [m.priority for m in got]
    assert levels == sorted(levels, reverse=True)
    for level in range(3):  # FIFO within each level, through its tree
        ids = [m.id for m in got if m.priority == level]
        assert ids == sorted(ids)
    assert len({m.id for m in got}) == len(got)
    assert all(m.body == b"x" * 300 for m in got)
    assert fsck(store.root, repair=False).ok


def test_fsck_knows_the_levels_names_and_trees(store: dirmq.Store) -> None:
    q = store.create_queue("checked", MEMORY)
    batch = [OutgoingMessage(b"%d" % i, priority=2) for i in range(1_200)]
    ids = [*q.put_many(batch), q.put(b"low"), q.put(b"mid", priority=1)]
    q.get(1)  # a lease of level 2 in @leased
    assert fsck(store.root, repair=False).ok  # clean: every name and tree of the levels
    path = Path(q.path)
    behind = [name for _bucket, name in backlog.names(q.path)]
    assert behind and all(name.endswith("^2") for name in behind)
    # A level-2 message in level 0's tree goes home; a stray file in a level's tree is a
    # notice; a name with ^0 (never written) does not parse: not a message, set aside.
    moved = behind[-1]
    level0 = path / layout.BACKLOG / "/".join(backlog.bucket_of(moved))
    level0.mkdir(parents=True, exist_ok=True)
    os.rename(path / backlog.relative_dir(moved) / moved, level0 / moved)
    (path / layout.BACKLOG / "p2" / "junk").write_text("x")
    (path / layout.READY / f"{ids[-1]}^0").write_text("x")  # ^0 is never written
    report = fsck(store.root, repair=False)
    kinds = {(p.kind.name, os.path.basename(p.path)) for p in report.problems}
    assert ("MISNAMED", moved) in kinds, kinds
    assert ("STRAY", "junk") in kinds, kinds
    assert not report.ok
    repaired = fsck(store.root, repair=True)
    assert all(p.repaired for p in repaired.problems if p.kind.name != "STRAY"), repaired
    assert (path / backlog.relative_dir(moved) / moved).exists()
    (path / layout.BACKLOG / "p2" / "junk").unlink()
    assert fsck(store.root, repair=False).problems == ()
    assert not (path / layout.READY / f"{ids[-1]}^0").exists()


def test_dead_letters_and_redrive_keep_the_level(store: dirmq.Store) -> None:
    store.create_queue("jobs-dlq", MEMORY)
    jobs = store.create_queue(
        "jobs",
        dirmq.QueueConfig(durability="memory", priority_levels=3, dead_letter_queue="jobs-dlq"),
    )
    low, high = jobs.put(b"low"), jobs.put(b"high", priority=2)
    for message in jobs.get(2):
        jobs.dead_letter(message.receipt or "", "no")
    dlq = store.queue("jobs-dlq")
    assert [(m.id, m.priority) for m in dlq.browse(limit=None)] == [(low, 0), (high, 2)]
    assert dlq.redrive() == 2  # back where they died, at their levels
    assert [(m.id, m.priority) for m in jobs.get(2)] == [(high, 2), (low, 0)]
    here = store.create_queue("here", MEMORY)  # dead-lettered into its own @dead
    kept = here.put(b"k", priority=1)
    (message,) = here.get(1)
    here.dead_letter(message.receipt or "")
    assert [m.priority for m in here.browse(state="dead", limit=None)] == [1]
    assert here.redrive() == 1
    assert [(m.id, m.priority) for m in here.get(1)] == [(kept, 1)]


def test_purge_and_delete_reach_every_levels_tree(store: dirmq.Store) -> None:
    q = store.create_queue("purged", MEMORY)
    ids = q.put_many([OutgoingMessage(b"a", priority=1) for _ in range(1_500)])
    ids += q.put_many([OutgoingMessage(b"b") for _ in range(1_500)])
    tree = Path(q.path) / layout.BACKLOG
    assert "p1" in os.listdir(tree)
    assert q.peek(ids[1_499]).priority == 1  # by id, in its level's tree
    assert q.delete(ids[1_499])
    assert q.purge() == 2_999
    assert os.listdir(tree) == []  # every tree, epoch and bucket removed
    q.put(b"after", priority=1)  # an empty backlog: straight into @ready again
    assert [n for n in os.listdir(Path(q.path) / layout.READY)] != []
    assert q.stats().ready == 1


def test_a_group_across_levels_is_leased_one_at_a_time_higher_level_first(
    store: dirmq.Store,
) -> None:
    q = store.create_queue("grouped", MEMORY)
    older = q.put_many([OutgoingMessage(b"old", group="g")])[0]
    newer = q.put_many([OutgoingMessage(b"new", group="g", priority=2)])[0]
    other = q.put(b"other")
    (first,) = q.get(1)
    assert (first.id, first.priority) == (newer, 2)
    assert [m.id for m in q.get(5)] == [other]  # the group is held while its message is out
    q.ack(first.receipt or "")
    assert [m.id for m in q.get(5)] == [older]
