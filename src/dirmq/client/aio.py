"""The asyncio HTTP client (httpx.AsyncClient): the sync client's API, every call awaitable.

    from dirmq.client import AsyncRemoteStore

    async with AsyncRemoteStore("http://127.0.0.1:8080") as store:
        orders = await store.create_queue("shop/orders")
        await orders.put(b"hello")
        message = await orders.get_one(wait_s=20)
        if message is not None:
            await orders.ack(message.receipt)

Differences from `RemoteStore` / `RemoteQueue`, all forced by `async`:

- `close()` is `aclose()`, and `with` is `async with`.
- `config` is a method, `await queue.config()`: a property cannot await its request.
- `browse()` returns a list (`await queue.browse()`), not an iterator: every page of the
  snapshot, gathered.
- The streaming receive is `async with queue.consume() as consumer: async for message in
  consumer: ...` (or `consumer = await queue.consume()`); its `ack` awaits (`AsyncConsumer`).

An https:// URL takes the sync client's TLS keywords (`cafile`, `certfile`, `keyfile`,
`ssl_context`: `dirmq.client.tls`).

Requests are built and answers read by `dirmq.client.protocol`, exactly as the sync client does;
errors are the library's. A waiting `get` holds one pooled connection for its whole wait, so size
`max_connections` to the number of concurrent long polls plus the other traffic (None: no limit).
Cancelling a waiting `get` closes its connection, and the server hands back anything it leased for
it. One `AsyncRemoteStore` belongs to one event loop.
"""

from __future__ import annotations

import ssl
from collections.abc import Coroutine, Generator, Iterable, Mapping
from typing import Any

import httpx

from dirmq import errors
from dirmq.client import protocol as p
from dirmq.client import tls
from dirmq.client.remote import DEFAULT_TIMEOUT_S, checked, unreachable
from dirmq.client.stream import AsyncConsumer, StreamTarget
from dirmq.store import Durability, Message, OutgoingMessage, QueueConfig, QueueStats

DEFAULT_MAX_CONNECTIONS = 100


class AsyncRemoteStore:
    """The queues of one dirmq server, for one event loop (one connection pool)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_connections: int | None = DEFAULT_MAX_CONNECTIONS,
        cafile: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self._max_connections = max_connections
        headers = p.auth_headers(token)
        verify = tls.verify_argument(cafile, certfile, keyfile, ssl_context)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            timeout=timeout_s,
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=20),
            verify=verify,
        )
        self.stream_target = StreamTarget(self.url, headers, verify, timeout_s)
        self._timeout_s = timeout_s

    async def request(self, call: p.Call) -> p.Answer:
        """Send one call; raise the library's error for an error answer."""
        try:
            response = await self._http.request(
                call.method,
                call.path,
                params=call.params or None,
                headers={k.encode(): v for k, v in call.headers.items()} or None,
                content=call.body or None,
                timeout=call.timeout_s or self._timeout_s,
            )
        except httpx.PoolTimeout as exc:
            raise errors.StorageIOError(
                0,
                f"no free connection to dirmq at {self.url}: all {self._max_connections} are busy "
                "(each waiting get holds one; raise max_connections)",
            ) from exc
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc) from exc
        return checked(response)

    async def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = True
    ) -> AsyncRemoteQueue:
        if await self.exists(name):
            if not exist_ok:
                raise errors.QueueExists(f"queue {name!r} already exists")
            return AsyncRemoteQueue(self, name)
        await self.request(p.put_queue_call(name, config))
        return AsyncRemoteQueue(self, name)

    async def queue(self, name: str) -> AsyncRemoteQueue:
        """The queue `name` (QueueNotFound if the server has no such queue)."""
        await self.request(p.queue_call(name))
        return AsyncRemoteQueue(self, name)

    async def exists(self, name: str) -> bool:
        try:
            await self.request(p.queue_call(name))
        except errors.QueueNotFound:
            return False
        return True

    async def configure(self, name: str, **changes: Any) -> QueueConfig:
        return p.config_from(await self.request(p.put_queue_call(name, changes)))

    async def list_queues(self, prefix: str = "") -> list[str]:
        return p.queue_names(await self.request(p.list_call(prefix)))

    async def delete_queue(self, name: str) -> None:
        await self.request(p.delete_queue_call(name))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncRemoteStore:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()


