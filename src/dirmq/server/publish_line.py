"""The publish line of one queue: every request's messages join it, and while one `put_many`
is flushing the next batch gathers, so N concurrent publishers share each flush (one syncfs +
one directory fsync per batch) instead of queueing N flushes. One pool thread drains a queue's
line batch after batch for as long as it is not empty, and wakes the event loop once per batch:
no executor round trip nor task per batch, no task per request. On a memory filesystem (tmpfs,
ramfs), where no store call waits for a device, the event loop drains the line itself, once per
loop iteration: handing each batch to a thread cost more (GIL hand-offs, futex wake-ups) than
writing it.

On a disk the line adapts to its load: a publish that finds it quiet (no drain under way, a
store quicker than INLINE_BELOW_S as measured on the loop, and the previous publish to any queue
of this process longer ago than twice a store: store_load.py) is stored on the event loop at
once, which waits out its fsyncs: no hop to a pool thread and back (about a third of a lone
publish's CPU, issue 37; besides, while a pool thread commits, it and the loop trade the GIL at
nearly every system call either makes). Under
load a pool thread stores all the time, and every publish goes to the pool, where the next batch
gathers while one flushes. So stores hold the loop at most about half of its time: always
storing there made long polls fall behind at 1,000 msg/s with 1.75 ms stores (their p50 went
from 7 ms to 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dirmq.errors import StorageError
from dirmq.server.broker_host import MAX_BATCH_MESSAGES, BrokerHost
from dirmq.server.queuecounts import PUBLISHED
from dirmq.server.store_load import StoreTimes
from dirmq.store import Durability, OutgoingMessage, Queue

log = logging.getLogger("dirmq.server")
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})
BATCHES_PER_TURN = 16  # then a drain goes to the back of the pool's line: other calls get a turn
# The longest store (fsyncs included) the event loop waits out for a quiet line: about one fsync
# on a local disk; a slower disk, or a shared filesystem, always stores in the pool.
INLINE_BELOW_S = 0.002


class _LastPublish:
    """When a publish last joined any line of this process (one event loop a process): the
    quiet test is the loop's, not one queue's, or many quiet queues would hold it together."""

    at = 0.0


# Called on the event loop with a publish's ids, or with the error that failed it.
Settle = Callable[[list[str] | BaseException], None]


@dataclass(slots=True)
class Publish:
    messages: list[OutgoingMessage]
    durability: Durability | None
    settle: Settle  # no hop through the event loop between storing and answering

    def finish(self, outcome: list[str] | BaseException) -> None:
        try:
            self.settle(outcome)
        except Exception:  # one request's bug must not keep the rest of the batch waiting
            log.exception("settling a publish failed")


def resolve(future: asyncio.Future[list[str]], outcome: list[str] | BaseException) -> None:
    if future.done():  # its request was cancelled: the messages are stored all the same
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class PublishLine:
    """The pending line of one queue's publishes, drained by one pool thread at a time."""

    def __init__(self, broker: BrokerHost, queue: Queue) -> None:
        self.broker = broker
        self.queue = queue
        self._loop = asyncio.get_running_loop()
        self._pending: deque[Publish] = deque()
        self._lock = threading.Lock()  # the line and `_draining` change together
        self._draining = False  # a drain is under way or scheduled and will see what is appended
        self._inline = on_memory_filesystem(queue.path)  # drained on the event loop
        # A quiet line on a disk stores on the event loop (see the module's docstring): its
        # stores' times (store_load.py).
        self._times = StoreTimes()

    def enqueue(self, publish: Publish) -> None:
        """Append to the line; start draining it unless a drain is already under way."""
        now = time.monotonic()
        gap, _LastPublish.at = now - _LastPublish.at, now
        with self._lock:
            self._pending.append(publish)
            if self._draining:
                return
            self._draining = True
        if self._inline:
            self._loop.call_soon(self._drain_here)  # after this iteration's other requests
            return
        if self._times.on_loop(gap, INLINE_BELOW_S):
            self._loop.call_soon(self._drain_once_here)  # after this iteration's other requests
            return
        self._submit_drain()

    def _submit_drain(self) -> None:
        try:
            self.broker.submit(self._drain)
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
                outcome = self._timed_store(batch, here=False)
            except BaseException as exc:  # not Exception: still the batch's, not the thread's
                outcome = exc
            try:
                self._loop.call_soon_threadsafe(self._settle, batch, outcome)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass
        try:
            self.broker.submit(self._drain)  # still `_draining`: the line stays ours
        except RuntimeError:  # shut down meanwhile: the rest is never stored, nor acknowledged
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._abandon)

    def _next_batch(self) -> list[Publish] | None:
        """The next batch from the line; None (and the line no longer drained) when empty."""
        with self._lock:
            if not self._pending:
                self._draining = False
                return None
            return self._take_batch()

    def _store(self, batch: list[Publish]) -> list[str] | BaseException:
        """One group commit for every message of the batch's requests: their ids, or the
        failure every request of the batch gets."""
        messages = [m for p in batch for m in p.messages]
        try:
            return self.queue.put_many(messages, durability=batch[0].durability)
        except Exception as exc:
            return exc

    def _timed_store(self, batch: list[Publish], here: bool) -> list[str] | BaseException:
        """`_store`, its time (`here`: on the event loop) joining what decides where a quiet
        line stores."""
        began = time.monotonic()
        outcome = self._store(batch)
        self._times.timed(time.monotonic() - began, here)
        return outcome

    def _drain_once_here(self) -> None:
        """On the event loop, for a quiet line on a disk: one batch, stored and answered here;
        what arrived meanwhile goes to the pool (the load is up)."""
        batch = self._next_batch()
        if batch is None:
            return
        self._settle(batch, self._timed_store(batch, here=True))
        with self._lock:
            if not self._pending:
                self._draining = False
                return
        self._submit_drain()  # still `_draining`: the line stays ours

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

    def _settle(self, batch: list[Publish], outcome: list[str] | BaseException) -> None:
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

    def _take_batch(self) -> list[Publish]:
        """Pending requests with the first one's durability, up to MAX_BATCH_MESSAGES (at least
        one request), in order; the others stay in the line."""
        pending = self._pending
        durability = pending[0].durability
        batch: list[Publish] = []
        rest: list[Publish] = []
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
