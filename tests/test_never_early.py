"""A time from now is never early (store/clock.py): a lease taken by any way into one, or
extended, does not end before its visibility timeout is over, and pub/sub's deadlines (process,
heartbeat, accept) and backoffs do not pass before their seconds are over.

Times in names are whole milliseconds, reached when the clock's millisecond, rounded down, gets
to them; so each test reads the clock 0.7 ms into a millisecond (tests/support/store_now.py),
where a time reckoned from the millisecond rounded down came up to 1 ms early, and moves it to
the last nanosecond before the time is over (nothing happens), then past it.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import dirmq
from dirmq.pubsub import PubSub
from dirmq.pubsub import policy as pubsub_policy
from dirmq.pubsub.layout import PubSubPaths, split_entry
from dirmq.store.direct_lease import DirectLease
from dirmq.store.message import Message
from dirmq.store.streamed import StreamedFile

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


# -- pub/sub -------------------------------------------------------------------------------------
class _NoJitter(random.Random):
    def random(self) -> float:
        return 0.0  # the backoff in full: its end is known to the nanosecond


@pytest.fixture
def hub(store: dirmq.Store, monkeypatch: pytest.MonkeyPatch) -> PubSub:
    monkeypatch.setattr(pubsub_policy, "random", _NoJitter())
    hub = PubSub(store, sweep_interval_s=3600)
    # Its first sweep now, none later: a subscription's heartbeat thread sweeping between a
    # move of the clock and the test's look would abort a delivery the test expects to.
    hub.maybe_sweep()
    return hub


@pytest.mark.parametrize("mode", ["anyone", "future"])
@pytest.mark.parametrize("backoff_s", SECONDS)
def test_a_backoff_never_redelivers_early(
    hub: PubSub, clock: Clock, mode: str, backoff_s: float
) -> None:
    """A pool entry given back (its due time in its name) and a log delivery given back (in
    the subscription's memory) alike."""
    hub.publish("c", b"poison", mode=mode)
    with hub.subscribe("s", backoff_s=backoff_s, backoff_max_s=10) as sub:
        first = sub.receive(wait_s=1)
        assert first is not None
        aborted_at = clock.ns
        sub.abort(first)
        over_ns = aborted_at + round(backoff_s * 1e9)
        clock.ns = over_ns - 1
        assert sub.receive() is None
        clock.ns = over_ns + 1_000_000
        again = sub.receive(wait_s=1)
        assert again is not None and again.id == first.id
        sub.done(again)


@pytest.mark.parametrize("mode", ["anyone", "future"])
def test_a_process_deadline_never_passes_early(hub: PubSub, clock: Clock, mode: str) -> None:
    """1.001 s: `int(1.001 * 1000)` is 1000 (the timeout was stored and reckoned 1 ms short)."""
    hub.publish("c", b"slow", mode=mode, process_timeout_s=1.001)
    with hub.subscribe("s") as sub:
        received_at = clock.ns
        delivery = sub.receive(wait_s=1)
        assert delivery is not None
        over_ns = received_at + 1_001_000_000
        clock.ns = over_ns - 1
        assert sub.expire() == {}
        clock.ns = over_ns + 1_000_000  # past its last millisecond, not 2 ms late
        assert list(sub.expire()) == [delivery.key]


@pytest.mark.parametrize("extend_s", SECONDS)
def test_a_heartbeat_never_ends_early(hub: PubSub, clock: Clock, extend_s: float) -> None:
    hub.publish("c", b"long", process_timeout_s=30)
    with hub.subscribe("s") as sub:
        delivery = sub.receive(wait_s=1)
        assert delivery is not None
        beaten_at = clock.ns
        deadline_ms = sub.heartbeat(delivery, extend_s)
        assert deadline_ms == delivery.deadline_ms
        over_ns = beaten_at + round(extend_s * 1e9)
        clock.ns = over_ns - 1
        assert sub.expire() == {}
        clock.ns = over_ns + 1_000_000  # not 2 ms late
        assert list(sub.expire()) == [delivery.key]


def test_an_accept_deadline_never_passes_early(hub: PubSub, clock: Clock, root: Path) -> None:
    """Timed out only once its accept timeout is over (`int(1.001 * 1000)` was 1000)."""
    published = hub.publish("c", b"x", accept_timeout_s=1.001)
    [name] = os.listdir(PubSubPaths.under(str(root)).anyone)
    pooled = split_entry(name)
    assert pooled is not None
    published_ns = int(pooled.key[:16]) * 1000  # <publish time, us>_<id>
    clock.ns = published_ns + 1_001_000_000 - 1
    assert hub.sweep().timed_out == 0
    with hub.subscribe("s") as sub:
        delivery = sub.receive(wait_s=1)
        assert delivery is not None and delivery.id == published.id


@pytest.mark.parametrize("ttl_s", [0.0016, 0.2006, 1.2345678])
def test_a_message_is_never_delivered_past_its_time_to_live(
    store: dirmq.Store, clock: Clock, ttl_s: float
) -> None:
    """The other way round: a time to live is a time by which the message must be gone, so its
    deadline rounds down. Published at the start of a millisecond, the message is delivered
    until its deadline and never at the first nanosecond past its time to live."""
    clock.ns = clock.ns // 1_000_000 * 1_000_000  # the publish at a millisecond's start
    published_ns = clock.ns
    q = store.create_queue("q", MEMORY)
    q.put_many([dirmq.OutgoingMessage(b"x", ttl_s=ttl_s)])
    clock.ns = published_ns + round(ttl_s * 1e9)  # its time to live is over
    assert q.get(1) == []


@pytest.mark.parametrize("ttl_s", [1.001, 0.0016, 1.2345678])
@pytest.mark.parametrize("way", ["put", "direct", "streamed"])
def test_a_message_lives_until_less_than_a_millisecond_before_its_time_to_live(
    store: dirmq.Store, clock: Clock, ttl_s: float, way: str
) -> None:
    """Rounded down, a deadline is early by less than a millisecond: not by the publish's
    part of a millisecond plus the time to live's (1.001 * 1000 is 1000.99...: floored, 1000),
    which made a message dead up to 2 ms before its time to live was over."""
    published_ns = clock.ns  # 0.7 ms into a millisecond
    q = store.create_queue("q", MEMORY if way != "streamed" else None)
    if way == "put":
        q.put_many([dirmq.OutgoingMessage(b"x", ttl_s=ttl_s)])
    elif way == "direct":
        outgoing = dirmq.OutgoingMessage(b"x", ttl_s=ttl_s)
        q.direct.put_leased([DirectLease(outgoing, 0, None)])  # redelivered at once
    else:
        _streamed(q, ttl_s)
    clock.ns = published_ns + round(ttl_s * 1e9) - 1_000_000  # 1 ms before its time is over
    assert q.get_one() is not None, "dead more than a millisecond early"


def _streamed(q: dirmq.Queue, ttl_s: float) -> None:
    """A body streamed into its file (a large HTTP publish's way), then published."""
    streamed = StreamedFile.create(q, 1, {}, ttl_s=ttl_s)
    streamed.write([b"x"])
    streamed.publish()


@pytest.mark.parametrize("ttl_s", [0.0016, 0.2006, 1.2345678])
def test_a_streamed_message_is_never_delivered_past_its_time_to_live(
    store: dirmq.Store, clock: Clock, ttl_s: float
) -> None:
    """As `put`'s: its deadline rounded to the nearest millisecond was up to half of one late."""
    clock.ns = clock.ns // 1_000_000 * 1_000_000  # the publish at a millisecond's start
    published_ns = clock.ns
    q = store.create_queue("q")
    _streamed(q, ttl_s)
    clock.ns = published_ns + round(ttl_s * 1e9)  # its time to live is over
    assert q.get(1) == []


def test_an_accept_deadline_passes_within_a_millisecond(
    hub: PubSub, clock: Clock, root: Path
) -> None:
    """Its last millisecond is the one before its time is over: rounded up, a deadline passed
    only once the clock's millisecond is beyond it timed out up to 2 ms late."""
    hub.publish("c", b"x", accept_timeout_s=1.001)
    [name] = os.listdir(PubSubPaths.under(str(root)).anyone)
    pooled = split_entry(name)
    assert pooled is not None
    published_ns = int(pooled.key[:16]) * 1000  # <publish time, us>_<id>
    clock.ns = published_ns + 1_001_000_000 + 1_000_000
    assert hub.sweep().timed_out == 1
