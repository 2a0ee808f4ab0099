"""The synchronous HTTP client (httpx). Same API as `dirmq.Store` / `dirmq.Queue`."""

from __future__ import annotations

import ssl
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import httpx

from dirmq import errors
from dirmq.client import protocol as p
from dirmq.client import tls
from dirmq.client.stream import Consumer, StreamTarget
from dirmq.store import Durability, Message, OutgoingMessage, QueueConfig, QueueStats

DEFAULT_TIMEOUT_S = 30.0


def answer_of(response: httpx.Response) -> p.Answer:
    headers = [
        (k.decode("latin-1").lower(), v.decode("utf-8", "replace")) for k, v in response.headers.raw
    ]
    return p.Answer(response.status_code, headers, response.content)


def checked(response: httpx.Response) -> p.Answer:
    """The answer, or the dirmq error the server reported in it."""
    answer = answer_of(response)
    p.raise_for(answer)
    return answer


def unreachable(url: str, exc: httpx.HTTPError) -> errors.StorageIOError:
    """What a caller gets when the server cannot be reached or does not answer in time."""
    if isinstance(exc, httpx.TimeoutException):
        return errors.StorageIOError(
            0, f"dirmq at {url} did not answer in time ({type(exc).__name__})"
        )
    advice = tls.hint(str(exc))
    if not advice and url.startswith("http://") and isinstance(exc, httpx.RemoteProtocolError):
        advice = " (if the server serves HTTPS, use an https:// URL)"
    return errors.StorageIOError(0, f"cannot reach dirmq at {url}: {exc}{advice}")


