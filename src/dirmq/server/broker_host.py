"""What the broker's engines need from the `Broker` that runs them, as a protocol.

`Broker` (broker.py) creates its engines, one of each per queue: the publish line
(publish_line.py), the get and ack batchers (batcher.py) and the long-poll waiters
(longpolls.py), so it imports their modules; an engine only hands work to the broker's pool,
leases and settles through its event-loop calls, gives back what nobody takes and counts what
it moved. Naming that here, below all of them, lets the engines import nothing from broker.py:
no import circle, and their dependencies are written down in one place. `Broker` is the one
implementation (it matches structurally; nothing registers).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from dirmq.store import Message, Queue, Store

T = TypeVar("T")
# The most one batch of an engine takes: messages a group commit of the publish line,
# requests a batch of a get or ack line.
MAX_BATCH_MESSAGES = 1024
# At most this many messages a store call on the event loop (a few ms of renames): a larger
# batch runs as several such calls, the loop's other work between them (`Broker.settle_chunks`);
# a waiter line's look on the loop leases no more (longpolls.py).
INLINE_MAX_MESSAGES = 256
# A receive that sends bodies from their files (`by_file`) gets bodies from this size on as
# `FileBody` (store/bodyfiles.py): the native plain GET's sendfile.
BODY_FILE_BYTES = 1024 * 1024


class BrokerHost(Protocol):
    store: Store  # its watch settings (poll interval) for the long polls
    closing: bool

    def submit(self, fn: Callable[..., Any], *args: object) -> Future[Any]:
        """Run `fn(*args)` on the broker's pool; RuntimeError once the pool is shut down."""
        ...

    async def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """A blocking store call, awaited from the pool."""
        ...

    def on_local_disk(self) -> bool:
        """Whether the root is on a local filesystem."""
        ...

    def looks_here(self) -> bool:
        """Whether a few store system calls (no listing) may run on the event loop now."""
        ...

    def runs_here(self, queue: Queue, messages: int) -> bool:
        """Whether a lease or settle call of `queue` on `messages` messages runs on the event
        loop now (else on the pool, or its cold lane while the queue has no index)."""
        ...

    def call_here(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn(*args, **kwargs)` on the event loop, now, timed (`runs_here` said so)."""
        ...

    def first_use(
        self, call: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """`call()` on the pool's cold lane (a queue this worker is taking up: coldlane.py);
        `done(result, None)` or `done(None, error)` on the event loop."""
        ...

    def register_later(self, step: Callable[[], None]) -> None:
        """`step()` on a later turn of the event loop, behind the requests (registrations.py)."""
        ...

    async def settle_call(
        self, queue: Queue, messages: int, fn: Callable[..., T], *args: object, **kwargs: object
    ) -> T:
        """A lease or settle call of `queue` on `messages` messages: on the event loop if
        `runs_here`, else on the pool (its cold lane while the queue has no index)."""
        ...

    async def lease(
        self,
        queue: Queue,
        wanted: int,
        visibility_s: float | None,
        consumer: str | None = None,
        by_file: bool = False,
    ) -> list[Message]:
        """Up to `wanted` messages of `queue`, leased through the broker's event-loop calls
        (naming `consumer` as the holder's label); `by_file`: large bodies left in their files
        (store/bodyfiles.py)."""
        ...

    async def settle_chunks(
        self,
        queue: Queue,
        fn: Callable[..., dict[str, Exception]],
        receipts: list[str],
        *args: object,
    ) -> dict[str, Exception]:
        """`fn(receipts, *args)`, a chunk at a time; the failures by receipt."""
        ...

    def give_back(self, queue: Queue, messages: list[Message]) -> None:
        """Make leased messages nobody will take ready again, without waiting."""
        ...

    def moved(self, kind: int, queue: str, count: int) -> None:
        """Count `count` messages of `queue` moved (`queuecounts.KINDS[kind]`)."""
        ...

    def watch_store(self) -> None:
        """Pump the store's shared inotify descriptor from the event loop."""
        ...
