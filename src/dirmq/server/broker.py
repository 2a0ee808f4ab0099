"""The store, for asyncio: group commit across concurrent requests, cheap long polls.

Store calls block (fsync, rename), so they run on a thread pool. Two things need more than that:

- Publishing. Every request's messages for one queue join the queue's pending line; while one
  `put_many` is flushing, the next batch gathers, so N concurrent publishers share each flush
  (one syncfs + one directory fsync per batch) instead of queueing N flushes. One pool thread
  drains a queue's line batch after batch for as long as it is not empty, and wakes the event
  loop once per batch: no executor round trip nor task per batch, no task per request. On a
  memory filesystem (tmpfs, ramfs), where no store call waits for a device, the event loop
  drains the line itself, once per loop iteration: handing each batch to a thread cost more
  (GIL hand-offs, futex wake-ups) than writing it.
- Long polls. A waiting receive is a future in the queue's waiter line, not a thread: thousands
  cost a few KiB each. One task per queue with waiters sleeps on the queue's inotify descriptor
  (any process's publish, nack or expiry wakes it) or until the next lease or delay falls due,
  then leases messages for the waiters in arrival order. Messages leased for a waiter that gave up
  meanwhile are handed back at once.

Why it is long: the publish line, the batchers of gets and acks and the long-poll waiters each are
a class of their own here, and all lean on the broker's pool and its event-loop hand-offs; apart,
each would import the broker back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from dirmq.errors import DirmqError, QueueFull, StorageError
from dirmq.server.queuecounts import ACKED, DELIVERED, KINDS, NACKED, PUBLISHED, QueueCounts
from dirmq.store import Durability, Message, OutgoingMessage, Queue, Store

T = TypeVar("T")
log = logging.getLogger("dirmq.server")
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
MAX_BATCH_MESSAGES = 1024
# Messages one batch of the get line leases for all its requests together (a request's own
# limit is the API's 1000). A request the cap leaves without a share waits for the next batch:
# answering it "nothing" would tell a consumer that polls without waiting that a deep queue
# is empty (two Spark lease-ahead threads on one connection each took it for the end).
MAX_GET_BATCH = 1000
# A lease or settle call run on the event loop that took longer than this sends such calls to
# the thread pool for a while (see `Broker.settle_call`). Not lower: on a busy disk a batch
# now and then takes 20-50 ms (and waits for the GIL), and at 20 ms a drain spent most of its
# time on the pool for nothing (6.5k GET + DELETE a second at 100 ms, 5.5k at 20 ms).
INLINE_STALL_S = 0.1
POOL_AFTER_STALL_S = 10.0
# At most this many messages a store call on the event loop (a few ms of renames): a larger
# batch runs as several such calls, the loop's other work between them (`settle_chunks`).
INLINE_MAX_MESSAGES = 256
BATCHES_PER_TURN = 16  # then a drain goes to the back of the pool's line: other calls get a turn
IDLE_RECHECK_S = 30.0
# Every RELEASE_EVERY_S, queues nobody waits on nor used for IDLE_RELEASE_S give back their
# inotify watches and index (`Store.release_idle`): a server that touched 10,000 queues must not
# keep 40,000 watches (the user's limit is often 8,192) and their indexes for its lifetime.
RELEASE_EVERY_S = 15.0
IDLE_RELEASE_S = 60.0


class MessageCounts(Protocol):
    """Told how many messages the broker moved, once per batch (the server's metrics)."""

    def published(self, count: int) -> None: ...
    def delivered(self, count: int) -> None: ...
    def acked(self, count: int) -> None: ...
    def nacked(self, count: int) -> None: ...


class _Uncounted:
    def published(self, count: int) -> None:
        pass

    def delivered(self, count: int) -> None:
        pass

    def acked(self, count: int) -> None:
        pass

    def nacked(self, count: int) -> None:
        pass


# Called on the event loop with a publish's ids, or with the error that failed it.
Settle = Callable[[list[str] | BaseException], None]


@dataclass(slots=True)
class _Publish:
    messages: list[OutgoingMessage]
    durability: Durability | None
    settle: Settle  # no hop through the event loop between storing and answering

    def finish(self, outcome: list[str] | BaseException) -> None:
        try:
            self.settle(outcome)
        except Exception:  # one request's bug must not keep the rest of the batch waiting
            log.exception("settling a publish failed")


def _resolve(future: asyncio.Future[list[str]], outcome: list[str] | BaseException) -> None:
    if future.done():  # its request was cancelled: the messages are stored all the same
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@dataclass(slots=True)
class _Waiter:
    max_count: int
    visibility_s: float | None
    future: asyncio.Future[list[Message]] = field(repr=False)
    max_per_group: int | None = 1
    consumer: str | None = None  # whom the leases name as their holder (`Queue.get`)


class Broker:
    """One per worker process and root."""

    def __init__(
        self,
        store: Store,
        threads: int = 32,
        counts: MessageCounts | None = None,
        queue_counts: QueueCounts | None = None,
    ) -> None:
        self.store = store
        self.counts: MessageCounts = counts or _Uncounted()
        # By queue (the console's rates); the Store's events count there too (`serve.py`).
        self.queue_counts = queue_counts or QueueCounts()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="dirmq-store")
        self._release_timer: asyncio.TimerHandle | None = None
        self._publishers: dict[str, _Publisher] = {}
        self._receivers: dict[str, _Receiver] = {}
        self._getters: dict[str, _Batcher] = {}
        self._ackers: dict[str, _Batcher] = {}
        self._hub_fd: int | None = None
        self.closing = False
        self._inline = not store.context.shared  # see `settle_call`
        self._on_pool_until = 0.0  # time.monotonic(): settle calls on the pool until then

    def start(self) -> None:
        """On the event loop, once: from now on, now and then, the queues nobody waits on
        give back their inotify watches and indexes (`Store.release_idle`)."""
        self._release_timer = asyncio.get_running_loop().call_later(
            RELEASE_EVERY_S, self._release_idle
        )

    def _release_idle(self) -> None:
        if self.closing:
            return
        try:
            self._executor.submit(self.store.release_idle, IDLE_RELEASE_S)
        except RuntimeError:  # the pool is shut down
            return
        self._release_timer = asyncio.get_running_loop().call_later(
            RELEASE_EVERY_S, self._release_idle
        )

    def moved(self, kind: int, queue: str, count: int) -> None:
        """Count `count` messages of `queue` moved (`queuecounts.KINDS[kind]`): in the metrics'
        totals and in the per-queue counts. A metrics bug must not cost a client its answer (or
        its messages their lease)."""
        try:
            self.queue_counts.add(queue, kind, count)
            getattr(self.counts, KINDS[kind])(count)
        except Exception:
            log.exception("counting messages failed")

    async def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Run a blocking store call on the thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def settle_call(
        self,
        queue: Queue,
        messages: int,
        fn: Callable[..., T],
        *args: object,
        **kwargs: object,
    ) -> T:
        """A lease or settle call of `queue` on `messages` messages: on a local filesystem, run
        here on the event loop. It is a rename or two a message, cheaper done here than handed
        to a pool thread and back (the hand-off and its wake-ups cost more: GET + DELETE drained
        17% faster, with 15% less server CPU a message). A call slower than `INLINE_STALL_S` (a
        stalled disk) sends every such call to the pool for `POOL_AFTER_STALL_S`, so a slow
        disk does not hold up every connection of the worker. On a shared filesystem (a network
        round trip a rename), for more than `INLINE_MAX_MESSAGES`, and while this process has
        no index of the queue (its first use lists the queue's directories: on a deep backlog,
        seconds), always the pool."""
        if (
            messages > INLINE_MAX_MESSAGES
            or not self._inline
            or not queue.indexed()
            or self._on_pool_until > (began := time.monotonic())
        ):
            return await self.call(fn, *args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            ended = time.monotonic()
            if ended - began > INLINE_STALL_S:
                self._on_pool_until = ended + POOL_AFTER_STALL_S
                log.info(
                    "a %s took %.0f ms on the event loop: lease and settle calls run on the "
                    "pool for %.0f s",
                    getattr(fn, "__name__", "store call"),
                    (ended - began) * 1000,
                    POOL_AFTER_STALL_S,
                )

    async def settle_chunks(
        self,
        queue: Queue,
        fn: Callable[..., dict[str, Exception]],
        receipts: list[str],
        *args: object,
    ) -> dict[str, Exception]:
        """`fn(receipts, *args)` (a settle of each receipt, returning the failures) through
        `settle_call`, at most `INLINE_MAX_MESSAGES` receipts a call. A large batch (a
        stream's 1,000 acks) then runs on the event loop as the small ones do, a chunk at a
        time, rather than on a pool thread: there it held the queue's lock while it waited for
        the GIL, and the event loop's own leases waited for the lock (a 2-worker stream drain
        spent a fifth of its event loop's time so, and 10-15% more CPU a message)."""
        if not self._inline or len(receipts) <= INLINE_MAX_MESSAGES:
            return await self.settle_call(queue, len(receipts), fn, receipts, *args)
        failures: dict[str, Exception] = {}
        for start in range(0, len(receipts), INLINE_MAX_MESSAGES):
            if start:
                await asyncio.sleep(0)  # the requests that came meanwhile get their turn
            chunk = receipts[start : start + INLINE_MAX_MESSAGES]
            failures.update(await self.settle_call(queue, len(chunk), fn, chunk, *args))
        return failures

    async def lease(
        self, queue: Queue, wanted: int, visibility_s: float | None, consumer: str | None = None
    ) -> list[Message]:
        """Up to `wanted` messages of `queue` (`Queue.get`, one message per group), leased
        through `settle_call` at most `INLINE_MAX_MESSAGES` a call, as `settle_chunks`. If a
        later call fails, what the earlier ones leased goes back before the error is raised.
        `consumer`: the holder's label the leases carry (a request's principal)."""
        step = INLINE_MAX_MESSAGES if self._inline else wanted
        got: list[Message] = []
        try:
            while len(got) < wanted:
                if got:
                    await asyncio.sleep(0)
                ask = min(step, wanted - len(got))
                more: list[Message] = await self.settle_call(
                    queue, ask, queue.get, ask, visibility_s=visibility_s, consumer=consumer
                )
                got += more
                if len(more) < ask:  # the queue has no more ready now
                    break
        except BaseException:  # a failure or a cancel (also between chunks): nothing kept
            self.give_back(queue, got)
            raise
        return got

    def queue(self, name: str) -> Queue:
        return self.store.queue(name)

    async def publish(
        self,
        queue: Queue,
        messages: list[OutgoingMessage],
        *,
        durability: Durability | None = None,
        timeout_s: float | None = None,
    ) -> list[str]:
        """Store `messages` (validated by the caller) and return their ids, all or none: the
        one way to publish. At capacity, wait up to `timeout_s` (None: forever) for room."""
        if queue.config.capacity is not None:
            return await self._publish_at_capacity(queue, messages, durability, timeout_s)
        # Not shielded, nor needing to be: a request that is cancelled (its client hung up)
        # cancels only this future; its messages stay in the line and are stored all the same.
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        self._publisher(queue).enqueue(
            _Publish(messages, durability, functools.partial(_resolve, future))
        )
        return await future

    def publish_nowait(
        self,
        queue: Queue,
        messages: list[OutgoingMessage],
        settle: Settle,
        durability: Durability | None = None,
    ) -> bool:
        """`publish` without a coroutine nor a future, into the same line: `settle` gets the
        ids (or the error) on the event loop. False, and nothing done, if the queue has a
        capacity (whose waits need `publish`)."""
        if queue.config.capacity is not None:
            return False
        self._publisher(queue).enqueue(_Publish(messages, durability, settle))
        return True

    def _publisher(self, queue: Queue) -> _Publisher:
        publisher = self._publishers.get(queue.name)
        if publisher is None or publisher.queue is not queue:
            publisher = self._publishers[queue.name] = _Publisher(self, queue)
        return publisher

    async def _publish_at_capacity(
        self,
        queue: Queue,
        messages: list[OutgoingMessage],
        durability: Durability | None,
        timeout_s: float | None,
    ) -> list[str]:
        """Capacity waits are per request (each has its own timeout), and happen here, on the
        event loop, not in a pool thread: a full queue must not starve every other request."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        changed = asyncio.Event()
        unsubscribe = await self.call(
            queue.subscribe, lambda: loop.call_soon_threadsafe(changed.set)
        )
        self.watch_store()
        try:
            while True:
                changed.clear()
                try:
                    ids = await self.call(
                        queue.put_many, messages, timeout_s=0.0, durability=durability
                    )
                    self.moved(PUBLISHED, queue.name, len(ids))
                    return ids
                except QueueFull:
                    remaining = None if deadline is None else deadline - loop.time()
                    if remaining is not None and remaining <= 0:
                        raise
                with contextlib.suppress(TimeoutError):  # not `wait_for`: see `_Stream.events`
                    async with asyncio.timeout(min(remaining or 1.0, 1.0)):
                        await changed.wait()
        finally:
            unsubscribe()

    async def receive(
        self,
        queue: Queue,
        max_count: int,
        visibility_s: float | None,
        wait_s: float | None,
        *,
        max_per_group: int | None = 1,
        consumer: str | None = None,
    ) -> list[Message]:
        """Lease up to `max_count` messages, waiting up to `wait_s` (None: forever) for the
        first; the leases name this worker, labelled `consumer` (the request's principal), as
        their holder. `max_per_group` as in `Queue.get`: with more than one message of a group per
        request (SQS FIFO: None, a whole run), each request leases with a get of its own, since
        merging the gets of concurrent requests and splitting the result could hand one group's
        run to two consumers; the wait is the same."""
        first: asyncio.Future[list[Message]]
        if max_per_group == 1:
            first = self._getter(queue).submit((max_count, visibility_s, consumer))
        else:
            first = asyncio.ensure_future(
                self.call(
                    queue.get,
                    max_count,
                    visibility_s=visibility_s,
                    max_per_group=max_per_group,
                    consumer=consumer,
                )
            )
        try:
            got = await asyncio.shield(first)
        except asyncio.CancelledError:
            # The client left while a pool thread was leasing for it: give those back.
            first.add_done_callback(lambda done: self._give_back_later(queue, done))
            raise
        if got or (wait_s is not None and wait_s <= 0) or self.closing:
            if got:
                self.moved(DELIVERED, queue.name, len(got))
            return got
        receiver = self._receivers.get(queue.name)
        if receiver is None or receiver.queue is not queue:
            receiver = self._receivers[queue.name] = _Receiver(self, queue)
        got = await receiver.wait(max_count, visibility_s, wait_s, max_per_group, consumer)
        if got:
            self.moved(DELIVERED, queue.name, len(got))
        return got

    def receive_nowait(
        self,
        queue: Queue,
        max_count: int,
        visibility_s: float | None,
        settle: Callable[[list[Message] | BaseException], None],
        consumer: str | None = None,
    ) -> None:
        """`receive` that does not wait (wait 0), without a coroutine: into the queue's lease
        line, `settle` getting the messages (maybe none) or the error on the event loop."""
        future = self._getter(queue).submit((max_count, visibility_s, consumer))
        future.add_done_callback(functools.partial(self._received_nowait, queue, settle))

    def _received_nowait(
        self,
        queue: Queue,
        settle: Callable[[list[Message] | BaseException], None],
        done: asyncio.Future[list[Message]],
    ) -> None:
        error = done.exception()
        if error is not None:
            settle(error)
            return
        got = done.result()
        if got:
            self.moved(DELIVERED, queue.name, len(got))
        settle(got)

    def _getter(self, queue: Queue) -> _Batcher:
        getter = self._getters.get(queue.name)
        if getter is None or getter.queue is not queue:
            getter = self._getters[queue.name] = _Batcher(self, queue, "get")
        return getter

    def watch_store(self) -> None:
        """Pump the store's shared inotify descriptor from the event loop, so each queue's own
        descriptor (which the receivers wait on) hears about changes without a thread."""
        fd = self.store.watch_fileno()
        if fd is not None and fd != self._hub_fd:
            asyncio.get_running_loop().add_reader(fd, self.store.pump_watches)
            self._hub_fd = fd

    async def ack(self, queue: Queue, receipt: str) -> None:
        """Acknowledge, sharing one store call with every ack of the queue that arrives while
        the previous batch is being applied (one thread, no lock contention)."""
        await asyncio.shield(self._acker(queue).submit(receipt))

    def ack_nowait(
        self, queue: Queue, receipt: str, settle: Callable[[BaseException | None], None]
    ) -> None:
        """`ack` without a coroutine, into the same line: `settle` gets None (acknowledged) or
        the error, on the event loop."""
        future = self._acker(queue).submit(receipt)
        future.add_done_callback(functools.partial(_report_ack, settle))

    def _acker(self, queue: Queue) -> _Batcher:
        acker = self._ackers.get(queue.name)
        if acker is None or acker.queue is not queue:
            acker = self._ackers[queue.name] = _Batcher(self, queue, "ack")
        return acker

    async def ack_many(self, queue: Queue, receipts: list[str]) -> dict[str, Exception]:
        """Acknowledge `receipts` (duplicates once) in one store call (`settle_call`); the
        failures by receipt (a `StorageError` among them too: see `Queue.ack_each`). Every
        receipt not in the result was acknowledged."""
        distinct = list(dict.fromkeys(receipts))
        if not distinct:
            return {}
        failures = await self.settle_chunks(queue, queue.ack_each, distinct)
        if len(failures) < len(distinct):
            self.moved(ACKED, queue.name, len(distinct) - len(failures))
        return failures

    async def extend_many(
        self, queue: Queue, receipts: list[str], visibility_s: float
    ) -> dict[str, Exception]:
        """Extend the leases behind `receipts` to end `visibility_s` from now, in one call
        and one store call; the failures by receipt, as `ack_many`."""
        distinct = list(dict.fromkeys(receipts))
        if not distinct:
            return {}
        return await self.settle_chunks(queue, queue.extend_each, distinct, visibility_s)

    async def nack(self, queue: Queue, receipt: str, delay_s: float = 0.0) -> str:
        """A consumer gives one message back (`Queue.nack`: what became of it), counted once
        it is."""
        outcome = await self.call(queue.nack, receipt, delay_s)
        self.moved(NACKED, queue.name, 1)
        return outcome

    async def nack_many(
        self,
        queue: Queue,
        receipts: list[str],
        delay_s: float = 0.0,
        dead_lettered: list[str] | None = None,
    ) -> dict[str, Exception]:
        """A consumer gives the messages behind `receipts` back (ready after `delay_s`), in one
        pool call; the failures by receipt, as `ack_many`; those dead-lettered instead (past the
        queue's max receives) appended to `dead_lettered`. Each given back is counted (what the
        server gives back itself, e.g. a closed stream's deliveries, is not: `give_back`)."""
        distinct = list(dict.fromkeys(receipts))
        if not distinct:
            return {}
        failures = await self.call(queue.nack_each, distinct, delay_s, dead_lettered=dead_lettered)
        if len(failures) < len(distinct):
            self.moved(NACKED, queue.name, len(distinct) - len(failures))
        return failures

    def _give_back_later(self, queue: Queue, done: asyncio.Future[list[Message]]) -> None:
        if done.cancelled() or done.exception() is not None or not done.result():
            return
        self.give_back(queue, done.result())

    def give_back(self, queue: Queue, messages: list[Message]) -> None:
        """Make leased messages nobody will take ready again, in one pool call, without waiting
        for it: whoever gave them up must not hold up the next delivery (on a slow shared
        filesystem, giving back takes as long as leasing). Once the broker is closing (its pool
        shut down) they go back here and now: else they would wait out their lease, unseen by
        consumers of the next server."""
        if not messages:
            return
        if not self.closing:
            try:
                self._executor.submit(_give_back, queue, messages)
                return
            except RuntimeError:  # the pool is shut down
                pass
        _give_back(queue, messages)

    def close(self) -> None:
        """Release every waiting receive (with nothing) and stop the thread pool."""
        self.closing = True
        if self._release_timer is not None:
            self._release_timer.cancel()
        if self._hub_fd is not None:
            asyncio.get_running_loop().remove_reader(self._hub_fd)
            self._hub_fd = None
        for receiver in self._receivers.values():
            receiver.release_all()
        self._executor.shutdown(wait=False, cancel_futures=False)


def _expire(future: asyncio.Future[list[Message]]) -> None:
    """A long poll's wait is over: it answers empty (unless messages got there first)."""
    if not future.done():
        future.set_result([])


def _report_ack(settle: Callable[[BaseException | None], None], done: asyncio.Future[Any]) -> None:
    settle(asyncio.CancelledError() if done.cancelled() else done.exception())


class _Batcher:
    """Requests of one kind (leases, acks) to one queue, applied in one store call per batch
    (`Broker.settle_call`): whatever arrives while a batch is being applied forms the next one.
    Concurrent requests then cost one pass over the queue's lock instead of a thread each,
    queued on it."""

    def __init__(self, broker: Broker, queue: Queue, kind: str) -> None:
        self.broker = broker
        self.queue = queue
        self.kind = kind
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None  # referenced, so it is not collected
        # Kept: `get_running_loop()` is a getpid(2) each time, and this is once a request.
        self._loop = asyncio.get_running_loop()

    def submit(self, item: Any) -> asyncio.Future[Any]:
        loop = self._loop
        future: asyncio.Future[Any] = loop.create_future()
        self._pending.append((item, future))
        if not self._running:
            self._running = True
            self._task = loop.create_task(self._run())
        return future

    async def _run(self) -> None:
        try:
            while self._pending:
                batch, self._pending = (
                    self._pending[:MAX_BATCH_MESSAGES],
                    self._pending[MAX_BATCH_MESSAGES:],
                )
                try:
                    if self.kind == "ack":
                        await self._acks(batch)
                    else:
                        await self._gets(batch)
                except Exception as exc:  # every request of the batch gets the failure
                    for _item, future in batch:
                        if not future.done():
                            future.set_exception(exc)
        finally:
            self._running = False

    async def _acks(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        receipts = [item for item, _ in batch]
        failures = await self.broker.settle_chunks(self.queue, self.queue.ack_each, receipts)
        if len(failures) < len(batch):
            self.broker.moved(ACKED, self.queue.name, len(batch) - len(failures))
        for receipt, future in batch:
            if future.done():
                continue
            if receipt in failures:
                future.set_exception(failures[receipt])
            else:
                future.set_result(None)

    async def _gets(self, batch: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        # One lease call per visibility timeout and holder asked for (almost always just one:
        # a holder is a principal, and the leases of one call name one).
        by_kind: dict[tuple[float | None, str | None], list[tuple[Any, asyncio.Future[Any]]]]
        by_kind = {}
        for entry in batch:
            by_kind.setdefault(entry[0][1:], []).append(entry)
        for (visibility_s, consumer), entries in by_kind.items():
            wanted = min(sum(item[0] for item, _ in entries), MAX_GET_BATCH)
            got = await self.broker.lease(self.queue, wanted, visibility_s, consumer)
            dry = len(got) < wanted  # the queue had no more ready: an empty share is the truth
            deferred: list[tuple[Any, asyncio.Future[Any]]] = []
            for item, future in entries:
                share, got = got[: item[0]], got[item[0] :]
                if future.done():
                    self.broker.give_back(self.queue, share)
                elif share or dry:
                    future.set_result(share)
                else:  # the batch's cap ran out before this request: the next batch serves it
                    deferred.append((item, future))
            self._pending[:0] = deferred  # first in the next batch
            # What a caller that gave up while we were leasing would have had.
            self.broker.give_back(self.queue, got)


def _give_back(queue: Queue, messages: list[Message]) -> None:
    with contextlib.suppress(DirmqError):  # gone, or expired and leased again: not ours now
        queue.nack_each(message.receipt or "" for message in messages)


class _Publisher:
    """The pending line of one queue's publishes, drained by one pool thread at a time."""

    def __init__(self, broker: Broker, queue: Queue) -> None:
        self.broker = broker
        self.queue = queue
        self._loop = asyncio.get_running_loop()
        self._pending: deque[_Publish] = deque()
        self._lock = threading.Lock()  # the line and `_draining` change together
        self._draining = False  # a drain is under way or scheduled and will see what is appended
        self._inline = on_memory_filesystem(queue.path)  # drained on the event loop

    def enqueue(self, publish: _Publish) -> None:
        """Append to the line; start draining it unless a drain is already under way."""
        with self._lock:
            self._pending.append(publish)
            if self._draining:
                return
            self._draining = True
        if self._inline:
            self._loop.call_soon(self._drain_here)  # after this iteration's other requests
            return
        try:
            self.broker._executor.submit(self._drain)
        except RuntimeError:  # the pool is shut down: nothing will drain the line
            # Not now: a caller (a fast publish) must be told its request is taken before it
            # can be answered.
            self._loop.call_soon(self._abandon)

    def _drain(self) -> None:
        """In a pool thread: store batch after batch until the line is empty."""
        for _turn in range(BATCHES_PER_TURN):
            batch = self._next_batch()
            if batch is None:
                return
            outcome: list[str] | BaseException
            try:
                outcome = self._store(batch)
            except BaseException as exc:  # not Exception: still the batch's, not the thread's
                outcome = exc
            try:
                self._loop.call_soon_threadsafe(self._settle, batch, outcome)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass
        try:
            self.broker._executor.submit(self._drain)  # still `_draining`: the line stays ours
        except RuntimeError:  # shut down meanwhile: the rest is never stored, nor acknowledged
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._abandon)

    def _next_batch(self) -> list[_Publish] | None:
        """The next batch from the line; None (and the line no longer drained) when empty."""
        with self._lock:
            if not self._pending:
                self._draining = False
                return None
            return self._take_batch()

    def _store(self, batch: list[_Publish]) -> list[str] | BaseException:
        """One group commit for every message of the batch's requests: their ids, or the
        failure every request of the batch gets."""
        messages = [m for p in batch for m in p.messages]
        try:
            return self.queue.put_many(messages, durability=batch[0].durability)
        except Exception as exc:
            return exc

    def _abandon(self) -> None:
        """On the event loop: fail what waits in the line (503: nothing of it was stored)."""
        with self._lock:
            pending, self._pending = list(self._pending), deque()
            self._draining = False
        for p in pending:
            p.finish(StorageError("the server is shutting down; retry"))

    def _drain_here(self) -> None:
        """On the event loop (a memory filesystem never waits): one batch, then the next in the
        next loop iteration. Answering a request can start the next one its connection
        pipelined, which joins the line at once; draining those too would keep every other
        connection and timer waiting."""
        batch = self._next_batch()
        if batch is not None:
            self._settle(batch, self._store(batch))
            self._loop.call_soon(self._drain_here)  # still `_draining`: stops when it is empty

    def _settle(self, batch: list[_Publish], outcome: list[str] | BaseException) -> None:
        if isinstance(outcome, BaseException):
            for p in batch:
                p.finish(outcome)
            return
        self.broker.moved(PUBLISHED, self.queue.name, len(outcome))  # before any answer
        start = 0
        for p in batch:
            end = start + len(p.messages)
            p.finish(outcome[start:end])
            start = end

    def _take_batch(self) -> list[_Publish]:
        """Pending requests with the first one's durability, up to MAX_BATCH_MESSAGES (at least
        one request), in order; the others stay in the line."""
        pending = self._pending
        durability = pending[0].durability
        batch: list[_Publish] = []
        rest: list[_Publish] = []
        size = 0
        while pending:
            p = pending.popleft()
            if p.durability == durability and (
                not batch or size + len(p.messages) <= MAX_BATCH_MESSAGES
            ):
                batch.append(p)
                size += len(p.messages)
            else:
                rest.append(p)
        pending.extend(rest)
        return batch


def on_memory_filesystem(path: str) -> bool:
    """Whether `path` is on tmpfs or ramfs (its device's entry in /proc/self/mountinfo)."""
    try:
        device = os.stat(path).st_dev
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            for line in mounts:
                fields = line.split()  # id parent major:minor root point options... - type ...
                major, _, minor = fields[2].partition(":")
                if os.makedev(int(major), int(minor)) == device:
                    return fields[fields.index("-") + 1] in MEMORY_FILESYSTEMS
    except (OSError, ValueError, IndexError):
        pass
    return False


class _Receiver:
    def __init__(self, broker: Broker, queue: Queue) -> None:
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
