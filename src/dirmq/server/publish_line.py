"""A queue's line of publishes in one server process: requests wait in it, their messages are
stored together, and each request is answered with its ids.

Theory of operation. On a memory filesystem nothing waits for a device, so the event loop
itself stores the whole line with `put_many`, batch after batch, once per loop iteration.

On a disk, two pool threads work the line as a pipeline. The writer takes the waiting requests
and writes their messages to files nobody sees yet (`Queue.prepare`); the flusher takes every
group written so far and makes it durable and visible with one group commit
(`Queue.publish_prepared`). While the flusher waits for the disk, the requests answered by its
previous commit come back and the writer writes them, so the next commit finds them ready.
With one thread doing both, those requests waited for the whole flush before their files were
even written: `bench/durable_trace.py` found a worker's single drain thread busy 98% of the
time, writing for a third of it, with batches of half the connections.

Requests are stored in the order they joined the line (their ids are given at writing); a
group commit holds requests of one durability level, at most `MAX_BATCH_MESSAGES` messages. A
batch with a dedup id, or to a queue that has gained a capacity, is stored by the writer with
`put_many` in one go. Every request is answered exactly once, on the event loop: with its ids,
or with the error its batch met; nothing of a failed batch is visible.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

from dirmq.errors import InvalidArgument, StorageError
from dirmq.store import Durability, OutgoingMessage, Queue
from dirmq.store.queue import PreparedPut

log = logging.getLogger("dirmq.server")

MAX_BATCH_MESSAGES = 1024
# Written but not yet flushed, at most (then the writer waits for the flusher): each holds an
# open file until its commit, so a stalled disk must not let them pile up.
MAX_WRITTEN_MESSAGES = 2 * MAX_BATCH_MESSAGES
BATCHES_PER_TURN = 16  # then a stage goes to the back of the pool's line: other calls get a turn
SHUTTING_DOWN = "the server is shutting down; retry"

# Called on the event loop with a publish's ids, or with the error that failed it.
Settle = Callable[[list[str] | BaseException], None]
Outcome = list[str] | BaseException


@dataclass(slots=True)
class Publish:
    """One request's messages, and how to answer it."""

    messages: list[OutgoingMessage]
    durability: Durability | None
    # Exactly one of the two: a future (`Broker.publish`), or a callback (`publish_nowait`:
    # no hop through the event loop between storing and answering).
    future: asyncio.Future[list[str]] | None
    settle: Settle | None = None

    def finish(self, outcome: Outcome) -> None:
        if self.settle is not None:
            try:
                self.settle(outcome)
            except Exception:  # one request's bug must not keep the rest of the batch waiting
                log.exception("settling a publish failed")
        elif self.future is not None and not self.future.done():
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)


def settle_batch(batch: list[Publish], outcome: Outcome) -> None:
    """Answer each request of a batch with its share of the batch's ids (or the error)."""
    if isinstance(outcome, BaseException):
        for p in batch:
            p.finish(outcome)
        return
    start = 0
    for p in batch:
        end = start + len(p.messages)
        p.finish(outcome[start:end])
        start = end


