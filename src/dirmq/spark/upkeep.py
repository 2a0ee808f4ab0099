"""The driver's background duties for one streaming consumer, on one thread (and a small pool).

- Settling: once Spark has committed the batches up to `seq`, acknowledge every message they
  recorded, remove their records, and move the ledger's `acked` mark. Spark only learns that a
  batch is committed when it plans the next one (that is when it calls `latestOffset(start)` and
  `commit(end)`), so settling is asked for there. While data keeps coming, acknowledging batch
  N overlaps with running batch N+1; when the source is idle (or at the end of an availableNow
  run), `latestOffset` waits for the settling to finish before it answers "no new data".
- The last batch before the source idles (or ends, with availableNow) has no later tasks to
  settle it: the driver acknowledges it alone, its records on `SETTLE_THREADS` threads.
- Heartbeats: every lease period / 4, renew the query's hold on its consumer name
  (`holder.py`), and extend the leases of recorded batches that are not yet
  settled and were last extended (or recorded) more than a third of a lease period ago, so a
  long batch keeps its messages: a batch at a time (`extend_many`), not a receipt at a time.

A receipt whose lease has expired cannot be acknowledged: the message is then deleted by id,
because Spark has committed it (if someone else received it meanwhile, they see it once more,
which is the at-least-once case the documentation describes).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from dirmq.errors import InvalidArgument, MessageNotFound, StaleReceipt
from dirmq.spark.connect import PER_REQUEST, QueueHandle
from dirmq.spark.holder import ConsumerHold
from dirmq.spark.ledger import Ledger, Record
from dirmq.store import Queue
from dirmq.store.layout import parse_receipt

log = logging.getLogger("dirmq.spark")
SETTLE_THREADS = 2


class Upkeep:
    def __init__(
        self, queue: QueueHandle, ledger: Ledger, lease_s: float, hold: ConsumerHold | None = None
    ) -> None:
        self._queue = queue
        self._ledger = ledger
        self._lease_s = lease_s
        self._hold = hold
        self._cond = threading.Condition()
        self._target = ledger.acked()  # settle everything up to here
        self._done = self._target  # settled up to here
        self._attempted = self._target  # the last settling attempt covered up to here
        self._error: Exception | None = None
        self._extended: dict[int, float] = {}
        self._closed = False
        self._pool = ThreadPoolExecutor(SETTLE_THREADS, thread_name_prefix="dirmq-spark-settle")
        self._thread = threading.Thread(target=self._run, name="dirmq-spark-upkeep", daemon=True)
        self._thread.start()

    # -- asked for by the stream reader ----------------------------------------------------------
    def settle_through(self, seq: int) -> None:
        """Ask for every batch up to `seq` to be settled (returns at once)."""
        with self._cond:
            if seq > self._target:
                self._target = seq
                self._cond.notify_all()

    def wait_settled(self, seq: int, timeout_s: float) -> None:
        """Block until batches up to `seq` are settled; re-raise the error if settling failed."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self.settle_through(seq)
            while self._attempted < seq and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"settling the batches up to {seq} took over {timeout_s} s")
                self._cond.wait(remaining)
            if self._done < seq and self._error is not None:
                error, self._error = self._error, None
                self._attempted = self._done  # the next call tries again
                raise error

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        interval_s = self._lease_s / 4
        next_beat = time.monotonic() + interval_s
        while True:
            with self._cond:
                while not self._closed and self._target <= self._attempted:
                    remaining = next_beat - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._closed:
                    self._pool.shutdown(wait=False)
                    return
                target = self._target
            if target > self._attempted:
                self._settle(target)
            if time.monotonic() >= next_beat:
                self._renew_hold()
                self._heartbeat()
                next_beat = time.monotonic() + interval_s

    def _settle(self, target: int) -> None:
        error: Exception | None = None
        try:
            for seq in self._ledger.seqs():
                if seq > target:
                    break
                records = self._ledger.records(seq)
                # Renames and unlinks release the GIL: the records settle side by side.
                for future in [
                    self._pool.submit(settle_record, self._queue, piece)
                    for record in records
                    for piece in self._pieces(record)
                ]:
                    future.result()
                self._ledger.drop(seq)
                self._extended.pop(seq, None)
            self._ledger.set_acked(target)
        except Exception as exc:  # reported to the stream reader, retried on its next call
            log.warning("dirmq: acknowledging batches up to %d failed: %s", target, exc)
            error = exc
        with self._cond:
            self._attempted = max(self._attempted, target)
            if error is None:
                self._done = max(self._done, target)
            else:
                self._error = error
            self._cond.notify_all()

    def _pieces(self, record: Record) -> list[Record]:
        """A record cut for the settle threads. Over HTTP a record holds a whole batch, acked
        a request of `PER_REQUEST` receipts at a time: its requests are dealt out to the
        threads, each on a connection of its own (on a server with several workers, in
        several processes). A local record (one read task's) is settled whole."""
        receipts = record.receipts
        if isinstance(self._queue, Queue) or len(receipts) <= PER_REQUEST:
            return [record]
        requests = -(-len(receipts) // PER_REQUEST)
        size = -(-requests // SETTLE_THREADS) * PER_REQUEST  # whole requests a thread
        return [Record(receipts[i : i + size], []) for i in range(0, len(receipts), size)]

    def _renew_hold(self) -> None:
        if self._hold is None:
            return
        try:
            if not self._hold.renew():
                log.warning("dirmq: this query lost its consumer name; it stops planning")
        except Exception as exc:  # the next beat tries again, well within the hold's timeout
            log.warning("dirmq: renewing the consumer name failed: %s", exc)

    def _heartbeat(self) -> None:
        now = time.time()
        try:
            for seq in self._ledger.seqs():
                if seq <= self._done:
                    continue
                last = self._extended.get(seq) or self._ledger.recorded_at(seq)
                if last is None or now - last < self._lease_s / 3:
                    continue
                extend_all(self._queue, self._ledger.receipts(seq), self._lease_s)
                self._extended[seq] = time.time()
        except Exception as exc:  # the next beat tries again
            log.warning("dirmq: extending leases failed: %s", exc)


def extend_all(queue: QueueHandle, receipts: list[str], lease_s: float) -> None:
    """Renew the leases of `receipts`: one `extend_many` (one store call, or one request per
    1000 receipts over HTTP) where the queue has it, else one `extend` each. A lease that has
    expired already is skipped: its batch replays the message by id if it must."""
    extend_many = getattr(queue, "extend_many", None)
    if extend_many is not None:
        for failure in extend_many(receipts, lease_s).values():
            if not isinstance(failure, StaleReceipt | InvalidArgument):
                raise failure
        return
    for receipt in receipts:
        try:
            queue.extend(receipt, lease_s)
        except (StaleReceipt, InvalidArgument):
            pass


def settle_record(queue: QueueHandle, record: Record) -> None:
    """Acknowledge what one ledger record leased: by lease name where it has them (a local
    queue: no index lookups), and by receipt whatever has moved since (an extended lease)."""
    receipts = record.receipts
    if record.leases and isinstance(queue, Queue):
        moved = set(queue.ack_leases(record.leases))
        receipts = [r for r, lease in zip(receipts, record.leases, strict=True) if lease in moved]
    settle_receipts(queue, receipts)


def settle_receipts(queue: QueueHandle, receipts: list[str]) -> None:
    """Acknowledge `receipts` (one `ack_many`: the store syncs its index once per chunk, not
    once per receipt); a message whose lease has expired is deleted by id instead."""
    for receipt, failure in queue.ack_many(receipts).items():
        if not isinstance(failure, StaleReceipt):
            raise failure
        parsed = parse_receipt(receipt)
        if parsed is not None:
            try:
                queue.delete(parsed[0])
            except MessageNotFound:
                pass


def give_back(queue: QueueHandle, receipts: list[str]) -> None:
    """Return leased messages to the queue at once (their batch will never run), in bulk: one
    `nack_each` (over `url`, a request per 1000 receipts). A lease that has ended is skipped."""
    if not receipts:
        return
    for failure in queue.nack_each(receipts).values():
        if not isinstance(failure, StaleReceipt):
            raise failure
