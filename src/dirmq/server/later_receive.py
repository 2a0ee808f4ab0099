"""A receive that may wait (a long poll), answered without a coroutine: a fast path's GET.

`Broker.receive` with a wait is a task, a chain of coroutines and two futures per request; at a
low rate a long poll is a third of a message's requests (publish, poll, ack), and those hops
were a good part of the server's CPU a message. Here the same steps are callbacks: the first
look through the queue's get line (`Broker.receive_nowait`: at once on the event loop when the
line is quiet), then, with nothing got, a place in the queue's waiter line (`LongPolls.park`),
whose future's callback answers. The direct path (direct.py) takes such a waiter as it takes a
coroutine's. What `cancel` does (the connection's client left) is what cancelling `receive`'s
task does: a parked wait leaves the line; what was leased for it meanwhile is given back by
whoever answers (the fast path's `settle` gives back what it could not send).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from dirmq.server.contract import Later
from dirmq.server.longpolls import LongPolls
from dirmq.server.queuecounts import DELIVERED
from dirmq.store import Message, Queue

Settle = Callable[[list[Message] | BaseException], None]


class ReceiveHost(Protocol):
    """What a `LaterReceive` needs of the `Broker` (which imports this module)."""

    closing: bool

    def receive_nowait(
        self,
        queue: Queue,
        max_count: int,
        visibility_s: float | None,
        settle: Settle,
        consumer: str | None = None,
        by_file: bool = False,
    ) -> None: ...

    def waiter_line(self, queue: Queue) -> LongPolls: ...

    def moved(self, kind: int, queue: str, count: int) -> None: ...


class LaterReceive(Later):
    """One long poll of one request; what the connection holds as its `_task` meanwhile (its
    `cancel` is called when the client goes away). `start` begins it."""

    __slots__ = ("_args", "_broker", "_cancelled", "_parked", "_queue", "_settle", "settled")

    def __init__(
        self,
        broker: ReceiveHost,
        queue: Queue,
        max_count: int,
        visibility_s: float | None,
        wait_s: float | None,
        consumer: str | None,
        settle: Settle,
    ) -> None:
        self._broker = broker
        self._queue = queue
        self._args = (max_count, visibility_s, wait_s, consumer)
        self._settle = settle
        self._parked: asyncio.Future[list[Message]] | None = None
        self._cancelled = False
        self.settled = False  # `settle` has been called (maybe before `start` returned)

    def start(self, by_file: bool) -> None:
        """The first look (`by_file`: a large body may stay in its file, as a plain GET's);
        with nothing there, the wait. A queue this worker holds no index of is waited on at
        once: the line's arming is its first look (as `Broker.receive`)."""
        broker, queue = self._broker, self._queue
        max_count, visibility_s, _wait_s, consumer = self._args
        if not queue.indexed() and not broker.closing:
            self._park()
            return
        broker.receive_nowait(queue, max_count, visibility_s, self._looked, consumer, by_file)

    def cancel(self) -> bool:
        self._cancelled = True
        parked = self._parked
        if parked is not None and not parked.done():
            parked.cancel()  # its callback takes it out of the line
        return True

    def _looked(self, outcome: list[Message] | BaseException) -> None:
        if isinstance(outcome, BaseException) or outcome or self._cancelled or self._broker.closing:
            self._answer(outcome)  # what a client that left was given goes back there
            return
        self._park()

    def _park(self) -> None:
        max_count, visibility_s, wait_s, consumer = self._args
        line = self._broker.waiter_line(self._queue)
        self._parked = line.park(max_count, visibility_s, wait_s, consumer, self._waited)

    def _waited(self, outcome: list[Message] | BaseException) -> None:
        if isinstance(outcome, list) and outcome:
            self._broker.moved(DELIVERED, self._queue.name, len(outcome))
        self._answer(outcome)

    def _answer(self, outcome: list[Message] | BaseException) -> None:
        self.settled = True
        self._settle(outcome)
