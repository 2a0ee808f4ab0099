"""ReceiveMessage on a FIFO queue: as many consecutive messages of a group as fit, like AWS.

The store leases a group's run to one get and holds the group back from every other get until
none of the run is in flight. So each request must have a `Queue.get` of its own: the broker's
receive path merges the gets of concurrent requests into one and splits the result, which could
hand one group's messages to two consumers. Here each request leases with its own pool call,
and a long poll waits on the queue's change notifications (any process's send, delete or
return wakes it) and on the next lease or delay falling due, like the broker's waiters.
"""

from __future__ import annotations

import asyncio
import contextlib

from dirmq.errors import DirmqError
from dirmq.server.broker import Broker
from dirmq.store import Message, Queue

# A waiting receive looks again at least this often: polling-mode stores (NFS) see other hosts'
# changes only by looking, and a draining server must not keep it parked.
RECHECK_S = 1.0

_giving_back: set[asyncio.Task[None]] = set()  # strong references until they finish


async def receive_fifo(
    broker: Broker, queue: Queue, max_count: int, visibility_s: float | None, wait_s: float
) -> list[Message]:
    """Lease up to `max_count` messages (whole runs of groups), waiting up to `wait_s` for
    the first."""
    got = await _lease(broker, queue, max_count, visibility_s)
    if got or wait_s <= 0 or broker.closing:
        return got
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    changed = asyncio.Event()
    unsubscribe = await broker.call(queue.subscribe, lambda: loop.call_soon_threadsafe(changed.set))
    broker.watch_store()
    try:
        while True:
            changed.clear()  # before looking: a change during the look wakes the next wait
            got = await _lease(broker, queue, max_count, visibility_s)
            remaining = deadline - loop.time()
            if got or remaining <= 0 or broker.closing:
                return got
            due = await broker.call(queue.next_due_s)
            timeout = min(remaining, RECHECK_S, RECHECK_S if due is None else due + 0.001)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout)
    finally:
        unsubscribe()


async def _lease(
    broker: Broker, queue: Queue, max_count: int, visibility_s: float | None
) -> list[Message]:
    leasing = asyncio.ensure_future(
        broker.call(queue.get, max_count, visibility_s=visibility_s, max_per_group=None)
    )
    try:
        return await asyncio.shield(leasing)
    except asyncio.CancelledError:
        # The client left while a pool thread was leasing for it: give those back, or their
        # groups would stay held until the visibility timeout.
        leasing.add_done_callback(lambda done: _give_back_later(broker, queue, done))
        raise


def _give_back_later(broker: Broker, queue: Queue, done: asyncio.Future[list[Message]]) -> None:
    if done.cancelled() or done.exception() is not None or not done.result():
        return
    task = asyncio.ensure_future(_give_back(broker, queue, done.result()))
    _giving_back.add(task)
    task.add_done_callback(_giving_back.discard)


async def _give_back(broker: Broker, queue: Queue, messages: list[Message]) -> None:
    for message in messages:
        with contextlib.suppress(DirmqError):
            await broker.call(queue.nack, message.receipt or "")
