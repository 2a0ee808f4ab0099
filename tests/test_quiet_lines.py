"""A message's work at a low rate, without tasks: a quiet get or ack line applied at once on the
event loop (batcher.py's `quiet`), and a long poll answered through callbacks
(later_receive.py: the native fast path's `GET ?wait=`), whose cancel leaves the waiter line."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import dirmq
from dirmq.server.batcher import RequestGaps
from dirmq.server.broker import Broker
from dirmq.server.later_receive import LaterReceive
from dirmq.store import Message, Queue

from .support.settled import Settled

T = TypeVar("T")


@contextlib.contextmanager
def _queue(root: Path, name: str, *bodies: bytes) -> Iterator[tuple[dirmq.Store, Queue]]:
    """A store and a new queue holding `bodies`, its index built (a lease may then run on the
    loop); the store closed at the end."""
    store = dirmq.Store(root)
    try:
        queue = store.create_queue(name)
        if bodies:
            queue.put_many(list(bodies))
        queue.stats()
        yield store, queue
    finally:
        store.close()


def _run(store: dirmq.Store, scenario: Callable[[Broker], Awaitable[T]]) -> T:
    """`scenario` on an event loop with a broker of `store`, closed at the end."""

    async def main() -> T:
        broker = Broker(store)
        try:
            return await scenario(broker)
        finally:
            broker.close()

    return asyncio.run(main())


def test_a_quiet_ack_is_applied_before_the_call_returns(root: Path) -> None:
    with _queue(root, "quiet-ack", b"a", b"b") as (store, queue):

        async def scenario(broker: Broker) -> None:
            first, second = queue.get(2)
            settled = Settled()
            broker.ack_nowait(queue, first.receipt or "", settled)
            assert settled.outcomes == [None]  # applied here: no batch, no loop turn
            assert queue.stats().in_flight == 1
            # Right after it (a burst, or a batch under way), an ack joins the line: it is
            # applied all the same, by whichever way.
            later = Settled()
            broker.ack_nowait(queue, second.receipt or "", later)
            await asyncio.wait_for(later.event.wait(), 5)
            assert later.outcomes == [None]
            # A receipt acknowledged already fails, whichever way it goes.
            again = Settled()
            broker.ack_nowait(queue, first.receipt or "", again)
            await asyncio.wait_for(again.event.wait(), 5)
            assert isinstance(again.outcomes[0], dirmq.errors.DirmqError)

        _run(store, scenario)
        assert queue.stats().in_flight == 0 and queue.stats().ready == 0


def test_a_quiet_get_leases_before_the_call_returns(root: Path) -> None:
    with _queue(root, "quiet-get", b"x") as (store, queue):

        async def scenario(broker: Broker) -> None:
            settled = Settled()
            broker.receive_nowait(queue, 1, 30, settled)
            assert len(settled.outcomes) == 1
            got = settled.outcomes[0]
            assert isinstance(got, list) and [m.body for m in got] == [b"x"]

        _run(store, scenario)


def test_a_later_receive_waits_for_a_publish(root: Path) -> None:
    with _queue(root, "later") as (store, queue):

        async def scenario(broker: Broker) -> list[Message]:
            settled = Settled()
            receiving = LaterReceive(broker, queue, 1, 30, 10, None, settled)
            receiving.start(by_file=True)
            assert not receiving.settled  # nothing there: it waits in the line
            assert broker.waiting_polls() == {"later": 1}
            await broker.publish(queue, [dirmq.OutgoingMessage(b"late")])
            await asyncio.wait_for(settled.event.wait(), 5)
            got = settled.outcomes[0]
            assert isinstance(got, list)
            return got

        got = _run(store, scenario)
        assert [m.body for m in got] == [b"late"] and got[0].receive_count == 1


def test_a_later_receive_ends_empty_when_its_wait_is_over(root: Path) -> None:
    with _queue(root, "expired") as (store, queue):

        async def scenario(broker: Broker) -> None:
            settled = Settled()
            LaterReceive(broker, queue, 1, 30, 0.05, None, settled).start(by_file=False)
            await asyncio.wait_for(settled.event.wait(), 5)
            assert settled.outcomes == [[]]
            assert broker.waiting_polls() == {}  # the line is forgotten

        _run(store, scenario)


def test_a_cancelled_later_receive_leaves_the_line(root: Path) -> None:
    """The client left: its wait is out of the line, so the next publish stays ready for the
    next consumer (no lease for nobody), and nothing is answered."""
    with _queue(root, "left") as (store, queue):

        async def scenario(broker: Broker) -> None:
            settled = Settled()
            receiving = LaterReceive(broker, queue, 1, 30, 30, None, settled)
            receiving.start(by_file=False)
            assert broker.waiting_polls() == {"left": 1}
            receiving.cancel()
            await asyncio.sleep(0)  # the future's callback
            assert broker.waiting_polls() == {}
            await broker.publish(queue, [dirmq.OutgoingMessage(b"kept")])
            assert settled.outcomes == []

        _run(store, scenario)
        stats = queue.stats()
        assert (stats.ready, stats.in_flight) == (1, 0)
        assert [m.receive_count for m in queue.get(1)] == [1]


def test_a_line_lingers_armed_and_its_next_waiter_gets_a_look(root: Path) -> None:
    """The last waiter gone, the line stays armed a moment (longpolls.LINGER_S): its next
    waiter is not armed for again, but gets a look at once, so what came meanwhile is its."""
    with _queue(root, "linger") as (store, queue):

        async def scenario(broker: Broker) -> None:
            line = broker.waiter_line(queue)
            ended = Settled()
            line.park(1, 30, 0.01, None, ended)
            await asyncio.wait_for(ended.event.wait(), 5)
            assert ended.outcomes == [[]]
            assert line.lingering() and broker.waiting_polls() == {}
            assert broker.waiter_line(queue) is line  # kept, armed
            queue.put(b"meanwhile")
            got = Settled()
            future = line.park(1, 30, 5, None, got)
            assert future.done() and not line.lingering()  # leased by the look on entering
            await asyncio.wait_for(got.event.wait(), 5)
            outcome = got.outcomes[0]
            assert isinstance(outcome, list) and [m.body for m in outcome] == [b"meanwhile"]

        _run(store, scenario)


def test_a_lull_in_a_busy_line_is_not_quiet_and_an_idle_line_is_at_once() -> None:
    """The gaps decide, not the last one alone: a lull between bursts (clients reading their
    answers) left a busy line batching; after an idle spell the first request is quiet."""
    gaps = RequestGaps()
    now = 100.0
    assert gaps.quiet(now)  # a new line is idle
    for _ in range(200):  # 5,000 requests a second
        now += 0.0002
        gaps.quiet(now)
    now += 0.003  # a 3 ms lull: the last gap alone would call it quiet
    assert not gaps.quiet(now)
    for _ in range(50):
        now += 0.0002
        assert not gaps.quiet(now)
    now += 5.0  # idle: the next request is applied at once
    assert gaps.quiet(now)
    quiet = 0
    for _ in range(10):  # 500 a second: quiet all along
        now += 0.002
        quiet += gaps.quiet(now)
    assert quiet == 10
    for _ in range(40):  # busy again: batched within a few dozen requests
        now += 0.0001
        gaps.quiet(now)
    assert not gaps.quiet(now + 0.0001)


def test_a_due_sooner_than_the_lines_timer_still_wakes_its_waiter_in_time(root: Path) -> None:
    """A line keeps its timer when it fires soon enough (a look a message made and cancelled
    one each); a change that falls due sooner, from another process, sets it again."""
    with _queue(root, "due-sooner", b"held") as (store, queue):
        held = queue.get(1, visibility_s=30)  # the line's timer: this lease's expiry, 30 s
        assert len(held) == 1

        async def scenario(broker: Broker) -> float:
            settled = Settled()
            receiving = LaterReceive(broker, queue, 1, 30, 10, None, settled)
            receiving.start(by_file=True)
            assert not receiving.settled
            began = time.monotonic()
            with dirmq.Store(root) as other:  # another process's delayed publish: an event
                other.queue("due-sooner").put(b"soon", delay_s=0.3)
            await asyncio.wait_for(settled.event.wait(), 10)
            got = settled.outcomes[0]
            assert isinstance(got, list) and [m.body for m in got] == [b"soon"]
            return time.monotonic() - began

        waited = _run(store, scenario)
        assert 0.29 <= waited < 5  # its due, not the held lease's 30 s