class RemoteStore:
    """The queues of one dirmq server. Thread-safe (one connection pool). `token`: the bearer
    token of a server with credentials (default `$DIRMQ_TOKEN`; docs/security.md). For an
    https:// URL, `cafile`, `certfile`, `keyfile` and `ssl_context` say whom to trust and what
    client certificate to show (`dirmq.client.tls`)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        token: str | None = None,
        cafile: str | None = None,
        certfile: str | None = None,
        keyfile: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        verify = tls.verify_argument(cafile, certfile, keyfile, ssl_context)
        headers = p.auth_headers(token)
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout_s, headers=headers, verify=verify
        )
        self._timeout_s = timeout_s
        self.stream_target = StreamTarget(self.url, headers, verify, timeout_s)

    def request(self, call: p.Call) -> p.Answer:
        """Send one call; raise the library's error for an error answer."""
        try:
            response = self._http.request(
                call.method,
                call.path,
                params=call.params or None,
                headers={k.encode(): v for k, v in call.headers.items()} or None,
                content=call.body or None,
                timeout=call.timeout_s or self._timeout_s,
            )
        except httpx.HTTPError as exc:
            raise unreachable(self.url, exc) from exc
        return checked(response)

    def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = True
    ) -> RemoteQueue:
        if self.exists(name):
            if not exist_ok:
                raise errors.QueueExists(f"queue {name!r} already exists")
            return RemoteQueue(self, name)
        self.request(p.put_queue_call(name, config))
        return RemoteQueue(self, name)

    def queue(self, name: str) -> RemoteQueue:
        """The queue `name` (QueueNotFound if the server has no such queue)."""
        self.request(p.queue_call(name))
        return RemoteQueue(self, name)

    def exists(self, name: str) -> bool:
        try:
            self.request(p.queue_call(name))
        except errors.QueueNotFound:
            return False
        return True

    def configure(self, name: str, **changes: Any) -> QueueConfig:
        return p.config_from(self.request(p.put_queue_call(name, changes)))

    def list_queues(self, prefix: str = "") -> list[str]:
        return p.queue_names(self.request(p.list_call(prefix)))

    def delete_queue(self, name: str) -> None:
        self.request(p.delete_queue_call(name))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class RemoteQueue:
    """One queue on a dirmq server; every method is one HTTP request (`ack_many` and
    `extend_many`: one per 1000 receipts), except iteration and `consume`: a stream
    (`dirmq.client.stream`).

    Iterating (`for message in queue:`) streams: one WebSocket with `prefetch` 100, the server
    pushing messages as they come (blocking while the queue is empty); `queue.ack(receipt)` and
    `queue.nack(receipt)` of a message it yielded go over that stream, buffered."""

    def __init__(self, store: RemoteStore, name: str) -> None:
        p.queue_path(name)  # InvalidName now, not at the first request
        self.name = name
        self._store = store
        self._consumer: Consumer | None = None  # the stream iteration uses

    def consume(self, prefetch: int = 100, visibility_s: float | None = None) -> Consumer:
        """A streaming consumer: at most `prefetch` unacknowledged messages pushed to it,
        each leased for `visibility_s` (the queue's default if None)."""
        return Consumer(
            self._store.stream_target, self.name, prefetch=prefetch, visibility_s=visibility_s
        )

    def __iter__(self) -> Iterator[Message]:
        if self._consumer is not None:
            self._consumer.close()
        consumer = self._consumer = self.consume()
        return consumer

    def _streamed(self, receipt: str) -> Consumer | None:
        consumer = self._consumer
        if consumer is not None and not consumer.closed and consumer.holds(receipt):
            return consumer
        return None

    @property
    def config(self) -> QueueConfig:
        return p.config_from(self._store.request(p.queue_call(self.name)))

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
        message = OutgoingMessage(
            body, headers or {}, delay_s, dedup_id, ttl_s=ttl_s, priority=priority
        )
        return self.put_many([message], timeout_s=timeout_s, durability=durability)[0]

    def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        *,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
    ) -> list[str]:
        """As `Queue.put_many`, except that `timeout_s=None` does not wait at capacity (an HTTP
        request that may block forever is not useful): give a timeout to wait."""
        outgoing = [m if isinstance(m, OutgoingMessage) else OutgoingMessage(m) for m in messages]
        if not outgoing:
            return []
        call = p.publish_call(self.name, outgoing, durability, timeout_s)
        return p.published_ids(self._store.request(call))

    def get(
        self, max_count: int = 1, *, visibility_s: float | None = None, wait_s: float = 0.0
    ) -> list[Message]:
        call = p.receive_call(self.name, max_count, visibility_s, wait_s)
        return p.received(self._store.request(call))

    def get_one(self, *, visibility_s: float | None = None, wait_s: float = 0.0) -> Message | None:
        got = self.get(1, visibility_s=visibility_s, wait_s=wait_s)
        return got[0] if got else None

    def ack(self, receipt: str) -> None:
        consumer = self._streamed(receipt)
        if consumer is not None:
            consumer.ack(receipt)
            return
        self._store.request(p.ack_call(self.name, receipt))

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """As `Queue.ack_many`: the failures by receipt (each receipt once). One request per
        1000 receipts; an error of a whole request (StorageError, QueueNotFound...) is raised
        at once, and the receipts of later requests are left untouched."""
        return self._settle_many(p.settle_many(self.name, "ack", receipts))

    def extend_many(self, receipts: Iterable[str], visibility_s: float) -> dict[str, Exception]:
        """As `Queue.extend_many`, in requests as `ack_many`."""
        return self._settle_many(p.settle_many(self.name, "extend", receipts, visibility_s))

    def nack_each(self, receipts: Iterable[str], delay_s: float = 0.0) -> dict[str, Exception]:
        """As `Queue.nack_each`, in requests as `ack_many`."""
        return self._settle_many(p.settle_many(self.name, "nack", receipts, delay_s or None))

    def _settle_many(self, batch: p.SettleMany) -> dict[str, Exception]:
        failures = batch.failures
        for call in batch.calls:
            failures.update(p.settle_failures(self._store.request(call)))
        return failures

    def nack(self, receipt: str, delay_s: float = 0.0) -> str | None:
        """As `Queue.nack`: what became of the message; None for a message of a stream
        (`consume`), whose settles are not answered one by one."""
        consumer = self._streamed(receipt)
        if consumer is not None:
            consumer.nack(receipt, delay_s)
            return None
        return p.settled_outcome(self._store.request(p.nack_call(self.name, receipt, delay_s)))

    def extend(self, receipt: str, visibility_s: float) -> None:
        self._store.request(p.extend_call(self.name, receipt, visibility_s))

    def dead_letter(
        self, receipt: str, detail: str | None = None, *, reason: str = "rejected"
    ) -> None:
        self._store.request(p.dead_letter_call(self.name, receipt, detail, reason))

    def delete(self, message_id: str) -> bool:
        try:
            self._store.request(p.delete_call(self.name, message_id))
        except errors.MessageNotFound:
            return False
        return True

    def peek(self, message_id: str) -> Message:
        return p.peeked(self._store.request(p.peek_call(self.name, message_id)))

    def browse(
        self, limit: int | None = None, *, after: str | None = None, state: str = "ready"
    ) -> Iterator[Message]:
        """Messages of `state` (as `Queue.browse`: ready, leased, delayed, dead) in FIFO order
        (those after the id `after`, if given), without leasing
        them: every one, or the first `limit`, in pages of up to 1000 (one request each, each
        asking for the messages after the last one seen), fetched as the iteration needs them.
        Like `Queue.browse`, not one point-in-time image of a queue others are changing."""
        left = limit
        while left is None or left > 0:
            call = p.browse_call(self.name, left, after, state)
            page = p.browsed(self._store.request(call))
            if not page:
                return
            yield from page
            after = page[-1].id
            if left is not None:
                left -= len(page)

    def stats(self) -> QueueStats:
        return p.stats_from(self._store.request(p.queue_call(self.name)))

    def purge(self, *, dead: bool = False) -> int:
        """As `Queue.purge`: every live message, or with `dead` the queue's own dead area."""
        return p.purged(self._store.request(p.purge_call(self.name, dead)))

    def close(self) -> None:
        """Close the stream iteration opened, if any (what it still holds goes back)."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __repr__(self) -> str:
        return f"<dirmq.client.RemoteQueue {self.name!r} at {self._store.url}>"
