"""Long polls. A waiting receive is a future in the queue's waiter line, not a thread: thousands
cost a few KiB each. One task per queue with waiters sleeps on the queue's inotify descriptor
(any process's publish, nack or expiry wakes it) or until the next lease or delay falls due,
then leases messages for the waiters in arrival order. Messages leased for a waiter that gave up
meanwhile are handed back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dirmq.server.broker_host import BrokerHost
from dirmq.store import Message, Queue

IDLE_RECHECK_S = 30.0


@dataclass(slots=True)
class _Waiter:
    max_count: int
    visibility_s: float | None
    future: asyncio.Future[list[Message]] = field(repr=False)
    max_per_group: int | None = 1
    consumer: str | None = None  # whom the leases name as their holder (`Queue.get`)


def _expire(future: asyncio.Future[list[Message]]) -> None:
    """A long poll's wait is over: it answers empty (unless messages got there first)."""
    if not future.done():
        future.set_result([])


class LongPolls:
    def __init__(self, broker: BrokerHost, queue: Queue) -> None:
        self.broker = broker
        self.queue = queue
        self._waiters: deque[_Waiter] = deque()
        self._task: asyncio.Task[None] | None = None

    async def wait(
        self,
        max_count: int,
        visibility_s: float | None,
        wait_s: float | None,
        max_per_group: int | None = 1,
        consumer: str | None = None,
    ) -> list[Message]:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(max_count, visibility_s, loop.create_future(), max_per_group, consumer)
        self._waiters.append(waiter)
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._watch())
        # A parked poll is just this future and one timer: thousands must stay cheap.
        future = waiter.future
        timer = None if wait_s is None else loop.call_later(wait_s, _expire, future)
        try:
            got = await future  # cancelling the request cancels the future: see _give_up
        except asyncio.CancelledError:
            await self._give_up(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if not got:
            self._forget(waiter)
        return got

    def _forget(self, waiter: _Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    async def _give_up(self, waiter: _Waiter) -> None:
        if waiter.future.done() and not waiter.future.cancelled():
            if waiter.future.exception() is None:
                self.broker.give_back(self.queue, waiter.future.result())
        else:
            waiter.future.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def release_all(self) -> None:
        for waiter in self._waiters:
            if not waiter.future.done():
                waiter.future.set_result([])
        self._waiters.clear()

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def notice() -> None:  # called by whichever thread pumps the store's inotify
            loop.call_soon_threadsafe(woken.set)

        unsubscribe: Callable[[], None] | None = None
        try:
            unsubscribe = await self.broker.call(self.queue.subscribe, notice)
            woken.set()  # a change between a waiter's first look and our subscribing is missed
            polling = await self.broker.call(self.queue.polled)
            self.broker.watch_store()
            idle = self.broker.store.poll_interval_s if polling else IDLE_RECHECK_S
            while self._live_waiters():
                due = await self.broker.call(self.queue.next_due_s)
                timeout = idle if due is None else min(due + 0.001, idle)
                with contextlib.suppress(TimeoutError):  # cancellable, unlike 3.11's `wait_for`
                    async with asyncio.timeout(timeout):
                        await woken.wait()
                woken.clear()
                await self._dispatch()
        except Exception as exc:  # e.g. the queue was deleted: every waiter learns why
            for waiter in self._waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(exc)
            self._waiters.clear()
        finally:
            if unsubscribe is not None:
                unsubscribe()

    def _live_waiters(self) -> bool:
        while self._waiters and self._waiters[0].future.done():
            self._waiters.popleft()
        return bool(self._waiters)

    async def _dispatch(self) -> None:
        while self._live_waiters():
            waiter = self._waiters[0]
            got = await self.broker.call(
                self.queue.get,
                waiter.max_count,
                visibility_s=waiter.visibility_s,
                max_per_group=waiter.max_per_group,
                consumer=waiter.consumer,
            )
            if not got:
                return
            self._hand_out(waiter, got)

    def _hand_out(self, waiter: _Waiter, got: list[Message]) -> None:
        """`got` was leased for `waiter`. If its wait ended while the lease was under way, the
        next waiters that lease alike take the messages (a poll's deadline must not cost a
        parked stream its turn); only what none of them takes is given back."""
        rest = got
        # (A poll whose wait ended has already left the line: `wait` forgets it.)
        for other in itertools.chain((waiter,), self._waiters):
            if not rest:
                break
            if other.future.done() or (
                other is not waiter
                and (other.visibility_s, other.max_per_group, other.consumer)
                != (waiter.visibility_s, waiter.max_per_group, waiter.consumer)
            ):
                continue
            if len(rest) > other.max_count and other.max_per_group != 1:
                continue  # a group's run (SQS FIFO) goes to one consumer whole, or back
            other.future.set_result(rest[: other.max_count])
            rest = rest[other.max_count :]
        self._live_waiters()
        self.broker.give_back(self.queue, rest)