class AsyncRemoteQueue:
    """One queue on a dirmq server; every method is one HTTP request (`ack_many` and
    `extend_many`: one per 1000 receipts)."""

    def __init__(self, store: AsyncRemoteStore, name: str) -> None:
        p.queue_path(name)  # InvalidName now, as the sync client
        self.name = name
        self._store = store

    def consume(self, prefetch: int = 100, visibility_s: float | None = None) -> _Connecting:
        """A streaming consumer (`RemoteQueue.consume`): `async with queue.consume() as c`, or
        `c = await queue.consume()` (then `await c.aclose()`)."""
        return _Connecting(
            AsyncConsumer.connect(
                self._store.stream_target, self.name, prefetch=prefetch, visibility_s=visibility_s
            )
        )

    async def config(self) -> QueueConfig:
        return p.config_from(await self._store.request(p.queue_call(self.name)))

    async def put(
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
        message = OutgoingMessage(
            body, headers or {}, delay_s, dedup_id, ttl_s=ttl_s, priority=priority
        )
        return (await self.put_many([message], timeout_s=timeout_s, durability=durability))[0]

    async def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        *,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
    ) -> list[str]:
        outgoing = [m if isinstance(m, OutgoingMessage) else OutgoingMessage(m) for m in messages]
        if not outgoing:
            return []
        call = p.publish_call(self.name, outgoing, durability, timeout_s)
        return p.published_ids(await self._store.request(call))

    async def get(
        self, max_count: int = 1, *, visibility_s: float | None = None, wait_s: float = 0.0
    ) -> list[Message]:
        call = p.receive_call(self.name, max_count, visibility_s, wait_s)
        return p.received(await self._store.request(call))

    async def get_one(
        self, *, visibility_s: float | None = None, wait_s: float = 0.0
    ) -> Message | None:
        got = await self.get(1, visibility_s=visibility_s, wait_s=wait_s)
        return got[0] if got else None

    async def ack(self, receipt: str) -> None:
        await self._store.request(p.ack_call(self.name, receipt))

    async def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """As `Queue.ack_many`: the failures by receipt (each receipt once). One request per
        1000 receipts; an error of a whole request (StorageError, QueueNotFound...) is raised
        at once, and the receipts of later requests are left untouched."""
        return await self._settle_many(p.settle_many(self.name, "ack", receipts))

    async def extend_many(
        self, receipts: Iterable[str], visibility_s: float
    ) -> dict[str, Exception]:
        """As `Queue.extend_many`, in requests as `ack_many`."""
        return await self._settle_many(p.settle_many(self.name, "extend", receipts, visibility_s))

    async def nack_each(
        self, receipts: Iterable[str], delay_s: float = 0.0
    ) -> dict[str, Exception]:
        """As `Queue.nack_each`, in requests as `ack_many`."""
        return await self._settle_many(p.settle_many(self.name, "nack", receipts, delay_s or None))

    async def _settle_many(self, batch: p.SettleMany) -> dict[str, Exception]:
        failures = batch.failures
        for call in batch.calls:
            failures.update(p.settle_failures(await self._store.request(call)))
        return failures

    async def nack(self, receipt: str, delay_s: float = 0.0) -> str | None:
        answer = await self._store.request(p.nack_call(self.name, receipt, delay_s))
        return p.settled_outcome(answer)

    async def extend(self, receipt: str, visibility_s: float) -> None:
        await self._store.request(p.extend_call(self.name, receipt, visibility_s))

    async def dead_letter(
        self, receipt: str, detail: str | None = None, *, reason: str = "rejected"
    ) -> None:
        await self._store.request(p.dead_letter_call(self.name, receipt, detail, reason))

    async def delete(self, message_id: str) -> bool:
        try:
            await self._store.request(p.delete_call(self.name, message_id))
        except errors.MessageNotFound:
            return False
        return True

    async def peek(self, message_id: str) -> Message:
        return p.peeked(await self._store.request(p.peek_call(self.name, message_id)))

    async def browse(
        self, limit: int | None = None, *, after: str | None = None, state: str = "ready"
    ) -> list[Message]:
        """Messages of `state` in FIFO order (after the id `after`, if given), without leasing them:
        a list, where the sync client returns an iterator, gathered from pages of up to 1000."""
        found: list[Message] = []
        while limit is None or len(found) < limit:
            left = None if limit is None else limit - len(found)
            call = p.browse_call(self.name, left, after, state)
            page = p.browsed(await self._store.request(call))
            if not page:
                break
            found.extend(page)
            after = page[-1].id
        return found

    async def stats(self) -> QueueStats:
        return p.stats_from(await self._store.request(p.queue_call(self.name)))

    async def purge(self, *, dead: bool = False) -> int:
        return p.purged(await self._store.request(p.purge_call(self.name, dead)))

    async def aclose(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<dirmq.client.AsyncRemoteQueue {self.name!r} at {self._store.url}>"


class _Connecting:
    """An `AsyncConsumer` being connected: awaited, or entered with `async with`."""

    def __init__(self, connecting: Coroutine[Any, Any, AsyncConsumer]) -> None:
        self._connecting = connecting
        self._consumer: AsyncConsumer | None = None

    def __await__(self) -> Generator[Any, None, AsyncConsumer]:
        return self._connecting.__await__()

    async def __aenter__(self) -> AsyncConsumer:
        self._consumer = await self._connecting
        return self._consumer

    async def __aexit__(self, *_exc: object) -> None:
        if self._consumer is not None:
            await self._consumer.aclose()
