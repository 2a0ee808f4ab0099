"""A get that loses the race for the head to another process (`QueueFiles.claim_many`): it
learns what the other took and goes on in FIFO order; losing again at once (the other is
leasing a batch of its own from there, step by step), it passes over the next names, which stay
the oldest in its index, and takes them itself when nothing else is left.

The other process is a second Store on the root, acting each time this one brings its index up
to date, so its index is behind at every claim that follows: the race, made deterministic."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.store.files import SKIP_AFTER_LOSS

MEMORY = dirmq.QueueConfig(durability="memory")


@pytest.fixture
def stores(root: Path) -> Iterator[tuple[dirmq.Store, dirmq.Store]]:
    with dirmq.Store(root) as here, dirmq.Store(root) as there:
        here.create_queue("q", MEMORY)
        yield here, there


def _race(
    monkeypatch: pytest.MonkeyPatch, here: dirmq.Queue, there: dirmq.Queue, syncs: int
) -> list[str]:
    """Make `there` lease the 3 oldest messages right after each of `here`'s first `syncs`
    index syncs; the ids it took."""
    synced = here._view.synced
    taken: list[str] = []

    def sync_then_lose() -> object:
        index = synced()
        if syncs > len(taken) // 3:
            taken.extend(m.id for m in there.get(3, visibility_s=60))
        return index

    monkeypatch.setattr(here._view, "synced", sync_then_lose)
    return taken


def test_a_get_that_lost_the_head_once_goes_on_in_order(
    stores: tuple[dirmq.Store, dirmq.Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = stores[0].queue("q"), stores[1].queue("q")
    ids = here.put_many([b"m%d" % i for i in range(200)])
    taken = _race(monkeypatch, here, there, syncs=1)
    got = [m.id for m in here.get(10)]
    assert taken == ids[:3]
    assert got == ids[3:13]


def test_a_get_that_keeps_losing_passes_over_names_it_takes_next(
    stores: tuple[dirmq.Store, dirmq.Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = stores[0].queue("q"), stores[1].queue("q")
    ids = here.put_many([b"m%d" % i for i in range(200)])
    taken = _race(monkeypatch, here, there, syncs=3)
    got = [m.id for m in here.get(10)]
    # Lost ids[0] (taken after the get's sync), synced, lost ids[3] (taken after that sync),
    # synced and passed over the next names as its index had them: ids[6:9] (taken after
    # that sync) among them.
    assert taken == ids[:9]
    assert got == ids[6 + SKIP_AFTER_LOSS : 16 + SKIP_AFTER_LOSS]
    passed = ids[9 : 6 + SKIP_AFTER_LOSS]
    monkeypatch.undo()
    rest = [m.id for m in here.get(1000)]
    assert rest[: len(passed)] == passed  # still the oldest
    assert sorted(taken + got + rest) == ids and len(set(taken + got + rest)) == 200


def test_what_was_passed_over_is_taken_when_nothing_else_is_left(
    stores: tuple[dirmq.Store, dirmq.Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A get never answers with less than is ready because it passed names over."""
    here, there = stores[0].queue("q"), stores[1].queue("q")
    ids = here.put_many([b"m%d" % i for i in range(20)])
    taken = _race(monkeypatch, here, there, syncs=3)
    got = [m.id for m in here.get(10)]
    assert taken == ids[:9]
    assert got == ids[9:19]
