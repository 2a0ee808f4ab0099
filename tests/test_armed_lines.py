"""A poll whose first look ran before a change, and which joins the queue's waiter line only
after that change was heard: what the change made ready is not left sitting until the next
change or the idle re-check (longpolls.py). The order of events is forced with gates (a held
first look, a held dispatch lease, a held wake-up), never with sleeps, and the idle re-check
is pushed out of reach, so a message left sitting fails the test rather than arriving late.

Why it is safe, whichever order: every message made ready makes a change, heard after it is
ready. A wake-up with a waiter in the line leases for the waiters until a lease finds nothing
or no waiter is left, and one that joins meanwhile is leased for in turn (`_dispatch` reads the
line at each step); a line left without a waiter lingers, and a poll joining a lingering line
gets a look of its own. So a line that still has waiters once its wake-ups are over found
nothing ready at its last lease, and anything after that is a change yet to be heard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dirmq
from dirmq.server import broker as broker_module
from dirmq.server import longpolls
from dirmq.server.broker import Broker
from dirmq.server.longpolls import LongPolls
from dirmq.store import Durability, Message, Queue

from .support.settled import Settled


class _Gate:
    """Held shut until `open`; `reached` is set when something stops at it."""

    def __init__(self) -> None:
        self.shut = False
        self.reached = asyncio.Event()
        self._opened = asyncio.Event()

    async def pass_(self) -> None:
        if self.shut:
            self.reached.set()
            await self._opened.wait()

    def open(self) -> None:
        self.shut = False
        self._opened.set()


class _Line(LongPolls):
    """A waiter line that tells the test how each poll joined, when it lingers, and may hold
    its next wake-up (the change heard, not yet acted on)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.joined: list[tuple[int, bool]] = []  # (polls waiting, lingering) as each joined
        self.joined_event = asyncio.Event()
        self.lingered = asyncio.Event()
        self.hold_wakeup = False
        self.held = asyncio.Event()

    def _enter(self, waiter: Any) -> None:
        self.joined.append((self.waiting(), self.lingering()))
        super()._enter(waiter)
        self.joined_event.set()

    def _woken(self) -> None:
        if self.hold_wakeup:
            self.hold_wakeup = False
            self.held.set()  # `_wake_pending` stays set: later changes join this wake-up
            return
        super()._woken()

    def release_wakeup(self) -> None:
        super()._woken()

    def _retire_if_unwaited(self, linger: bool = True) -> None:
        super()._retire_if_unwaited(linger)
        if self.lingering():
            self.lingered.set()


