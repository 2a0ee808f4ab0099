"""The synchronous HTTP client (httpx). Same API as `dirmq.Store` / `dirmq.Queue`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import httpx

from dirmq import errors
from dirmq.client import protocol as p
from dirmq.store import Durability, Message, OutgoingMessage, QueueConfig, QueueStats

DEFAULT_TIMEOUT_S = 30.0


def answer_of(response: httpx.Response) -> p.Answer:
    headers = [
        (k.decode("latin-1").lower(), v.decode("utf-8", "replace")) for k, v in response.headers.raw
    ]
    return p.Answer(response.status_code, headers, response.content)


class RemoteStore:
    """The queues of one dirmq server. Thread-safe (one connection pool)."""

    def __init__(self, url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)
        self._timeout_s = timeout_s

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
            raise errors.StorageIOError(0, f"cannot reach dirmq at {self.url}: {exc}") from exc
        answer = answer_of(response)
        p.raise_for(answer)
        return answer

    def create_queue(
        self, name: str, config: QueueConfig | None = None, *, exist_ok: bool = True
    ) -> RemoteQueue:
        if self.exists(name):
            if not exist_ok:
                raise errors.QueueExists(f"queue {name!r} already exists")
            return RemoteQueue(self, name)
        self.request(p.Call("PUT", p.queue_path(name), body=p.config_body(config)))
        return RemoteQueue(self, name)

    def queue(self, name: str) -> RemoteQueue:
        """The queue `name` (QueueNotFound if the server has no such queue)."""
        self.request(p.Call("GET", p.queue_path(name)))
        return RemoteQueue(self, name)

    def exists(self, name: str) -> bool:
        try:
            self.request(p.Call("GET", p.queue_path(name)))
        except errors.QueueNotFound:
            return False
        return True

    def configure(self, name: str, **changes: Any) -> QueueConfig:
        return p.config_from(
            self.request(p.Call("PUT", p.queue_path(name), body=p.config_body(changes)))
        )

    def list_queues(self, prefix: str = "") -> list[str]:
        params = {"prefix": prefix} if prefix else {}
        return list(self.request(p.Call("GET", "/", params)).json()["queues"])

    def delete_queue(self, name: str) -> None:
        self.request(p.Call("DELETE", p.queue_path(name)))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class RemoteQueue:
    """One queue on a dirmq server; every method is one HTTP request."""

    def __init__(self, store: RemoteStore, name: str) -> None:
        self.name = name
        self._store = store
        self._path = p.queue_path(name)

    @property
    def config(self) -> QueueConfig:
        return p.config_from(self._store.request(p.Call("GET", self._path)))

    def put(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        delay_s: float | None = None,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
        dedup_id: str | None = None,
    ) -> str:
        message = OutgoingMessage(body, headers or {}, delay_s, dedup_id)
        return self.put_many([message], timeout_s=timeout_s, durability=durability)[0]

    def put_many(
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
        self._store.request(p.Call("DELETE", f"{self._path}/messages/{p.ref(receipt)}"))

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        failures: dict[str, Exception] = {}
        for receipt in receipts:
            try:
                self.ack(receipt)
            except (errors.StaleReceipt, errors.InvalidArgument) as exc:
                failures[receipt] = exc
        return failures

    def nack(self, receipt: str, delay_s: float = 0.0) -> None:
        self._settle(receipt, "nack", {"delay": p.seconds(delay_s)})

    def extend(self, receipt: str, visibility_s: float) -> None:
        self._settle(receipt, "extend", {"visibility": p.seconds(visibility_s)})

    def dead_letter(self, receipt: str) -> None:
        self._settle(receipt, "dead-letter", {})

    def _settle(self, receipt: str, action: str, params: dict[str, str]) -> None:
        path = f"{self._path}/messages/{p.ref(receipt, need_receipt=True)}/{action}"
        self._store.request(p.Call("POST", path, params))

    def delete(self, message_id: str) -> bool:
        try:
            self._store.request(
                p.Call("DELETE", f"{self._path}/messages/{p.ref(message_id, need_id=True)}")
            )
        except errors.MessageNotFound:
            return False
        return True

    def peek(self, message_id: str) -> Message:
        answer = self._store.request(
            p.Call("GET", f"{self._path}/messages/{p.ref(message_id, need_id=True)}")
        )
        return p.received(answer)[0]

    def browse(self, limit: int | None = None) -> Iterator[Message]:
        params = {"peek": "1", "max": str(limit or 1000)}
        yield from p.browsed(self._store.request(p.Call("GET", f"{self._path}/messages", params)))

    def stats(self) -> QueueStats:
        return p.stats_from(self._store.request(p.Call("GET", self._path)))

    def purge(self) -> int:
        return int(self._store.request(p.Call("DELETE", f"{self._path}/messages")).json()["purged"])

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<dirmq.client.RemoteQueue {self.name!r} at {self._store.url}>"
