"""The get and ack lines of one queue: requests of one kind that arrive together, applied in
one store call per batch (gets share one lease of at most `MAX_GET_BATCH`, acks one
`ack_each`). A request that finds its line quiet (a low rate: nothing under way, the previous
request a while ago) is applied at once by its caller on the event loop where the call may run
there (`ack_soon`, `get_soon`): a batch of one costs a task, a future and a loop turn more than
the call itself.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from typing import Any

from dirmq.server.broker_host import BODY_FILE_BYTES, MAX_BATCH_MESSAGES, BrokerHost
from dirmq.server.queuecounts import ACKED, DELIVERED
from dirmq.store import Message, Queue
from dirmq.store.bodyfiles import call_by_file

GetItem = tuple[int, float | None, str | None, bool]  # max_count, visibility, holder, by_file

# Messages one batch of the get line leases for all its requests together (a request's own
# limit is the API's 1000). A request the cap leaves without a share waits for the next batch:
# answering it "nothing" would tell a consumer that polls without waiting that a deep queue
# is empty (two Spark lease-ahead threads on one connection each took it for the end).
MAX_GET_BATCH = 1000
# A request that comes at least this long after the line's previous one, with no batch under
# way and the line's recent gaps as long on average, is applied at once on the event loop by its
# caller (`quiet`): at a low rate a batch is one request, and the task, future and loop turn of
# a batch cost more than the call. Under load requests come closer together and are batched.
QUIET_GAP_S = 0.001
# Of the newest gap in the running mean (`RequestGaps`); a gap counts as at most GAP_CAP_S in
# it, so a line busy again after an idle hour batches again within a few dozen requests.
GAP_WEIGHT = 0.125
GAP_CAP_S = 10 * QUIET_GAP_S


class RequestGaps:
    """Whether a line is quiet, from the gaps between its requests: the last one and their
    running mean both at least `QUIET_GAP_S`. The last gap alone misjudged a busy line: each
    lull between bursts (clients reading their answers) made the next request quiet, applied
    alone on the loop while the others queued behind it, which made the next lull; GET +
    DELETE at saturation cost 13% more server CPU a message (issue 37: 265 against 306 us)."""

    __slots__ = ("_last", "_mean")

    def __init__(self) -> None:
        self._last = 0.0  # when the previous request came (time.monotonic())
        self._mean = GAP_CAP_S  # a new line is idle

    def quiet(self, now: float) -> bool:
        """A request at `now`: whether its line is quiet (the class's docstring)."""
        gap = self.busy(now)
        return gap >= QUIET_GAP_S and self._mean >= QUIET_GAP_S

    def busy(self, now: float) -> float:
        """A request at `now` (one that went into a batch without asking: `Batcher.submit`),
        counted in the mean; its gap."""
        gap = min(now - self._last, GAP_CAP_S)
        self._last = now
        self._mean += (gap - self._mean) * GAP_WEIGHT
        return gap


class Batcher:
    """Requests of one kind (leases, acks) to one queue, applied in one store call per batch
    (`Broker.settle_call`): whatever arrives while a batch is being applied forms the next one.
    Concurrent requests then cost one pass over the queue's lock instead of a thread each,
    queued on it."""

    def __init__(self, broker: BrokerHost, queue: Queue, kind: str) -> None:
        self.broker = broker
        self.queue = queue
        self.kind = kind
        self._pending: list[tuple[Any, asyncio.Future[Any]]] = []
        self._running = False
        self._task: asyncio.Task[None] | None = None  # referenced, so it is not collected
        self._gaps = RequestGaps()  # whether a request may skip the line (`quiet`)
        # Kept: `get_running_loop()` is a getpid(2) each time, and this is once a request.
        self._loop = asyncio.get_running_loop()

    def quiet(self) -> bool:
        """Whether a request now may skip the line, applied by its caller at once (no batch
        under way, none pending, and the line quiet: `RequestGaps`); counts as a request
        either way."""
        return self._gaps.quiet(time.monotonic()) and not self._running

    def ack_soon(self, receipt: str, settle: Callable[[BaseException | None], None]) -> None:
        """An ack line's request: `settle` gets None (acknowledged) or the failure, on the
        event loop; applied at once if the line is quiet and the call runs here (one rename),
        else in the line's next batch."""
        broker, queue = self.broker, self.queue
        if self.quiet() and broker.runs_here(queue, 1):
            try:
                failure = broker.call_here(queue.ack_each, [receipt]).get(receipt)
            except Exception as exc:
                failure = exc
            else:
                if failure is None:
                    broker.moved(ACKED, queue.name, 1)
            settle(failure)
            return
        self._enqueue(receipt).add_done_callback(functools.partial(_report_ack, settle))

    def get_soon(
        self, item: GetItem, settle: Callable[[list[Message] | BaseException], None]
    ) -> None:
        """A get line's request: `settle` gets the messages leased (maybe none) or the error,
        on the event loop; leased at once if the line is quiet and the call runs here, else
        with the line's next batch."""
        broker, queue = self.broker, self.queue
        max_count, visibility_s, consumer, by_file = item
        if self.quiet() and broker.runs_here(queue, max_count):
            get = (
                functools.partial(call_by_file, BODY_FILE_BYTES, queue.get)
                if by_file
                else queue.get
            )
            try:
                got = broker.call_here(get, max_count, visibility_s=visibility_s, consumer=consumer)
            except Exception as exc:
                settle(exc)
                return
            self._got(settle, got)
            return
        self._enqueue(item).add_done_callback(functools.partial(self._got_later, settle))

    def _got_later(
        self, settle: Callable[[list[Message] | BaseException], None], done: asyncio.Future[Any]
    ) -> None:
        error = done.exception()
        if error is not None:
            settle(error)
        else:
            self._got(settle, done.result())

    def _got(
        self, settle: Callable[[list[Message] | BaseException], None], got: list[Message]
    ) -> None:
        if got:
            self.broker.moved(DELIVERED, self.queue.name, len(got))
        settle(got)

    def submit(self, item: Any) -> asyncio.Future[Any]:
        """A request into the line's next batch, never applied at once (counted as one)."""
        self._gaps.busy(time.monotonic())
        return self._enqueue(item)

    def _enqueue(self, item: Any) -> asyncio.Future[Any]:
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
        # a holder is a principal, and the leases of one call name one), and per way of
        # taking bodies (a request that sends them from their files, or any other).
        by_kind: dict[tuple[float | None, str | None, bool], list[tuple[Any, asyncio.Future[Any]]]]
        by_kind = {}
        for entry in batch:
            by_kind.setdefault(entry[0][1:], []).append(entry)
        for (visibility_s, consumer, by_file), entries in by_kind.items():
            wanted = min(sum(item[0] for item, _ in entries), MAX_GET_BATCH)
            got = await self.broker.lease(self.queue, wanted, visibility_s, consumer, by_file)
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


def _report_ack(settle: Callable[[BaseException | None], None], done: asyncio.Future[Any]) -> None:
    settle(asyncio.CancelledError() if done.cancelled() else done.exception())