class _GatedBroker(Broker):
    """A broker whose get line's leases (a poll's first look through `Broker.receive`) and
    whose waiter lines' leases may be held at gates, after the store call was made."""

    def __init__(self, store: dirmq.Store) -> None:
        super().__init__(store)
        self.looks = _Gate()
        self.line_leases = _Gate()

    async def lease(self, queue: Queue, *args: Any, **kwargs: Any) -> list[Message]:
        got = await super().lease(queue, *args, **kwargs)
        await self.looks.pass_()
        return got

    async def settle_call(
        self, queue: Queue, messages: int, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        result = await super().settle_call(queue, messages, fn, *args, **kwargs)
        if fn == queue.get:  # the line's own leases (`LongPolls._lease`); looks use `lease`
            await self.line_leases.pass_()
        return result

    def waiter_line(self, queue: Queue) -> LongPolls:
        line = self._receivers.get(queue.name)
        if line is None or line.queue is not queue:
            line = self._receivers[queue.name] = _Line(self, queue, self._forget_receiver)
        return line


@pytest.fixture(autouse=True)
def no_idle_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing but a change, or a look, can deliver within a test's time; and on a busy
    machine neither a slow call (which sends the lines' looks to the pool) nor a slow loop
    turn (which ends a lingering line) changes the order the tests force."""
    monkeypatch.setattr(longpolls, "IDLE_RECHECK_S", 3600.0)
    monkeypatch.setattr(longpolls, "LINGER_S", 3600.0)  # a lingering line waits for its joiner
    monkeypatch.setattr(broker_module, "INLINE_STALL_S", 3600.0)


def _run(root: Path, name: str, scenario: Callable[[_GatedBroker, Queue], Any]) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue(name)
    queue.stats()  # the index: the line is armed at once, leases run on the loop

    async def main() -> None:
        broker = _GatedBroker(store)
        try:
            async with asyncio.timeout(20):
                await scenario(broker, queue)
        finally:
            broker.close()

    try:
        asyncio.run(main())
        assert queue.stats().ready == 0  # nothing sat: every message went to a poll
    finally:
        store.close()


def _first_waiter(broker: _GatedBroker, queue: Queue) -> tuple[_Line, Settled]:
    line = broker.waiter_line(queue)
    assert isinstance(line, _Line)
    settled = Settled()
    line.park(1, 30, 60, None, settled)  # armed, looked: nothing
    return line, settled


async def _late_poll(broker: _GatedBroker, queue: Queue) -> asyncio.Task[list[Message]]:
    """A poll whose first look (a get line's batch) finds nothing and is held there."""
    broker.looks.shut = True
    late = asyncio.create_task(broker.receive(queue, 1, 30, 60))
    await broker.looks.reached.wait()
    return late


async def _joined(line: _Line, polls: int) -> None:
    """Once `polls` polls in all have joined `line`."""
    while len(line.joined) < polls:
        line.joined_event.clear()
        await line.joined_event.wait()


def test_a_poll_joining_after_the_waiters_were_served_gets_its_own_look(root: Path) -> None:
    """The change is dispatched to the only waiter while the late poll's look is held: the
    line is left without a waiter, lingers, and the late poll joining it looks."""

    async def scenario(broker: _GatedBroker, queue: Queue) -> None:
        line, first = _first_waiter(broker, queue)
        late = await _late_poll(broker, queue)
        queue.put_many([b"one", b"two"])
        await first.event.wait()
        await line.lingered.wait()
        broker.looks.open()
        got = await late
        assert first.bodies() == [b"one"] and [m.body for m in got] == [b"two"]
        assert line.joined[-1] == (0, True)

    _run(root, "served", scenario)


def test_a_poll_joining_while_a_dispatch_leases_is_leased_for_in_turn(root: Path) -> None:
    """The late poll joins an armed line whose dispatch is under way for another waiter: the
    dispatch leases for it next, and what the change made ready goes to it."""

    async def scenario(broker: _GatedBroker, queue: Queue) -> None:
        line, first = _first_waiter(broker, queue)
        second = Settled()
        line.park(1, 30, 60, None, second)
        late = await _late_poll(broker, queue)
        broker.line_leases.shut = True
        queue.put_many([b"one", b"two", b"three"])
        # The wake-up's look (on the loop) leases for the first; the dispatch task's lease
        # for the second is held once made.
        await broker.line_leases.reached.wait()
        assert first.bodies() == [b"one"] and not second.outcomes
        broker.looks.open()
        await _joined(line, 3)
        assert line.joined[-1] == (1, False)  # armed, a waiter (being leased for) in it
        broker.line_leases.open()
        got = await late
        assert second.bodies() == [b"two"] and [m.body for m in got] == [b"three"]

    _run(root, "dispatching", scenario)


def test_a_poll_joining_before_a_heard_change_is_acted_on_is_served_by_it(root: Path) -> None:
    """The change is heard (its wake-up scheduled) but not yet acted on when the late poll
    joins the armed line, its waiter still waiting: the wake-up leases for both."""

    async def scenario(broker: _GatedBroker, queue: Queue) -> None:
        line, first = _first_waiter(broker, queue)
        late = await _late_poll(broker, queue)
        line.hold_wakeup = True
        queue.put_many([b"one", b"two"])
        await line.held.wait()
        broker.looks.open()
        await _joined(line, 2)
        assert line.joined[-1] == (1, False)  # armed, its first waiter waiting
        assert not first.outcomes
        line.release_wakeup()
        got = await late
        assert first.bodies() == [b"one"] and [m.body for m in got] == [b"two"]

    _run(root, "heard", scenario)


def test_a_poll_joining_a_line_whose_waiter_the_direct_path_took_is_served(root: Path) -> None:
    """A publish here took the line's only waiter (server/direct.py: no wake-up of the line),
    so the late poll joins an armed line with no waiter that does not linger, and gets no look
    on joining; what was published the usual way meanwhile is a change, and its wake-up,
    acted on after the join, leases for the late poll."""

    async def scenario(broker: _GatedBroker, queue: Queue) -> None:
        line, first = _first_waiter(broker, queue)
        late = await _late_poll(broker, queue)
        line.hold_wakeup = True
        one = dirmq.OutgoingMessage(b"one")
        queue.validate(one)  # as a door does: the direct path takes only what it passed
        await broker.publish(queue, [one], durability=Durability.WRITETHROUGH)
        await first.event.wait()  # straight into its lease: no wake-up (one is held)
        assert first.bodies() == [b"one"]
        queue.put(b"two")
        await line.held.wait()
        broker.looks.open()
        await _joined(line, 2)
        assert line.joined[-1] == (0, False)  # armed, nobody waiting, not lingering
        line.release_wakeup()
        got = await late
        assert [m.body for m in got] == [b"two"]

    _run(root, "direct", scenario)
