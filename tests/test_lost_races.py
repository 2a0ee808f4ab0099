"""A get that loses the race for the head to another process (`QueueFiles.claim_many`) brings
its index up to date before its next claim, and goes on in FIFO order, passing nothing over.

The other process is a second Store on the root, leasing each time this one brings its index up
to date, so this one's index is behind at the claim that follows: the race, made
deterministic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dirmq

MEMORY = dirmq.QueueConfig(durability="memory")


@pytest.fixture
def queues(root: Path) -> Iterator[tuple[dirmq.Queue, dirmq.Queue]]:
    with dirmq.Store(root) as here, dirmq.Store(root) as there:
        here.create_queue("q", MEMORY)
        yield here.queue("q"), there.queue("q")


def _race(
    monkeypatch: pytest.MonkeyPatch, here: dirmq.Queue, there: dirmq.Queue, syncs: int
) -> tuple[list[str], list[int]]:
    """Make `there` lease the 3 oldest messages right after each of `here`'s first `syncs`
    index syncs: the ids it took, and how many syncs `here` made."""
    synced = here._view.synced
    taken: list[str] = []
    made = [0]

    def sync_then_lose() -> object:
        index = synced()
        made[0] += 1
        if made[0] <= syncs:
            taken.extend(m.id for m in there.get(3, visibility_s=60))
        return index

    monkeypatch.setattr(here._view, "synced", sync_then_lose)
    return taken, made


def test_a_get_that_lost_the_head_goes_on_in_order(
    queues: tuple[dirmq.Queue, dirmq.Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = queues
    ids = here.put_many([b"m%d" % i for i in range(200)])
    taken, syncs = _race(monkeypatch, here, there, syncs=1)
    got = [m.id for m in here.get(10)]
    assert taken == ids[:3]
    assert got == ids[3:13]
    assert syncs == [2]  # the get's own, and one after the race it lost


def test_a_get_that_keeps_losing_syncs_after_each_loss_and_passes_nothing_over(
    queues: tuple[dirmq.Queue, dirmq.Queue], monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = queues
    ids = here.put_many([b"m%d" % i for i in range(200)])
    taken, syncs = _race(monkeypatch, here, there, syncs=3)
    got = [m.id for m in here.get(10)]
    # Lost ids[0] (taken after the get's sync), synced; lost ids[3] (taken after that sync),
    # synced; lost ids[6], synced: then the oldest left.
    assert taken == ids[:9]
    assert got == ids[9:19]
    assert syncs == [4]
    monkeypatch.undo()
    rest = [m.id for m in here.get(1000)]
    assert taken + got + rest == ids  # every message once, oldest first
