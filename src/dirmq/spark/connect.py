"""Reaching a queue from a Spark process: a local root (`path`) or a dirmq server (`url`).

Spark runs our code in many short calls inside long-lived Python workers (executors reuse their
workers; the driver keeps one per streaming source). Opening a local queue builds an in-memory
index of it, so each process keeps one `Store` per root (and one HTTP client per URL) and reuses
it for every task. Both transports offer the same Queue API; `QueueHandle` is the part of it this
package uses.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from dirmq.errors import MessageTooLarge, QueueNotFound
from dirmq.spark.options import Options
from dirmq.store import Message, OutgoingMessage, QueueConfig, QueueStats, Store
from dirmq.store.filemodes import PRIVATE, Access

# Messages (a get) or receipts (an ack_many, extend_many, nack_each) one request to the server
# carries at most: the server's limit.
PER_REQUEST = 1000

if TYPE_CHECKING:  # the HTTP client (httpx) is imported only by processes that use `url`:
    from dirmq.client import RemoteStore  # ~80 ms at the start of every Python worker


class QueueHandle(Protocol):
    """What both `dirmq.Queue` and `dirmq.client.RemoteQueue` provide."""

    name: str

    @property
    def config(self) -> QueueConfig: ...

    def put_many(
        self, messages: Iterable[bytes | OutgoingMessage], *, timeout_s: float | None = None
    ) -> list[str]: ...

    def get(
        self, max_count: int = 1, *, visibility_s: float | None = None, wait_s: float = 0.0
    ) -> list[Message]: ...

    def ack(self, receipt: str) -> None: ...

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]: ...

    def nack(self, receipt: str, delay_s: float = 0.0) -> str | None: ...

    def nack_each(self, receipts: Iterable[str], delay_s: float = 0.0) -> dict[str, Exception]: ...

    def extend_many(self, receipts: Iterable[str], visibility_s: float) -> dict[str, Exception]: ...

    def extend(self, receipt: str, visibility_s: float) -> None: ...

    def delete(self, message_id: str) -> bool: ...

    def peek(self, message_id: str) -> Message: ...

    def browse(
        self, limit: int | None = None, *, after: str | None = None
    ) -> Iterator[Message]: ...

    def stats(self) -> QueueStats: ...


_lock = threading.Lock()
_stores: dict[str, Store] = {}
_remotes: dict[str, RemoteStore] = {}
_pid = os.getpid()


def _forget_after_fork() -> None:
    # A Store's inotify descriptor and threads do not survive fork: start afresh in the child.
    global _pid
    if os.getpid() != _pid:
        _stores.clear()
        _remotes.clear()
        _pid = os.getpid()


def local_store(root: str) -> Store:
    """This process's `Store` for `root` (which must already be a dirmq root)."""
    with _lock:
        _forget_after_fork()
        store = _stores.get(root)
        if store is None:
            store = Store(root, create=False)
            _stores[root] = store
        return store


def state_access(options: Options) -> Access:
    """The modes of the Spark layer's own files (ledgers, staging, markers): the root's access
    in path mode, private over `url` (a directory of the driver's, not a root)."""
    if options.path is not None:
        return local_store(options.path).access
    return Access.named(PRIVATE)


def remote_store(url: str) -> RemoteStore:
    from dirmq.client import RemoteStore

    with _lock:
        _forget_after_fork()
        remote = _remotes.get(url)
        if remote is None:
            remote = RemoteStore(url)
            _remotes[url] = remote
        return remote


def close_all() -> None:
    """Close every Store and HTTP client this process keeps (for a process about to exit, or a
    test that must leave nothing open)."""
    with _lock:
        stores, remotes = list(_stores.values()), list(_remotes.values())
        _stores.clear()
        _remotes.clear()
    for store in stores:
        store.close()
    for remote in remotes:
        remote.close()


def open_queue(options: Options, *, create: bool = False) -> QueueHandle:
    """The queue named by `options` (QueueNotFound if it is missing and `create` is false)."""
    if options.path is not None:
        if create:
            with _lock:
                os.makedirs(options.path, exist_ok=True)
            Store(options.path).close()  # makes the root if needed
            return local_store(options.path).create_queue(options.queue)
        try:
            return local_store(options.path).queue(options.queue)
        except QueueNotFound:
            raise QueueNotFound(
                f"queue {options.queue!r} does not exist under {options.path}"
            ) from None
    assert options.url is not None
    remote = remote_store(options.url)
    if create:
        return remote.create_queue(options.queue)
    return remote.queue(options.queue)


def message_checker(options: Options) -> Callable[[OutgoingMessage], None]:
    """A function raising what publishing `message` to the queue would raise (size, headers,
    delay, group), so a write task can refuse a bad row before anything is published."""
    if options.path is not None:
        return local_store(options.path).queue(options.queue).validate
    from dirmq.client import protocol

    limit = open_queue(options).config.max_message_bytes

    def check(message: OutgoingMessage) -> None:
        protocol.check_message(message)
        if len(message.body) > limit:
            raise MessageTooLarge(
                f"message is {len(message.body)} bytes; queue {options.queue!r} accepts at "
                f"most {limit}"
            )

    return check


def flush_local(options: Options) -> None:
    """Make what this process published to a `writeback` queue durable now (a no-op over HTTP,
    where the server keeps its own promise)."""
    if options.path is not None:
        local_store(options.path).writeback.flush_now()
