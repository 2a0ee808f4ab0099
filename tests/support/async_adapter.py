"""A blocking facade over the asyncio client, so the contract suite runs against it unchanged.

`BlockingAsyncStore` / `BlockingAsyncQueue` have exactly the public API of `RemoteStore` /
`RemoteQueue` (test_async_client.py checks the signatures); every call is run on one event loop
in a background thread (`asyncio.run_coroutine_threadsafe`) and waited for. Any thread may call
them, as the contract suite does from `threading.Timer`s.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from dirmq.client import AsyncRemoteQueue, AsyncRemoteStore
from dirmq.client import protocol as p
from dirmq.client.remote import DEFAULT_TIMEOUT_S
from dirmq.store import Durability, Message, OutgoingMessage, QueueConfig, QueueStats

T = TypeVar("T")


class LoopThread:
    """An event loop running forever in a daemon thread, until `close`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="dirmq-async-adapter", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.run_until_complete(self.loop.shutdown_default_executor())
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the loop and wait for its result (or exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()


class BlockingAsyncStore:
    """`RemoteStore`'s API, served by an `AsyncRemoteStore` on a background event loop."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._loop = LoopThread()

        async def make() -> AsyncRemoteStore:
            return AsyncRemoteStore(url, timeout_s=timeout_s)

        try:
            self._async = self._loop.run(make())
        except BaseException:
            self._loop.close()
            raise
        self.url = self._async.url

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run(coro)

    def request(self, call: p.Call) -> p.Answer:
        return self._run(self._async.request(call))

    def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = True
    ) -> BlockingAsyncQueue:
        return self._wrap(self._run(self._async.create_queue(name, config, exist_ok=exist_ok)))

    def queue(self, name: str) -> BlockingAsyncQueue:
        return self._wrap(self._run(self._async.queue(name)))

    def exists(self, name: str) -> bool:
        return self._run(self._async.exists(name))

    def configure(self, name: str, **changes: Any) -> QueueConfig:
        return self._run(self._async.configure(name, **changes))

    def list_queues(self, prefix: str = "") -> list[str]:
        return self._run(self._async.list_queues(prefix))

    def delete_queue(self, name: str) -> None:
        self._run(self._async.delete_queue(name))

    def close(self) -> None:
        try:
            self._run(self._async.aclose())
        finally:
            self._loop.close()

    def __enter__(self) -> BlockingAsyncStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _wrap(self, queue: AsyncRemoteQueue) -> BlockingAsyncQueue:
        return BlockingAsyncQueue(self, queue)


class BlockingAsyncQueue:
    """`RemoteQueue`'s API over an `AsyncRemoteQueue`."""

    def __init__(self, store: BlockingAsyncStore, queue: AsyncRemoteQueue) -> None:
        self.name = queue.name
        self._store = store
        self._async = queue

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._store._run(coro)

    @property
    def config(self) -> QueueConfig:
        return self._run(self._async.config())

    def put(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        delay_s: float | None = None,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
        dedup_id: str | None = None,
        ttl_s: float | None = None,
        priority: int = 0,
    ) -> str:
        return self._run(
            self._async.put(
                body,
                headers,
                delay_s=delay_s,
                timeout_s=timeout_s,
                durability=durability,
                ttl_s=ttl_s,
                dedup_id=dedup_id,
                priority=priority,
            )
        )

    def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        *,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
    ) -> list[str]:
        return self._run(self._async.put_many(messages, timeout_s=timeout_s, durability=durability))

    def get(
        self, max_count: int = 1, *, visibility_s: float | None = None, wait_s: float = 0.0
    ) -> list[Message]:
        return self._run(self._async.get(max_count, visibility_s=visibility_s, wait_s=wait_s))

    def get_one(self, *, visibility_s: float | None = None, wait_s: float = 0.0) -> Message | None:
        return self._run(self._async.get_one(visibility_s=visibility_s, wait_s=wait_s))

    def ack(self, receipt: str) -> None:
        self._run(self._async.ack(receipt))

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        return self._run(self._async.ack_many(receipts))

    def extend_many(self, receipts: Iterable[str], visibility_s: float) -> dict[str, Exception]:
        return self._run(self._async.extend_many(receipts, visibility_s))

    def nack(self, receipt: str, delay_s: float = 0.0) -> str | None:
        return self._run(self._async.nack(receipt, delay_s))

    def nack_each(self, receipts: Iterable[str], delay_s: float = 0.0) -> dict[str, Exception]:
        return self._run(self._async.nack_each(receipts, delay_s))

    def extend(self, receipt: str, visibility_s: float) -> None:
        self._run(self._async.extend(receipt, visibility_s))

    def dead_letter(
        self, receipt: str, detail: str | None = None, *, reason: str = "rejected"
    ) -> None:
        self._run(self._async.dead_letter(receipt, detail, reason=reason))

    def delete(self, message_id: str) -> bool:
        return self._run(self._async.delete(message_id))

    def peek(self, message_id: str) -> Message:
        return self._run(self._async.peek(message_id))

    def browse(
        self, limit: int | None = None, *, after: str | None = None, state: str = "ready"
    ) -> Iterator[Message]:
        # A generator, as the sync client's: the request is sent on the first next().
        yield from self._run(self._async.browse(limit, after=after, state=state))

    def stats(self) -> QueueStats:
        return self._run(self._async.stats())

    def purge(self, *, dead: bool = False) -> int:
        return self._run(self._async.purge(dead=dead))

    def close(self) -> None:
        self._run(self._async.aclose())

    def __repr__(self) -> str:
        return f"<BlockingAsyncQueue over {self._async!r}>"