class PublishLine:
    """The line of one queue's publishes (see the module docstring)."""

    def __init__(
        self, queue: Queue, executor: Executor, loop: asyncio.AbstractEventLoop, inline: bool
    ) -> None:
        self.queue = queue
        self._executor = executor
        self._loop = loop
        self._inline = inline  # a memory filesystem: stored on the event loop
        self._lock = threading.Lock()  # the lines and the stage flags change together
        self._pending: deque[Publish] = deque()
        self._written: deque[tuple[list[Publish], PreparedPut]] = deque()
        self._written_messages = 0
        self._writing = False  # the writer (or the inline drain) is under way or scheduled
        self._writer_parked = False  # the writer waits for the flusher (MAX_WRITTEN_MESSAGES)
        self._flushing = False  # the flusher is under way or scheduled

    def submit(
        self, messages: list[OutgoingMessage], durability: Durability | None
    ) -> asyncio.Future[list[str]]:
        future: asyncio.Future[list[str]] = self._loop.create_future()
        self.enqueue(Publish(messages, durability, future))
        return future

    def enqueue(self, publish: Publish) -> None:
        """Append to the line; start the writer unless it is already under way."""
        with self._lock:
            self._pending.append(publish)
            if self._writing:
                return
            self._writing = True
        if self._inline:
            self._loop.call_soon(self._drain_here)  # after this iteration's other requests
        elif not self._schedule(self._write):
            # Not now: a caller (a fast publish) must be told its request is taken before it
            # can be answered.
            self._loop.call_soon(self._abandon)

    # -- a memory filesystem: the event loop stores the line -------------------------------------
    def _drain_here(self) -> None:
        """One batch, then the next in the next loop iteration: answering a request can start
        the next one its connection pipelined, which joins the line at once; draining those too
        would keep every other connection and timer waiting."""
        batch = self._next_batch()
        if batch is not None:
            settle_batch(batch, self._put(batch))
            self._loop.call_soon(self._drain_here)  # still `_writing`: stops when it is empty

    # -- a disk: the writer and the flusher -----------------------------------------------------
    def _write(self) -> None:
        """In a pool thread: write batch after batch until the line is empty."""
        for _turn in range(BATCHES_PER_TURN):
            with self._lock:
                if self._written_messages >= MAX_WRITTEN_MESSAGES:
                    self._writer_parked = True  # still `_writing`: the flusher restarts it
                    return
            batch = self._next_batch()
            if batch is None:
                return
            prepared = self._prepare(batch)
            if not isinstance(prepared, PreparedPut):  # failed, or stored whole: answer now
                self._answer(settle_batch, batch, prepared)
                continue
            with self._lock:
                self._written.append((batch, prepared))
                self._written_messages += len(prepared.ids)
                start_flusher = not self._flushing
                self._flushing = True
            if start_flusher and not self._schedule(self._flush):
                self._answer(self._abandon)
        if not self._schedule(self._write):  # still `_writing`: the line stays this stage's
            self._answer(self._abandon)

    def _prepare(self, batch: list[Publish]) -> PreparedPut | Outcome:
        messages = [m for p in batch for m in p.messages]
        durability = batch[0].durability
        try:
            if self.queue.config.capacity is not None or any(
                m.dedup_id is not None for m in messages
            ):
                return self.queue.put_many(messages, durability=durability)
            try:
                return self.queue.prepare(messages, durability)
            except InvalidArgument:
                if self.queue.config.capacity is None:
                    raise
                return self.queue.put_many(messages, durability=durability)  # gained one
        except BaseException as exc:  # not Exception: still the batch's, not the thread's
            return exc

    def _flush(self) -> None:
        """In a pool thread: publish everything written so far, one group commit at a time."""
        for _turn in range(BATCHES_PER_TURN):
            group, unpark_writer = self._next_group()
            if unpark_writer and not self._schedule(self._write):
                self._answer(self._abandon)
            if group is None:
                return
            puts = [prepared for _, prepared in group]
            outcome: BaseException | None = None
            try:
                self.queue.publish_prepared(puts)
            except BaseException as exc:
                outcome = exc
            outcomes = [(batch, outcome or prepared.ids) for batch, prepared in group]
            self._answer(_settle_all, outcomes)
        if not self._schedule(self._flush):  # still `_flushing`
            self._answer(self._abandon)

    def _next_group(self) -> tuple[list[tuple[list[Publish], PreparedPut]] | None, bool]:
        """Written batches of the first one's durability, up to MAX_BATCH_MESSAGES messages (at
        least one batch), in order, or None (and the flusher stops) when nothing is written;
        and whether the parked writer must be restarted."""
        with self._lock:
            if not self._written:
                self._flushing = False
                return None, False
            level = self._written[0][1].level
            group = [self._written.popleft()]
            size = len(group[0][1].ids)
            while self._written and self._written[0][1].level is level:
                if size + len(self._written[0][1].ids) > MAX_BATCH_MESSAGES:
                    break
                size += len(self._written[0][1].ids)
                group.append(self._written.popleft())
            self._written_messages -= size
            unpark = self._writer_parked and self._written_messages < MAX_WRITTEN_MESSAGES
            if unpark:
                self._writer_parked = False
            return group, unpark

    # -- shared ---------------------------------------------------------------------------------
    def _next_batch(self) -> list[Publish] | None:
        """The next batch from the line; None, and the writer stops, when it is empty."""
        with self._lock:
            if not self._pending:
                self._writing = False
                return None
            return self._take_batch()

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

    def _put(self, batch: list[Publish]) -> Outcome:
        messages = [m for p in batch for m in p.messages]
        try:
            return self.queue.put_many(messages, durability=batch[0].durability)
        except Exception as exc:
            return exc

    def _answer(self, settle: Callable[..., None], *args: object) -> None:
        """Run `settle(*args)` on the event loop (from a pool thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self._loop.call_soon_threadsafe(settle, *args)

    def _schedule(self, stage: Callable[[], None]) -> bool:
        """Run `stage` in the pool; False if the pool is shut down."""
        try:
            self._executor.submit(stage)
        except RuntimeError:
            return False
        return True

    def _abandon(self) -> None:
        """On the event loop: the pool is shut down, so a stage can no longer be scheduled.
        Fail everything still waiting in the line, written or not (503: nothing of it was
        stored). A stage still running finishes what it holds."""
        failed: list[Publish] = []
        with self._lock:
            failed.extend(self._pending)
            self._pending.clear()
            for batch, prepared in self._written:
                prepared.discard()
                failed.extend(batch)
            self._written.clear()
            self._written_messages = 0
            self._writing = self._flushing = self._writer_parked = False
        for p in failed:
            p.finish(StorageError(SHUTTING_DOWN))


def _settle_all(outcomes: list[tuple[list[Publish], Outcome]]) -> None:
    for batch, outcome in outcomes:
        settle_batch(batch, outcome)
