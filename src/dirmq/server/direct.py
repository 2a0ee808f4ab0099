"""The direct path: a publish that finds a consumer of its queue waiting in this worker (a long
poll, or a stream with credit: both wait in the queue's waiter line, longpolls.py) is stored
straight into that consumer's lease, and both answers, the publisher's ids and the consumer's
delivery, go out after that one durable create (store/direct_lease.py). No rename into @ready,
no inotify round trip, no second rename to lease it (issue 37).

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

The create runs where the publish line would run a quiet line's store: on the event loop while
creates are quick and rare (each wait shorter than `INLINE_BELOW_S`, the last one begun more than
twice that ago), else on the pool. If the consumer has gone by the time the create is durable
(its wait ended, its client hung up), the lease is given back at once (a nack without delay),
as any lease nobody takes; if the create failed, the publisher gets the error and the consumer
an empty answer, as if its wait had ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from prometheus_client import Counter

from dirmq.server.broker_host import BrokerHost
from dirmq.server.longpolls import LongPolls
from dirmq.server.publish_line import INLINE_BELOW_S, STORE_TIME_WEIGHT, Settle
from dirmq.server.queuecounts import PUBLISHED
from dirmq.store import Durability, Message, OutgoingMessage, Queue
from dirmq.store.direct_lease import admissible_config

log = logging.getLogger("dirmq.server")


class DirectPath:
    """One per broker. `receivers` is the broker's own map of waiter lines by queue name (read,
    never changed, here)."""

    def __init__(self, broker: BrokerHost, receivers: Mapping[str, LongPolls]) -> None:
        self.broker = broker
        self._receivers = receivers
        self._loop = asyncio.get_running_loop()
        self._store_s: float | None = None  # running mean of a create's time; None: unknown
        self._last_at = 0.0  # time.monotonic() when the last create began
        self._in_flight = 0
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
        store = _Create(self, queue, message, waiter.visibility_s, waiter.consumer)
        finish = _Finish(self, queue, waiter.future, settle)
        now = time.monotonic()
        mean = self._store_s
        quiet = (
            mean is not None
            and mean < INLINE_BELOW_S
            and not self._in_flight
            and now - self._last_at > 2 * mean
        )
        self._last_at = now
        self._in_flight += 1
        if quiet:
            self._loop.call_soon(lambda: finish(store()))  # after this iteration's requests
            return True
        try:
            self.broker.submit(self._from_pool, store, finish)
        except RuntimeError:  # the pool is shut down: the usual path says so to the publisher
            self._in_flight -= 1
            if not waiter.future.done():
                waiter.future.set_result([])
            return False
        return True

    def _from_pool(self, store: Callable[[], Message | BaseException], finish: _Finish) -> None:
        outcome = store()
        try:
            self._loop.call_soon_threadsafe(finish, outcome)
        except RuntimeError:  # the loop is closed: the lease expires like any other
            pass

    def timed(self, took_s: float) -> None:
        mean = self._store_s
        self._store_s = took_s if mean is None else mean + (took_s - mean) * STORE_TIME_WEIGHT


class _Create:
    """The store call of one direct publish (on the loop or a pool thread)."""

    __slots__ = ("consumer", "message", "path", "queue", "visibility_s")

    def __init__(
        self,
        path: DirectPath,
        queue: Queue,
        message: OutgoingMessage,
        visibility_s: float | None,
        consumer: str | None,
    ) -> None:
        self.path, self.queue, self.message = path, queue, message
        self.visibility_s, self.consumer = visibility_s, consumer

    def __call__(self) -> Message | BaseException:
        began = time.monotonic()
        try:
            return self.queue.direct.put_leased(self.message, self.visibility_s, self.consumer)
        except Exception as exc:
            return exc
        finally:
            self.path.timed(time.monotonic() - began)


class _Finish:
    """On the event loop, once the create is durable (or failed): both answers."""

    __slots__ = ("future", "path", "queue", "settle")

    def __init__(
        self,
        path: DirectPath,
        queue: Queue,
        future: asyncio.Future[list[Message]],
        settle: Settle,
    ) -> None:
        self.path, self.queue, self.future, self.settle = path, queue, future, settle

    def __call__(self, outcome: Message | BaseException) -> None:
        path, broker, future = self.path, self.path.broker, self.future
        path._in_flight -= 1
        if isinstance(outcome, BaseException):
            if not future.done():
                future.set_result([])  # as if its wait had ended: it asks again
            self._answer(outcome)
            return
        if future.done():  # the consumer has gone: the lease goes back at once
            broker.give_back(self.queue, [outcome])
            path.released.inc()
        else:
            future.set_result([outcome])
            path.delivered.inc()
        broker.moved(PUBLISHED, self.queue.name, 1)
        self._answer([outcome.id])

    def _answer(self, outcome: list[str] | BaseException) -> None:
        try:
            self.settle(outcome)
        except Exception:  # one request's bug must not cost the consumer its delivery
            log.exception("settling a direct publish failed")
