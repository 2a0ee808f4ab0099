"""The get and ack lines of one queue: requests of one kind that arrive together, applied in
one store call per batch (gets share one lease of at most `MAX_GET_BATCH`, acks one
`ack_each`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from dirmq.server.broker_host import MAX_BATCH_MESSAGES, BrokerHost
from dirmq.server.queuecounts import ACKED
from dirmq.store import Queue

# Messages one batch of the get line leases for all its requests together (a request's own
# limit is the API's 1000). A request the cap leaves without a share waits for the next batch:
# answering it "nothing" would tell a consumer that polls without waiting that a deep queue
# is empty (two Spark lease-ahead threads on one connection each took it for the end).
MAX_GET_BATCH = 1000
# A request that comes at least this long after the line's previous one, with no batch under
# way, is applied at once on the event loop by its caller (`quiet`): at a low rate a batch is
# one request, and the task, future and loop turn of a batch cost more than the call. Under
# load requests come closer together and are batched as before.
QUIET_GAP_S = 0.001


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
        self._last = 0.0  # time.monotonic() of the last request (`quiet`)
        # Kept: `get_running_loop()` is a getpid(2) each time, and this is once a request.
        self._loop = asyncio.get_running_loop()

    def quiet(self) -> bool:
        """Whether a request now may skip the line, applied by its caller at once (no batch
        under way, none pending, and the previous request `QUIET_GAP_S` ago or more); counts
        as a request either way."""
        now = time.monotonic()
        gap, self._last = now - self._last, now
        return gap >= QUIET_GAP_S and not self._running

    def submit(self, item: Any) -> asyncio.Future[Any]:
        self._last = time.monotonic()
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
