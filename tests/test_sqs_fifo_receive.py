"""The FIFO receive path (the broker's receive with `max_per_group=None`, as SQS FIFO queues use
it) on its own: whole runs of a group per request, long polls woken by a release, and leases of
a request whose client left given back."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import dirmq
from dirmq.server.broker import Broker
from dirmq.store import Message, OutgoingMessage, Queue


async def receive_fifo(
    broker: Broker, queue: Queue, max_count: int, visibility_s: float, wait_s: float
) -> list[Message]:
    return await broker.receive(queue, max_count, visibility_s, wait_s, max_per_group=None)


def _fill(q: dirmq.Queue, count: int) -> None:
    q.put_many([OutgoingMessage(f"g{i}".encode(), group="g") for i in range(count)])


def _bodies(messages: list[Message]) -> list[str]:
    return [m.body.decode() for m in messages]


def test_a_receive_takes_the_run_and_a_waiting_one_gets_the_rest(store: dirmq.Store) -> None:
    q = store.create_queue("run")
    _fill(q, 3)

    async def scenario() -> tuple[list[Message], list[Message], float]:
        broker = Broker(store, threads=4)
        first = await receive_fifo(broker, q, 2, 30.0, 0.0)
        waiting = asyncio.ensure_future(receive_fifo(broker, q, 10, 30.0, 10.0))
        await asyncio.sleep(0.3)
        assert not waiting.done(), "g2 waits for g0 and g1"
        started = time.monotonic()
        for message in first:
            await broker.call(q.ack, message.receipt or "")
        rest = await waiting
        broker.close()
        return first, rest, time.monotonic() - started

    first, rest, latency = asyncio.run(scenario())
    assert _bodies(first) == ["g0", "g1"]
    assert _bodies(rest) == ["g2"]
    assert latency < 2


class _SlowQueue:
    """A queue whose get takes a while, so a request can be cancelled in the middle of it."""

    def __init__(self, queue: dirmq.Queue) -> None:
        self._queue = queue

    def get(self, *args: Any, **kwargs: Any) -> list[Message]:
        time.sleep(0.3)
        return self._queue.get(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._queue, name)


def test_a_cancelled_receive_gives_its_leases_back(store: dirmq.Store) -> None:
    q = store.create_queue("cancel")
    _fill(q, 2)

    async def scenario() -> None:
        broker = Broker(store, threads=4)
        receiving = asyncio.ensure_future(receive_fifo(broker, _SlowQueue(q), 10, 30.0, 0.0))  # type: ignore[arg-type]
        await asyncio.sleep(0.1)
        receiving.cancel()
        await asyncio.sleep(0.6)  # the get finishes, then its messages are nacked
        broker.close()

    asyncio.run(scenario())
    again = q.get(10, max_per_group=None)
    assert _bodies(again) == ["g0", "g1"]
    assert [m.receive_count for m in again] == [2, 2]
