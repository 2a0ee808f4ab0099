"""Leasing ahead over `url` under availableNow: while Spark runs one micro-batch, two driver
threads lease the messages of the next ones, so the server's leasing overlaps the executors' work
instead of following it (`stream.py` takes each batch from here).

Only under availableNow, where the run's total is known (what was ready at its start): the
thread leases up to that many, and holds at most `hold` (a batch held in memory) at a time.
What is leased ahead is recorded only when a batch takes it (the ledger's rule is unchanged: a
batch is recorded before any of its rows reaches Spark), so:

- a driver that dies leaves them leased: they return to the queue when their lease ends
  (`leaseSeconds`), as the messages of a batch it was leasing when it died would;
- `close()` (the query's `stop()`) gives back what no batch took;
- a message held longer than `EXTEND_AFTER` of its lease has its lease extended when a batch
  takes it; one whose lease could not be extended (expired: someone else may hold it now) is
  left out of the batch. The upkeep thread renews a recorded batch's leases a third of a lease
  after the record at most a quarter later (`upkeep.py`): a lease a twelfth old when recorded
  still has a third of its length left then.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from dirmq.errors import InvalidArgument, StaleReceipt
from dirmq.spark.connect import PER_REQUEST, QueueHandle
from dirmq.store import Message

log = logging.getLogger("dirmq.spark")
GET_CHUNK = PER_REQUEST  # messages per get()
# Gets under way at once, each thread on a connection of its own: the server leases the next
# chunk while the driver reads the last (leasing 50,000 from a one-worker server: 2.23 s with
# one, 1.76-1.85 s with two, the same server CPU; the first batch's lease overlaps nothing).
LEASE_THREADS = 2
EXTEND_AFTER = 1 / 12  # of a lease: held longer, a message's lease is extended when taken


class LeaseAhead:
    """Leases up to `total` messages of `queue` on `threads` threads of its own, at most
    `hold` held or asked for; `give_back` returns receipts to the queue in bulk."""

    def __init__(
        self,
        queue: QueueHandle,
        lease_s: float,
        total: int,
        hold: int,
        give_back: Callable[[list[str]], None],
        threads: int = LEASE_THREADS,
    ) -> None:
        self._queue = queue
        self._give_back = give_back
        self._lease_s = lease_s
        self._left = total  # still to ask for
        self._hold = max(1, hold)
        self._cond = threading.Condition()
        # (get number, leased at, messages), in the order the gets were asked for.
        self._chunks: deque[tuple[int, float, list[Message]]] = deque()
        self._held = 0
        self._asked = 0  # messages asked for by the gets under way
        self._gets = 0  # gets asked for so far (numbers them)
        self._running = threads  # threads still leasing (none: nothing more will be leased)
        self._ended = False  # a get came back empty (the queue has no more ready) or failed
        self._error: Exception | None = None
        self._closed = False
        self._threads = [
            threading.Thread(target=self._run, name=f"dirmq-spark-ahead-{n}", daemon=True)
            for n in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def take(self, count: int) -> list[Message]:
        """Up to `count` leased messages, in the order their gets were asked for: waits until
        that many are held or nothing more will come. Raises what a get raised if nothing is
        held."""
        with self._cond:
            while self._held < count and self._running:
                self._cond.wait()
            if not self._chunks and self._error is not None:
                error, self._error = self._error, None
                raise error
            taken: list[tuple[float, list[Message]]] = []
            wanted = count
            while wanted > 0 and self._chunks:
                number, leased_at, chunk = self._chunks.popleft()
                if len(chunk) > wanted:
                    self._chunks.appendleft((number, leased_at, chunk[wanted:]))
                    chunk = chunk[:wanted]
                taken.append((leased_at, chunk))
                wanted -= len(chunk)
            self._held -= count - wanted
            self._cond.notify_all()
        return self._fresh(taken)

    def _fresh(self, taken: list[tuple[float, list[Message]]]) -> list[Message]:
        """The messages of `taken`, their leases extended if they are past `EXTEND_AFTER`."""
        stale_before = time.monotonic() - self._lease_s * EXTEND_AFTER
        old = [m.receipt or "" for at, chunk in taken if at < stale_before for m in chunk]
        lost: set[str] = set()
        if old:
            failures = self._queue.extend_many(old, self._lease_s)
            for receipt, failure in failures.items():
                if not isinstance(failure, StaleReceipt | InvalidArgument):
                    self._give_back([m.receipt or "" for _, c in taken for m in c])
                    raise failure
                lost.add(receipt)
            if lost:
                log.warning(
                    "dirmq: %d messages leased ahead lost their lease before a batch took "
                    "them; they are left to whoever leases them next",
                    len(lost),
                )
        return [m for _, chunk in taken for m in chunk if (m.receipt or "") not in lost]

    def close(self) -> None:
        """Stop leasing and give back what no batch took."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + 60
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._cond:
            leftover = [m.receipt or "" for _, _, chunk in self._chunks for m in chunk]
            self._chunks.clear()
            self._held = 0
        if leftover:
            try:
                self._give_back(leftover)
            except Exception as exc:  # their leases end by themselves
                log.warning("dirmq: giving back %d messages failed: %s", len(leftover), exc)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopping() and self._held + self._asked >= self._hold:
                    self._cond.wait()
                if self._stopping() or self._left <= 0:
                    self._stop(None)
                    return
                want = min(GET_CHUNK, self._left, self._hold - self._held - self._asked)
                self._left -= want
                self._asked += want
                number = self._gets
                self._gets += 1
            error: Exception | None = None
            try:
                got = self._queue.get(want, visibility_s=self._lease_s)
            except Exception as exc:  # the batch that needs these raises it
                got, error = [], exc
            with self._cond:
                self._asked -= want
                self._left += want - len(got)
                if got:
                    self._file(number, got)
                if not got:  # the queue ran dry (availableNow plans what there is), or failed
                    self._ended = True
                    self._stop(error)
                    return

    def _file(self, number: int, got: list[Message]) -> None:
        """(Under the condition.) Hold a get's messages in the order the gets were asked for
        (with two under way, the later may answer first)."""
        chunks = self._chunks
        at = len(chunks)
        while at and chunks[at - 1][0] > number:
            at -= 1
        chunks.insert(at, (number, time.monotonic(), got))
        self._held += len(got)
        self._cond.notify_all()

    def _stopping(self) -> bool:
        return self._closed or self._ended

    def _stop(self, error: Exception | None) -> None:
        """(Under the condition.) This thread leases no more; once no thread does, nothing
        more will be leased."""
        if error is not None and self._error is None:
            self._error = error
        self._running -= 1
        self._cond.notify_all()
