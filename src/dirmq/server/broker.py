"""The store, for asyncio: the one facade every door moves messages through (publish, receive,
ack, extend, nack, give back; each fast path's no-wait form too), a thread pool for the store's
blocking calls (fsync, rename), and one engine of each kind per queue behind it:

- the publish line (publish_line.py): group commit across concurrent requests;
- the get and ack batchers (batcher.py): requests that arrive together share one store call;
- the long-poll waiters (longpolls.py): a waiting receive is a future, not a thread.

The engines see the broker only as a `BrokerHost` (broker_host.py), so none imports this module.

Why it is long: the facade's calls, each counting what it moved and giving back what nobody
takes, and the event-loop hand-offs the facade and its engines share (`settle_call`,
`settle_chunks`, `lease`), whose rules (when on the loop, when on the pool) are one decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from dirmq.errors import DirmqError, QueueFull
from dirmq.server.batcher import Batcher
from dirmq.server.broker_host import BODY_FILE_BYTES, INLINE_MAX_MESSAGES
from dirmq.server.coldlane import ColdLane
from dirmq.server.direct import DirectPath
from dirmq.server.longpolls import LongPolls
from dirmq.server.publish_line import Publish, PublishLine, Settle, resolve
from dirmq.server.queuecounts import ACKED, DELIVERED, KINDS, NACKED, PUBLISHED, QueueCounts
from dirmq.server.registrations import Registrations
from dirmq.server.waiter import SideDelivery
from dirmq.store import Durability, Message, OutgoingMessage, Queue, Store
from dirmq.store.bodyfiles import call_by_file
from dirmq.store.census import Census

T = TypeVar("T")
log = logging.getLogger("dirmq.server")
# A lease or settle call run on the event loop that took longer than this sends such calls to
# the thread pool for a while (see `Broker.settle_call`). Not lower: on a busy disk a batch
# now and then takes 20-50 ms (and waits for the GIL), and at 20 ms a drain spent most of its
# time on the pool for nothing (6.5k GET + DELETE a second at 100 ms, 5.5k at 20 ms).
INLINE_STALL_S = 0.1
POOL_AFTER_STALL_S = 10.0
# Every RELEASE_EVERY_S, queues nobody waits on nor used for IDLE_RELEASE_S give back their
# inotify watches and index (`Store.release_idle`: 10,000 queues touched must not keep 40,000
# watches, the user's limit often 8,192), and dead publishers' journals go (`sweep_journals`).
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


class Broker:
    """One per worker process and root."""

    def __init__(
        self,
        store: Store,
        threads: int = 32,
        counts: MessageCounts | None = None,
        queue_counts: QueueCounts | None = None,
        census: Census | None = None,
    ) -> None:
        self.store = store
        # Every queue's depth by its names, one per worker for the console, its sampler and the
        # metrics: kept listings are shared, so a settled deep @ready is listed once, not by each.
        self.census = census or Census(store.root, store.context.shared)
        self.counts: MessageCounts = counts or _Uncounted()
        # By queue (the console's rates); the Store's events count there too (`serve.py`).
        self.queue_counts = queue_counts or QueueCounts()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="dirmq-store")
        self._cold = ColdLane(self._executor.submit)  # first uses of queues: see `settle_call`
        self._registrations = Registrations()  # long polls' on queues without an index here
        self._release_timer: asyncio.TimerHandle | None = None
        self._publishers: dict[str, PublishLine] = {}
        self._receivers: dict[str, LongPolls] = {}
        self._getters: dict[str, Batcher] = {}
        self._ackers: dict[str, Batcher] = {}
        self._hub_fd: int | None = None
        self.closing = False
        self._inline = not store.context.shared  # see `settle_call`
        self._on_pool_until = 0.0  # time.monotonic(): settle calls on the pool until then
        self._direct: DirectPath | None = None  # made on the event loop (`_direct_path`)

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
            self._executor.submit(self.store.sweep_journals)  # a dead publisher's journals
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

    def submit(self, fn: Callable[..., Any], *args: object) -> Future[Any]:
        """Run `fn(*args)` on the pool, not waiting for it (RuntimeError once it is shut down)."""
        return self._executor.submit(fn, *args)

    async def call(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """Run a blocking store call on the thread pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    def on_local_disk(self) -> bool:
        """Whether the root is on a local filesystem (store calls may run on the event loop)."""
        return self._inline

    def looks_here(self) -> bool:
        """Whether a few store system calls may run on the event loop now: a local
        filesystem, and no stall lately (`call_here`)."""
        return self._inline and self._on_pool_until <= time.monotonic()

    def runs_here(self, queue: Queue, messages: int) -> bool:
        """Whether a lease or settle call of `queue` on `messages` messages runs on the event
        loop now (`settle_call`): a local filesystem, at most `INLINE_MAX_MESSAGES`, an index
        this process holds, and no stall lately."""
        return (
            messages <= INLINE_MAX_MESSAGES
            and self._inline
            and queue.indexed()
            and self._on_pool_until <= time.monotonic()
        )

    def call_here(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn(*args, **kwargs)` on the event loop, now (`runs_here` said so): one slower than
        `INLINE_STALL_S` sends such calls to the pool for `POOL_AFTER_STALL_S`."""
        began = time.monotonic()
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

    def first_use(
        self, call: Callable[[], Any], done: Callable[[Any, BaseException | None], None]
    ) -> None:
        """`call()` on the cold lane (coldlane.py), `done(result, error)` on the event loop."""
        self._cold.submit(call, done)

    def register_later(self, step: Callable[[], None]) -> None:
        """`step()` a few loop turns later, behind the requests (registrations.py)."""
        self._registrations.add(step)

    def registering(self) -> int:
        """Long polls' registrations not yet run (registrations.py)."""
        return len(self._registrations)

    def _hurry(self, queue: Queue) -> None:
        """A publish to `queue`: its waiter line's registration, if pending, runs now."""
        line = self._receivers.get(queue.name)
        if line is not None and line.queue is queue:
            line.hurry()

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
        round trip a rename) and for more than `INLINE_MAX_MESSAGES`, the pool; while this
        process has no index of the queue (its first use lists the queue's directories: on a
        deep backlog, seconds), the pool's cold lane, so that a burst of first uses does not
        hold up the calls of queues in use."""
        if not queue.indexed():
            return await self._cold.run(fn, *args, **kwargs)
        if not self.runs_here(queue, messages):
            return await self.call(fn, *args, **kwargs)
        return self.call_here(fn, *args, **kwargs)

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
        self,
        queue: Queue,
        wanted: int,
        visibility_s: float | None,
        consumer: str | None = None,
        by_file: bool = False,
    ) -> list[Message]:
        """Up to `wanted` messages of `queue` (`Queue.get`, one message per group), leased
        through `settle_call` at most `INLINE_MAX_MESSAGES` a call, as `settle_chunks`. If a
        later call fails, what the earlier ones leased goes back before the error is raised.
        `consumer`: the holder's label the leases carry (a request's principal); `by_file`:
        bodies of `BODY_FILE_BYTES` or more left in their files (`FileBody`)."""
        get = functools.partial(call_by_file, BODY_FILE_BYTES, queue.get) if by_file else queue.get
        step = INLINE_MAX_MESSAGES if self._inline else wanted
        got: list[Message] = []
        try:
            while len(got) < wanted:
                if got:
                    await asyncio.sleep(0)
                ask = min(step, wanted - len(got))
                more: list[Message] = await self.settle_call(
                    queue, ask, get, ask, visibility_s=visibility_s, consumer=consumer
                )
                got += more
                if len(more) < ask:  # the queue has no more ready now
                    break
        except BaseException:  # a failure or a cancel (also between chunks): nothing kept
            self.give_back(queue, got)
            raise
        return got

    def queue(self, name: str) -> Queue:
        # Lazily: a long poll on a queue new to the worker reads its configuration when it is
        # registered (registrations.py), behind the requests, not while they wait.
        return self.store.queue(name, lazy=True)

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
        self._hurry(queue)
        if queue.config.capacity is not None:
            return await self._publish_at_capacity(queue, messages, durability, timeout_s)
        # Not shielded, nor needing to be: a request that is cancelled (its client hung up)
        # cancels only this future; its messages stay in the line and are stored all the same.
        future: asyncio.Future[list[str]] = asyncio.get_running_loop().create_future()
        settle = functools.partial(resolve, future)
        if not self._direct_path().offer(queue, messages, durability, settle):
            self._publisher(queue).enqueue(Publish(messages, durability, settle))
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
        self._hurry(queue)
        if not self._direct_path().offer(queue, messages, durability, settle):
            self._publisher(queue).enqueue(Publish(messages, durability, settle))
        return True

    def _direct_path(self) -> DirectPath:
        """A publish straight into a waiting consumer's lease, when it may (direct.py)."""
        if self._direct is None:
            self._direct = DirectPath(self, self._receivers)
        return self._direct

    def _publisher(self, queue: Queue) -> PublishLine:
        publisher = self._publishers.get(queue.name)
        if publisher is None or publisher.queue is not queue:
            publisher = self._publishers[queue.name] = PublishLine(self, queue)
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
                with contextlib.suppress(TimeoutError):  # not `wait_for`: see `EventStream.events`
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
        by_file: bool = False,
        side: SideDelivery | None = None,
    ) -> list[Message]:
        """Lease up to `max_count` messages, waiting up to `wait_s` (None: forever) for the
        first; the leases name this worker, labelled `consumer` (the request's principal), as
        their holder. `max_per_group` as in `Queue.get`: with more than one message of a group per
        request (SQS FIFO: None, a whole run), each request leases with a get of its own, since
        merging the gets of concurrent requests and splitting the result could hand one group's
        run to two consumers; the wait is the same. `by_file`: a large body may come as a
        `FileBody` (`lease`), which the caller sends and closes (not from a long poll's
        wait: those bodies are read). `side`: while it waits, the direct path may lease
        publishes for it one at a time besides its answer (waiter.py's `SideDelivery`)."""
        wait = functools.partial(
            self._wait, queue, max_count, visibility_s, wait_s, max_per_group, consumer, side
        )
        if (wait_s is None or wait_s > 0) and not queue.indexed() and not self.closing:
            # A queue this worker has no index of (the thousands a restart's consumers poll
            # at once): the waiter line's first look is its get, made in one call on the cold
            # lane with the line's subscription, rather than a get of its own and then that.
            return await wait()
        first: asyncio.Future[list[Message]]
        if max_per_group == 1:
            first = self._getter(queue).submit((max_count, visibility_s, consumer, by_file))
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
        return await wait()

    async def _wait(
        self,
        queue: Queue,
        max_count: int,
        visibility_s: float | None,
        wait_s: float | None,
        max_per_group: int | None,
        consumer: str | None,
        side: SideDelivery | None,
    ) -> list[Message]:
        """`receive`'s wait in the queue's waiter line (longpolls.py)."""
        receiver = self.waiter_line(queue)
        got = await receiver.wait(max_count, visibility_s, wait_s, max_per_group, consumer, side)
        if got:
            self.moved(DELIVERED, queue.name, len(got))
        return got

    def waiter_line(self, queue: Queue) -> LongPolls:
        """The queue's waiter line (longpolls.py), made on first use."""
        receiver = self._receivers.get(queue.name)
        if receiver is None or receiver.queue is not queue:
            receiver = LongPolls(self, queue, self._forget_receiver)
            self._receivers[queue.name] = receiver
        return receiver

    def waiting_polls(self) -> dict[str, int]:
        """The waiter line of each queue this worker keeps, and how many polls wait in it: a
        line is forgotten once its last poll has left (never a 0 here for long)."""
        return {
            name: line.waiting()
            for name, line in self._receivers.items()
            if not line.lingering()  # no waiter, kept armed a moment (longpolls.LINGER_S)
        }

    def _forget_receiver(self, receiver: LongPolls) -> None:
        """`receiver`'s last waiter left: a queue polled once is not kept for good."""
        if self._receivers.get(receiver.queue.name) is receiver:
            del self._receivers[receiver.queue.name]

    def receive_nowait(
        self,
        queue: Queue,
        max_count: int,
        visibility_s: float | None,
        settle: Callable[[list[Message] | BaseException], None],
        consumer: str | None = None,
        by_file: bool = False,
    ) -> None:
        """`receive` that does not wait (wait 0), without a coroutine: into the queue's lease
        line (at once, if it is quiet: `Batcher.get_soon`), `settle` getting the messages
        (maybe none) or the error on the event loop."""
        self._getter(queue).get_soon((max_count, visibility_s, consumer, by_file), settle)

    def _getter(self, queue: Queue) -> Batcher:
        getter = self._getters.get(queue.name)
        if getter is None or getter.queue is not queue:
            getter = self._getters[queue.name] = Batcher(self, queue, "get")
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
        """`ack` without a coroutine, into the same line (at once, if it is quiet:
        `Batcher.ack_soon`): `settle` gets None (acknowledged) or the error, on the event
        loop."""
        self._acker(queue).ack_soon(receipt, settle)

    def _acker(self, queue: Queue) -> Batcher:
        acker = self._ackers.get(queue.name)
        if acker is None or acker.queue is not queue:
            acker = self._ackers[queue.name] = Batcher(self, queue, "ack")
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
        for receiver in list(self._receivers.values()):  # each forgets itself
            receiver.release_all()
        self._executor.shutdown(wait=False, cancel_futures=False)


def _give_back(queue: Queue, messages: list[Message]) -> None:
    with contextlib.suppress(DirmqError):  # gone, or expired and leased again: not ours now
        queue.nack_each(message.receipt or "" for message in messages)
