"""What opening a queue reads of its capacity tokens (@slots) and delays (@delayed): a fresh
process's open and first get+ack counts every name a directory listing returns, by directory,
and a queue holding thousands of tokens or delays must cost what one holding a few does (the
O(head) property of tests/test_backlog.py, for the other directories an open used to list)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import CorruptConfig, QueueFull, QueueNotFound
from dirmq.store import layout

from .support.open_listing import listed_by_a_first_get


def _tokens(queue: dirmq.Queue) -> int:
    return len(os.listdir(Path(queue.path) / layout.SLOTS))


def test_an_open_lists_no_capacity_token(store: dirmq.Store) -> None:
    """A queue holding 900 capacity tokens costs a fresh consumer what the same queue without
    a capacity does: @slots is not listed on open (one entry read tells that tokens are in
    use). 900: all of them in @ready, whose head an open lists either way."""
    plain = store.create_queue("plain", dirmq.QueueConfig(durability="memory"))
    many = store.create_queue("many", dirmq.QueueConfig(durability="memory", capacity=10_000))
    bodies = [b"m%d" % i for i in range(900)]
    plain.put_many(bodies)
    many.put_many(bodies)
    assert _tokens(many) == 900
    listed_plain = listed_by_a_first_get(store.root, "plain")
    listed_many = listed_by_a_first_get(store.root, "many")
    assert listed_many.get(layout.SLOTS, 0) <= 1, listed_many
    assert sum(listed_many.values()) <= sum(listed_plain.values()) + 5, (listed_plain, listed_many)
    # The ack still freed its message's token, though this process never listed them.
    assert _tokens(many) == 899


def test_unlisted_tokens_still_bound_the_queue(store: dirmq.Store, tmp_path: Path) -> None:
    """A process that opened a full queue without listing its tokens frees a token with each
    ack, lists them at its first publish and refuses one over the capacity."""
    config = dirmq.QueueConfig(durability="memory", capacity=5)
    store.create_queue("full", config).put_many([b"a", b"b", b"c", b"d", b"e"])
    with dirmq.Store(store.root) as other:
        queue = other.queue("full")
        message = queue.get_one()
        assert message is not None and message.receipt is not None
        queue.ack(message.receipt)
        assert _tokens(queue) == 4
        queue.put(b"f")
        assert _tokens(queue) == 5
        with pytest.raises(QueueFull):
            queue.put(b"g", timeout_s=0)
        assert queue.stats().ready == 5


def test_an_open_lists_the_delays_head_not_all_of_them(store: dirmq.Store) -> None:
    """A queue holding 3,000 delayed messages (and one ready) costs a fresh consumer what one
    holding 10 does."""
    config = dirmq.QueueConfig(durability="memory", delay_s=3_600)
    few, many = store.create_queue("few", config), store.create_queue("many", config)
    few.put_many([b"d%d" % i for i in range(10)])
    for start in range(0, 3_000, 500):
        many.put_many([b"d%d" % i for i in range(start, start + 500)])
    few.put(b"now", delay_s=0)
    many.put(b"now", delay_s=0)
    listed_few = listed_by_a_first_get(store.root, "few")
    listed_many = listed_by_a_first_get(store.root, "many")
    assert sum(listed_many.values()) <= sum(listed_few.values()) + 50, (listed_few, listed_many)


def test_a_lazy_open_reads_the_configuration_at_first_use(store: dirmq.Store) -> None:
    """`Store.queue(lazy=True)` (the server's) checks that the queue exists and leaves its
    @queue.json to its first use: a bad one is told then, and a missing queue at once."""
    queue = store.create_queue("lazy")
    Path(queue.path, layout.CONFIG_FILE).write_text('{"visibility_timeout_s": 1e13}')
    with dirmq.Store(store.root) as other:
        opened = other.queue("lazy", lazy=True)
        with pytest.raises(CorruptConfig, match="visibility_timeout_s"):
            opened.get_one()
        with pytest.raises(QueueNotFound):
            other.queue("absent", lazy=True)
    Path(queue.path, layout.CONFIG_FILE).write_text('{"delay_s": 7}')
    with dirmq.Store(store.root) as other:
        assert other.queue("lazy", lazy=True).config.delay_s == 7
