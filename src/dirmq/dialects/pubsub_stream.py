"""The event stream of one subscription attached over HTTP (`GET /@pubsub/subscribe`,
dialects/pubsub.py): what feeds it, and what ends it.

A stream is one `Subscription` of this process, fed from the event loop: its eventfd (set when
the store's shared inotify descriptor, pumped by the loop, reports a change) or a timer (the
next delivery deadline, the keep-alive, a periodic re-check) wakes it; each step runs on the
broker's thread pool. At most `window` deliveries are outstanding; settling one frees its slot.
Closing the body (the client left, the stream ended, the server stops) closes the
subscription: what it held goes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator, Callable

from dirmq.errors import DeliveryNotFound, InvalidArgument
from dirmq.pubsub import Delivery, Outcome, Subscription
from dirmq.server.broker import Broker
from dirmq.server.metrics import Metrics
from dirmq.wire import pubsub as pubsub_wire

log = logging.getLogger("dirmq.server")

KEEPALIVE_S = 15.0
RECHECK_S = 5.0  # a stream looks again even without a wake-up (belt and braces)
SETTLED = {"done": "done", "dismiss": "dismissed", "abort": "aborted"}


class EventStream:
    """One attached subscription feeding one event stream; `forget` is called once it is
    closed (the owner's table of attached streams)."""

    def __init__(
        self,
        broker: Broker,
        metrics: Metrics,
        sub: Subscription,
        window: int,
        owner: str,
        forget: Callable[[EventStream], None],
    ) -> None:
        self.broker = broker
        self.metrics = metrics
        self._forget = forget
        self.sub = sub
        self.window = window
        self.owner = owner  # the principal that attached it (may settle what it receives)
        # Deadlines of what we sent, only to time the next wake-up: the subscription itself
        # decides what is held and what expired (`held`, `expire`).
        self.deadlines: dict[str, int] = {}
        self.wake = asyncio.Event()
        self.stopped = False
        self.closed = False

    def stop(self) -> None:
        self.stopped = True
        self.wake.set()

    def _readable(self, fd: int) -> None:
        # Reset the eventfd here (level-triggered readers would spin otherwise); the events
        # themselves wait in the watcher for the next `receive`.
        with contextlib.suppress(BlockingIOError, OSError):
            os.eventfd_read(fd)
        self.wake.set()

    def _step(self) -> tuple[list[Delivery], dict[str, Outcome], float]:
        """In a pool thread: return what passed its deadline, then take up to the window;
        and in how many seconds something given back is due again (a backoff ends)."""
        expired = self.sub.expire()
        taken: list[Delivery] = []
        while len(self.sub.held()) < self.window:
            delivery = self.sub.receive(0)
            if delivery is None:
                break
            taken.append(delivery)
        return taken, expired, self.sub.wake_in_s()

    async def events(self) -> AsyncGenerator[bytes, None]:
        loop = asyncio.get_running_loop()
        broker = self.broker
        metrics = self.metrics
        yield pubsub_wire.attached_event(pubsub_wire.Attached(self.sub.name, self.sub.cursor))
        fd = self.sub.fileno()
        if fd is not None:
            loop.add_reader(fd, self._readable, fd)
            broker.watch_store()  # the loop pumps the shared inotify descriptor into our eventfd
        recheck = RECHECK_S if fd is not None else broker.store.poll_interval_s
        last_sent = loop.time()
        try:
            while not self.stopped:
                self.wake.clear()
                taken, expired, wake_in_s = await broker.call(self._step)
                for key, outcome in expired.items():
                    self.deadlines.pop(key, None)
                    # `dismissed` here: given up on after the delivery limit.
                    metrics.pubsub_settled.labels(outcome.value).inc()
                if taken:
                    frames = []
                    for delivery in taken:
                        self.deadlines[delivery.key] = delivery.deadline_ms
                        frames.append(pubsub_wire.message_event(delivery))
                    metrics.pubsub_delivered.inc(len(taken))
                    last_sent = loop.time()
                    yield b"".join(frames)
                    continue
                timeout = min(recheck, wake_in_s, max(0.0, last_sent + KEEPALIVE_S - loop.time()))
                if self.deadlines:
                    soonest = (min(self.deadlines.values()) - time.time() * 1000) / 1000
                    timeout = min(timeout, max(0.0, soonest) + 0.002)
                # `asyncio.timeout`, not `wait_for`: Python 3.11's `wait_for` swallows a
                # cancellation that lands as the wait ends (a client leaving right after a
                # settle that woke us), and the closed stream then lived on to the keep-alive.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self.wake.wait()
                if loop.time() - last_sent >= KEEPALIVE_S:
                    last_sent = loop.time()
                    yield pubsub_wire.KEEPALIVE
        finally:
            if fd is not None:
                with contextlib.suppress(ValueError, OSError):
                    loop.remove_reader(fd)

    async def settle(self, key: str, action: str, extend_s: float | None) -> int | None:
        """Settle the delivery `key` (`action`: done, dismiss, abort, heartbeat); the new
        deadline (ms) of a heartbeat, None otherwise."""
        sub = self.sub
        try:
            if action == "heartbeat":
                deadline = await self.broker.call(sub.heartbeat, key, extend_s)
                if key in self.deadlines:
                    self.deadlines[key] = deadline
                return deadline
            result: Outcome | None = None
            try:
                if action == "abort":
                    result = await self.broker.call(sub.abort, key)
                else:
                    await self.broker.call(sub.done if action == "done" else sub.dismiss, key)
            finally:
                # Settled, or no longer held (expired): either way its slot may be free.
                self.deadlines.pop(key, None)
                self.wake.set()
        except InvalidArgument:
            if self.closed:  # the stream ended meanwhile: everything it held went back
                raise DeliveryNotFound(f"delivery {key} is no longer held") from None
            raise
        # An abort after the last delivery allowed dismisses (`result` says which).
        outcome = result.value if result is not None else SETTLED[action]
        self.metrics.pubsub_settled.labels(outcome).inc()
        return None

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            # Held deliveries go back; an anonymous subscription is removed (the library's
            # `close` does both).
            await self.broker.call(self.sub.close)
        except Exception:
            log.exception("closing subscription %s", self.sub.name)
        finally:
            self._forget(self)  # last: a shutdown waits for this before stopping the pool


class StreamBody:
    """The stream's body: closing it (the client left, the stream ended, the server stops)
    closes the subscription, even if the stream never started."""

    def __init__(self, stream: EventStream) -> None:
        self._stream = stream
        self._events = stream.events()

    def __aiter__(self) -> StreamBody:
        return self

    async def __anext__(self) -> bytes:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        try:
            await self._events.aclose()
        finally:
            # Shielded: the connection's task is usually being cancelled right now.
            await asyncio.shield(self._stream.close())
