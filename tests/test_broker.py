"""The asyncio face of the store: group commit across requests, long polls without threads."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import dirmq
from dirmq.server.broker import Broker
from dirmq.store import OutgoingMessage


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_concurrent_publishes_share_flushes(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("g")
    calls: list[int] = []
    real = dirmq.Queue.put_many

    def counting(self: dirmq.Queue, messages: list[OutgoingMessage], **kw: object) -> list[str]:
        calls.append(len(messages))
        return real(self, messages, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(dirmq.Queue, "put_many", counting)

    async def main() -> list[list[str]]:
        broker = Broker(store)
        try:
            return await asyncio.gather(
                *(broker.publish(queue, [OutgoingMessage(f"{i}".encode())]) for i in range(200))
            )
        finally:
            broker.close()

    results = run(main())
    assert isinstance(results, list)
    ids = [r[0] for r in results]
    assert len(set(ids)) == 200
    assert sum(calls) == 200
    assert len(calls) < 50, f"200 concurrent publishes took {len(calls)} flushes"
    assert queue.stats().ready == 200


def test_long_polls_are_all_served_when_woken_by_other_threads(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("w")

    def publish_later() -> None:
        time.sleep(0.3)
        other = dirmq.Store(root).queue("w")
        for i in range(30):
            other.put(f"m{i}".encode())

    async def main() -> list[bytes]:
        broker = Broker(store)
        thread = threading.Thread(target=publish_later)
        try:
            polls = [asyncio.ensure_future(broker.receive(queue, 1, 30, 10)) for _ in range(30)]
            await asyncio.sleep(0.1)
            thread.start()
            results = await asyncio.gather(*polls)
            return [r[0].body for r in results]
        finally:
            thread.join()
            broker.close()

    bodies = run(main())
    # Each poll gets exactly one message. Which poll gets which is not promised: a poll's first
    # look at the queue runs on the thread pool, concurrently with the waiter line.
    assert isinstance(bodies, list)
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(30))


def test_a_cancelled_long_poll_gives_its_message_back(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("c")

    async def main() -> None:
        broker = Broker(store)
        try:
            poll = asyncio.ensure_future(broker.receive(queue, 1, 30, 10))
            await asyncio.sleep(0.1)
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
            await broker.call(queue.put, b"kept")
            got = await broker.receive(queue, 1, 30, 5)
            assert [m.body for m in got] == [b"kept"]
        finally:
            broker.close()

    run(main())


def test_closing_releases_waiting_polls(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("r")

    async def main() -> list[object]:
        broker = Broker(store)
        poll = asyncio.ensure_future(broker.receive(queue, 1, 30, 30))
        await asyncio.sleep(0.1)
        broker.close()
        return await asyncio.wait_for(poll, 2)

    assert run(main()) == []
