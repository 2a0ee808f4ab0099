"""The direct path: a publish that finds a consumer of its queue waiting in this worker (a long
poll, or a stream with credit: both wait in the queue's waiter line, longpolls.py) is stored
straight into that consumer's lease, and both answers, the publisher's ids and the consumer's
delivery, go out with that one durable create (store/direct_lease.py). No rename into @ready,
no inotify round trip, no second rename to lease it (issue 37). The consumer has its message
once the file is flushed and linked into @leased, the publisher its 201 once @leased is fsynced
too: the usual path's consumer likewise sees a message once its rename is visible, before the
directory fsync that its publisher's 201 waits for. (Handing both over only after the directory
fsync was slower than the usual path: p50 3.5-4.7 ms against 2.3-4.3 in the same runs.)

A publish takes it only when everything is known on the event loop, at once: one message, a
queue whose index this worker holds on a local disk (`Broker.runs_here`), a waiter at the head
of an armed line that leases one message per group, and the store's own test
(`DirectLeases.admits`: no pause, rate, capacity, delay, group, dedup; nothing ready, in the
backlog or due). The waiter is taken out of its line then, so no dispatch leases for it
meanwhile. Publishes still on their way through the queue's publish line do not hold it back:
they are concurrent with this one (a connection's requests are answered one at a time), and
nothing of theirs is ready yet. Holding back for them cascaded: one publish the usual way kept
the line busy for a store, every publish meanwhile went that way too, and at 1,000 msg/s only
about one in twenty took the direct path.

The creates of a queue go through a line of their own, as publishes do (publish_line.py): those
that come while a batch is being made durable are the next batch, one commit for all (one
`syncfs`, one fsync of @leased); a create a message cost more server CPU than the publish line's
group commit under load. A batch runs where the publish line runs a quiet line's store: on the
event loop while creates are quick (the mean create on the loop shorter than `INLINE_BELOW_S`)
and rare (the last direct publish more than twice that ago: store_load.py), else on the
pool.

If the consumer has gone by the time the file is linked (its wait ended, its client hung up),
the lease is given back once the commit is done (a nack without delay), as any lease nobody
takes; if the create failed before the link, the publisher gets the error and the consumer an
empty answer, as if its wait had ended (after the link, a failed directory fsync fails the
publisher only: the consumer keeps its lease, as the usual path's consumer keeps a message it
leased before its publisher's commit failed).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import Counter

from dirmq.errors import StorageError
from dirmq.server.broker_host import MAX_BATCH_MESSAGES, BrokerHost
from dirmq.server.longpolls import LongPolls
from dirmq.server.publish_line import INLINE_BELOW_S, Settle
from dirmq.server.queuecounts import PUBLISHED
from dirmq.server.store_load import StoreTimes
from dirmq.store import Durability, Message, OutgoingMessage, Queue
from dirmq.store.direct_lease import DirectLease, admissible_config

log = logging.getLogger("dirmq.server")


class DirectPath:
    """One per broker. `receivers` is the broker's own map of waiter lines by queue name (read,
    never changed, here)."""

    def __init__(self, broker: BrokerHost, receivers: Mapping[str, LongPolls]) -> None:
        self.broker = broker
        self._receivers = receivers
        self.loop = asyncio.get_running_loop()
        self._lines: dict[str, _Line] = {}
        self._times = StoreTimes()  # of the creates: where a quiet line's run (store_load.py)
        self._last_at = 0.0  # time.monotonic() of the last direct publish
        # In every worker's metrics files (made after `MetricsFiles.create`, when there is one):
        # what proves a delivery took this path, and how often the consumer had gone by then.
        self.delivered = Counter(
            "dirmq_direct_deliveries",
            "Messages published straight into a waiting consumer's lease (one durable create)",
            registry=None,
        )
        self.released = Counter(
            "dirmq_direct_released",
            "Direct deliveries whose consumer had gone once stored: their lease given back",
            registry=None,
        )

    def offer(
        self,
        queue: Queue,
        messages: list[OutgoingMessage],
        durability: Durability | None,
        settle: Settle,
    ) -> bool:
        """Take `messages` by the direct path if it keeps every promise (the module's
        docstring); `settle` then gets the ids (or the error) on the event loop. False, and
        nothing done, otherwise: the caller publishes as usual."""
        if len(messages) != 1 or self.broker.closing:
            return False
        receiver = self._receivers.get(queue.name)
        if receiver is None or receiver.queue is not queue:
            return False
        if not admissible_config(queue.config) or not self.broker.runs_here(queue, 1):
            return False
        message = messages[0]

        def admit(waiter: object) -> bool:
            if getattr(waiter, "max_per_group", 1) != 1:
                return False  # a group's whole run (SQS FIFO): the usual get decides
            return self.broker.call_here(queue.direct.admits, message, durability)

        try:
            waiter = receiver.take_waiter(admit)
        except Exception:  # the usual path meets the same trouble and reports it
            log.debug("the direct path declined a publish to %s", queue.name, exc_info=True)
            return False
        if waiter is None:
            return False
        line = self._lines.get(queue.name)
        if line is None or line.queue is not queue:
            line = self._lines[queue.name] = _Line(self, queue)
        line.add(_Direct(message, waiter.visibility_s, waiter.consumer, waiter.future, settle))
        return True

    def timed(self, took_s: float, here: bool) -> None:
        """A create's time (`here`: on the event loop) joins what decides where a quiet line
        stores."""
        self._times.timed(took_s, here)

    def gap(self) -> float:
        """Seconds since the previous direct publish (this one's time kept for the next)."""
        now = time.monotonic()
        gap, self._last_at = now - self._last_at, now
        return gap

    def quiet(self, gap: float) -> bool:
        """Whether an idle line's create may run on the event loop now (the module's
        docstring)."""
        return self._times.on_loop(gap, INLINE_BELOW_S)

    def ended(self, line: _Line) -> None:
        """`line` went idle: forgotten unless used again since (a queue used once is not
        kept)."""
        if self._lines.get(line.queue.name) is line and line.idle():
            del self._lines[line.queue.name]


@dataclass(slots=True)
class _Direct:
    """One direct publish: its message, the waiter's lease terms, both parties' answers."""

    message: OutgoingMessage
    visibility_s: float | None
    consumer: str | None
    delivery: asyncio.Future[list[Message]]
    settle: Settle
    delivered: bool = False  # the consumer has its message (`_Line._deliver`)


class _Line:
    """A queue's direct publishes, created a batch at a time in one commit (as the publish
    line's group commit): those that come while one batch is being made durable are the next."""

    def __init__(self, path: DirectPath, queue: Queue) -> None:
        self.path = path
        self.queue = queue
        self._loop = path.loop
        self._pending: list[_Direct] = []
        self._lock = threading.Lock()  # `_pending` and `_draining` change together
        self._draining = False

    def add(self, direct: _Direct) -> None:
        gap = self.path.gap()
        with self._lock:
            self._pending.append(direct)
            if self._draining:
                return
            self._draining = True
        if self.path.quiet(gap):  # asked only of an idle line: a probe is not wasted
            self._loop.call_soon(self._drain_once_here)  # after this iteration's requests
            return
        try:
            self.path.broker.submit(self._drain)
        except RuntimeError:  # the pool is shut down: every waiting publish fails
            self._loop.call_soon(self._abandon)

    def _take(self) -> list[_Direct] | None:
        with self._lock:
            batch, self._pending = (
                self._pending[:MAX_BATCH_MESSAGES],
                self._pending[MAX_BATCH_MESSAGES:],
            )
            if not batch:
                self._draining = False
            return batch or None

    def _store(self, batch: list[_Direct], here: bool) -> list[Message] | BaseException:
        """The batch's commit; its consumers are handed their messages once the files are
        linked (`here`: on the event loop, else from a pool thread), the publishers once the
        commit is done (`_finish`)."""
        began = time.monotonic()

        def linked(messages: list[Message]) -> None:
            if here:
                self._deliver(batch, messages)
            else:
                self._loop.call_soon_threadsafe(self._deliver, batch, messages)

        try:
            return self.queue.direct.put_leased(
                [DirectLease(d.message, d.visibility_s, d.consumer) for d in batch], linked
            )
        except Exception as exc:
            return exc
        finally:
            self.path.timed(time.monotonic() - began, here)

    def _drain(self) -> None:
        """On a pool thread: batch after batch until none is left."""
        while (batch := self._take()) is not None:
            outcome = self._store(batch, here=False)
            try:
                self._loop.call_soon_threadsafe(self._finish, batch, outcome)
            except RuntimeError:  # the loop is closed: the leases expire like any other
                return
        try:
            self._loop.call_soon_threadsafe(self.path.ended, self)
        except RuntimeError:
            pass

    def idle(self) -> bool:
        with self._lock:
            return not self._draining

    def _drain_once_here(self) -> None:
        """On the event loop, while creates are quick and rare: one batch, then the pool."""
        batch = self._take()
        if batch is None:
            return
        self._finish(batch, self._store(batch, here=True))
        with self._lock:
            idle = not self._pending
            if idle:
                self._draining = False
        if idle:
            self.path.ended(self)
            return
        try:
            self.path.broker.submit(self._drain)
        except RuntimeError:
            self._abandon()

    def _abandon(self) -> None:
        with self._lock:
            pending, self._pending, self._draining = self._pending, [], False
        self._finish(pending, StorageError("the server is shutting down; retry"))

    def _deliver(self, batch: list[_Direct], messages: list[Message]) -> None:
        """On the event loop, once the batch's files are linked: each consumer still waiting
        gets its message (the others' leases go back once the commit is done: `_finish`)."""
        for direct, message in zip(batch, messages, strict=True):
            if not direct.delivery.done():
                direct.delivery.set_result([message])
                direct.delivered = True

    def _finish(self, batch: list[_Direct], outcome: list[Message] | BaseException) -> None:
        """On the event loop, once the commit is done (or failed): each publisher's answer,
        and the lease of each consumer that had gone given back."""
        path, broker = self.path, self.path.broker
        if isinstance(outcome, BaseException):
            for direct in batch:
                if not direct.delivery.done():
                    direct.delivery.set_result([])  # as if its wait had ended: it asks again
                _answer(direct.settle, outcome)
            return
        gone = [m for d, m in zip(batch, outcome, strict=True) if not d.delivered]
        if gone:
            broker.give_back(self.queue, gone)
            path.released.inc(len(gone))
        if len(gone) < len(batch):
            path.delivered.inc(len(batch) - len(gone))
        broker.moved(PUBLISHED, self.queue.name, len(batch))
        for direct, message in zip(batch, outcome, strict=True):
            _answer(direct.settle, [message.id])


def _answer(settle: Settle, outcome: list[str] | BaseException) -> None:
    try:
        settle(outcome)
    except Exception:  # one request's bug must not cost the others their answers
        log.exception("settling a direct publish failed")
