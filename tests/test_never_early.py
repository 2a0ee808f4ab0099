"""A time from now is never early (store/clock.py): a lease taken by any way into one, or
extended, does not end before its visibility timeout is over.

Times in names are whole milliseconds, reached when the clock's millisecond, rounded down, gets
to them; so each test reads the clock 0.7 ms into a millisecond (tests/support/store_now.py),
where a time reckoned from the millisecond rounded down came up to 1 ms early, and moves it to
the last nanosecond before the time is over (nothing happens), then past it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import dirmq
from dirmq.store.direct_lease import DirectLease
from dirmq.store.message import Message

from .support.store_now import store_now_ns

MEMORY = dirmq.QueueConfig(durability="memory")
# Each odd in its way: a whole number of ms, less than one, and a part of one.
SECONDS = [0.2, 0.0005, 1.2345678]


class Clock:
    """The store's clock in ns, moved only by the test: 0.7 ms into the current millisecond."""

    def __init__(self) -> None:
        self.ns = time.time_ns() // 1_000_000 * 1_000_000 + 700_000

    def now_ns(self) -> int:
        return self.ns


@pytest.fixture
def clock() -> Iterator[Clock]:
    fake = Clock()
    with store_now_ns(fake.now_ns):
        yield fake


def _get(q: dirmq.Queue, visibility_s: float) -> Message:
    [message] = q.get(1, visibility_s=visibility_s)
    return message


def _get_of_group(q: dirmq.Queue, visibility_s: float) -> Message:
    [message] = q.get(1, visibility_s=visibility_s, max_per_group=1)
    return message


def _claim_named(q: dirmq.Queue, visibility_s: float) -> Message:
    [(_lease, message)] = q.claim_named(q.ready_names(1), visibility_s=visibility_s)
    return message


LEASES: dict[str, Callable[[dirmq.Queue, float], Message]] = {
    "get": _get,  # the usual head (files.claim_many in line)
    "get of a group": _get_of_group,  # files.claim
    "claim_named": _claim_named,  # files.take_named
}


@pytest.mark.parametrize("way", LEASES)
@pytest.mark.parametrize("visibility_s", SECONDS)
def test_a_lease_never_ends_before_its_visibility_timeout(
    store: dirmq.Store, clock: Clock, way: str, visibility_s: float
) -> None:
    q = store.create_queue("q", MEMORY)
    q.put_many([dirmq.OutgoingMessage(b"x", group="g" if way == "get of a group" else None)])
    leased_at = clock.ns
    message = LEASES[way](q, visibility_s)
    over_ns = leased_at + round(visibility_s * 1e9)
    assert message.lease_deadline_s is not None
    assert round(message.lease_deadline_s * 1000) * 1_000_000 >= over_ns
    clock.ns = over_ns - 1  # a nanosecond short: still leased
    assert q.get_one() is None
    clock.ns = over_ns + 1_000_000  # past it (whole ms: reached once the clock's ms gets there)
    again = q.get_one()
    assert again is not None and again.id == message.id and again.receive_count == 2


@pytest.mark.parametrize("visibility_s", SECONDS)
def test_a_direct_lease_never_ends_before_its_visibility_timeout(
    store: dirmq.Store, clock: Clock, visibility_s: float
) -> None:
    """The publish straight into a waiting consumer's lease (direct_lease.py)."""
    q = store.create_queue("q")
    outgoing = dirmq.OutgoingMessage(b"straight")
    q.validate(outgoing)
    assert q.direct.admits(outgoing, None)
    leased_at = clock.ns
    [message] = q.direct.put_leased([DirectLease(outgoing, visibility_s, None)])
    over_ns = leased_at + round(visibility_s * 1e9)
    assert message.lease_deadline_s is not None
    assert round(message.lease_deadline_s * 1000) * 1_000_000 >= over_ns
    clock.ns = over_ns - 1
    assert q.get_one() is None
    clock.ns = over_ns + 1_000_000
    again = q.get_one()
    assert again is not None and again.id == message.id


@pytest.mark.parametrize("visibility_s", SECONDS)
def test_an_extended_lease_never_ends_before_its_extension(
    store: dirmq.Store, clock: Clock, visibility_s: float
) -> None:
    q = store.create_queue("q", MEMORY)
    q.put(b"x")
    message = _get(q, 30)
    assert message.receipt is not None
    extended_at = clock.ns
    q.extend(message.receipt, visibility_s)
    over_ns = extended_at + round(visibility_s * 1e9)
    clock.ns = over_ns - 1
    assert q.get_one() is None
    clock.ns = over_ns + 1_000_000
    again = q.get_one()
    assert again is not None and again.id == message.id


def test_a_visibility_of_zero_leaves_the_message_to_the_next_get_at_once(
    store: dirmq.Store, clock: Clock
) -> None:
    """Rounded up, 0 s from 0.7 ms into a millisecond would be the next millisecond: 0 is now."""
    q = store.create_queue("q", MEMORY)
    q.put(b"x")
    first = _get(q, 0)
    again = q.get_one()  # the clock has not moved
    assert again is not None and again.id == first.id and again.receive_count == 2
    assert again.receipt is not None
    q.extend(again.receipt, 0)
    assert q.get_one() is not None
