"""Structured Streaming from a work queue: each micro-batch leases messages to a named consumer,
records them (`ledger.py`), and acknowledges them only after Spark has committed the batch.

Offsets are `{"seq": n, "messages": m, "partitions": p}`: batch number n of this consumer, with m
messages planned over p read partitions. What PySpark 4.x does, and what follows from it:

- `latestOffset(start, limit)` is called only once Spark has written the commit record of the
  batch ending at `start`. So that call is where every batch up to `start` is acknowledged
  (`commit(end)`, which Spark calls late or never for the last batch, asks for the same).
- After a failure Spark calls `partitions(start, end)` again with the offsets of its log, without
  calling `latestOffset`: the ledger holds what the batch leased, so it replays exactly that.
- Whatever the ledger holds beyond `start` when `latestOffset(start)` is called was planned but
  never logged by Spark (or belongs to a discarded checkpoint): it is given back to the queue.
- `initialOffset` is called at every start, even from a checkpoint: its one side effect is
  taking the consumer name (`holder.py`), which `stop()` gives back.
- With no data, `latestOffset` is called ~80 times a second: path mode lists `@ready` at most
  every 50 ms (`backlog.py`) and otherwise asks the queue's index for its ready count; url mode
  long-polls briefly.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from dirmq.errors import InvalidArgument
from dirmq.spark.ahead import LeaseAhead
from dirmq.spark.backlog import ReadyBacklog
from dirmq.spark.connect import QueueHandle, local_store, open_queue, state_access
from dirmq.spark.holder import take
from dirmq.spark.leasing import (
    LeasePartition,
    RowsPartition,
    lease,
    leased_table,
    read_leased,
    read_rows,
    rows_partitions,
    split,
)
from dirmq.spark.ledger import Ledger
from dirmq.spark.options import Options
from dirmq.spark.rows import READ_COLUMNS, Columns
from dirmq.spark.upkeep import Upkeep, give_back
from dirmq.store import Queue
from dirmq.store.names import queue_path
from dirmq.store.watch import polls

log = logging.getLogger("dirmq.spark")
SETTLE_TIMEOUT_S = 600.0
FINAL_BATCH = 1000  # availableNow: messages left for the last batch
# availableNow over `url`: the first batch takes at most half of a run larger than this (below,
# leasing all of it first costs less than another micro-batch, ~0.7 s on a small cluster).
FIRST_CUT_MIN = 10_000

Offset = dict[str, Any]


def offset(seq: int, messages: int = 0, partitions: int = 0) -> Offset:
    return {"seq": seq, "messages": messages, "partitions": partitions}


class _Driver:
    """What the stream reader holds on the driver once the query runs (never pickled)."""

    def __init__(self, options: Options) -> None:
        self.queue: QueueHandle = open_queue(options)
        # Before the ledger is touched: a second query on this consumer would share it, and
        # deliver everything a second time. (Nothing below fails but the filesystem.)
        self.hold = take(
            options.consumer_dir(),
            f"consumer {options.consumer!r} of queue {options.queue!r}",
            options.lease_s,
            state_access(options),
        )
        self.ledger = Ledger(options.consumer_dir(), state_access(options))
        self.first_acked = self.ledger.acked()
        # Path mode: records of committed batches up to here went to a later batch's tasks.
        self.handed = self.first_acked
        # Path mode: ready messages not yet planned, as last counted (stats() is skipped while
        # this alone fills a batch: counting processes every change others made meanwhile).
        self.unplanned = 0
        self.upkeep = Upkeep(self.queue, self.ledger, options.lease_s, self.hold)
        # availableNow over `url`: the messages leased ahead of the batches that take them.
        self.ahead: LeaseAhead | None = None
        # Path mode: the ready messages to plan from, and the names planned for each batch.
        self.backlog = ReadyBacklog(self.queue) if isinstance(self.queue, Queue) else None
        # (batch, its names; [] for a batch planned as a count): None for a batch this driver
        # did not plan (a restart).
        self.planned: tuple[int, list[str]] | None = None
        # Large batches need cheap lease renewals: one rename per message and heartbeat, which
        # a network filesystem (polled) makes slow. There, batches keep the smaller default.
        self.large_batches = (
            self.backlog is not None
            and options.path is not None
            and not polls(
                local_store(options.path).watch_mode, queue_path(options.path, options.queue)
            )
        )

    def give_back(self, receipts: list[str]) -> None:
        give_back(self.queue, receipts)

    def discard_after(self, seq: int) -> None:
        """Give back what batches beyond `seq` leased: Spark never logged them."""
        for later in self.ledger.seqs():
            if later > seq:
                log.info("dirmq: batch %d was never run by Spark; releasing its messages", later)
                self.give_back(self.ledger.receipts(later))
                self.ledger.drop(later)


class DirmqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Options, columns: Columns = READ_COLUMNS) -> None:
        options.consumer_dir()  # refuse a missing consumer or state directory now
        self._options = options
        self._columns = columns
        self._driver_state: _Driver | None = None
        self._budget: int | None = None  # availableNow: messages left to plan
        self._last_cut = False  # availableNow: the last batches' shares are set
        self._first_cut = False  # availableNow over `url`: the first batch's share is set

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_driver_state"] = None
        return state

    def _driver(self) -> _Driver:
        if self._driver_state is None:
            self._driver_state = _Driver(self._options)
        return self._driver_state

    # -- planning, on the driver ----------------------------------------------------------------
    def initialOffset(self) -> Offset:  # noqa: N802
        # Called first at every start: where a second query on this consumer is refused.
        return offset(self._driver().ledger.acked())

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_per_trigger is not None:
            return ReadMaxRows(self._options.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        # "Available now" is what is ready now: plan at most that many messages in total.
        driver = self._driver()
        self._last_cut = self._first_cut = False
        if driver.backlog is not None:
            self._budget = driver.backlog.count_ready()  # a listing the first batch plans from
            return
        self._budget = driver.queue.stats().ready
        # Over `url` the driver leases every batch: the next ones are leased while Spark runs
        # this one (`ahead.py`), at most a batch held in memory at a time.
        if driver.ahead is not None:
            driver.ahead.close()
        driver.ahead = LeaseAhead(
            driver.queue,
            self._options.lease_s,
            self._budget,
            self._options.batch_cap(held=True),
            driver.give_back,
        )

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        driver = self._driver()
        driver.hold.check()  # taken over by another query: plan nothing more
        seq = int(start["seq"])
        # Spark has committed every batch up to `start`. Path mode: the records handed to the
        # tasks of those batches were acknowledged there; the driver settles what they left.
        # The batch ending at `start` itself goes to the next batch's tasks, if there is one.
        handed = seq if self._options.path is None else min(seq, driver.handed)
        driver.upkeep.settle_through(handed)
        driver.discard_after(seq)
        driver.planned = None  # a plan beyond `seq` was never logged by Spark (discarded above)
        cap = self._options.batch_cap(held=not driver.large_batches)
        if isinstance(limit, ReadMaxRows):
            cap = min(cap, limit.max_rows)
        if self._budget is not None:
            cap = min(cap, self._budget)
            if cap == self._budget > FINAL_BATCH and self._options.path is not None:
                # The run's last batch is acknowledged by the driver alone once Spark has
                # committed it, while the executors wait: keep it small.
                cap -= FINAL_BATCH
            elif driver.ahead is not None and not self._first_cut and self._budget > FIRST_CUT_MIN:
                # Over `url` nothing overlaps the first batch's lease, and its job is the one
                # that starts the executors' cold work: it takes at most half of the run, the
                # rest is leased ahead meanwhile.
                self._first_cut = True
                cap = min(cap, self._budget - self._budget // 2)
            elif cap == self._budget > FINAL_BATCH and not self._last_cut:
                # Over `url` the driver acknowledges every batch, the one before the last
                # while the last runs: the two share what is left.
                self._last_cut = True
                cap -= cap // 2
        following = max(seq, driver.first_acked) + 1
        planned = self._plan(driver, following, cap, limit) if cap > 0 else None
        if planned is None:
            driver.upkeep.wait_settled(seq, SETTLE_TIMEOUT_S)
            return start
        if self._budget is not None:
            self._budget -= planned["messages"]
        return planned

    def _plan(self, driver: _Driver, seq: int, cap: int, limit: ReadLimit) -> Offset | None:
        options = self._options
        if driver.backlog is not None:
            minimum = limit.min_rows if isinstance(limit, ReadMinRows) else 0
            names = driver.backlog.take(cap, minimum)
            if names:
                driver.planned = (seq, names)
                driver.unplanned = 0  # the count below is stale now: count again when needed
                return offset(seq, len(names), options.partitions_for(len(names)))
        cap = min(cap, options.batch_cap(held=True))  # what follows holds its messages
        if options.path is not None:  # the head holds a message group: plan a count to `get`
            if driver.unplanned < cap:
                driver.unplanned = driver.queue.stats().ready
            ready = driver.unplanned
            if isinstance(limit, ReadMinRows) and ready < limit.min_rows:
                return None
            count = min(cap, ready)
            if count <= 0:
                return None
            driver.unplanned -= count
            driver.planned = (seq, [])  # planned here, as a count
            return offset(seq, count, options.partitions_for(count))
        if driver.ahead is not None:
            messages = driver.ahead.take(cap)
        else:
            messages = lease(
                driver.queue,
                cap,
                options.lease_s,
                first_wait_s=options.poll_wait_s,
                consumer=options.consumer,
            )
        if not messages:
            return None
        table = leased_table(messages)
        driver.ledger.write_rows(seq, table)
        return offset(seq, len(messages), options.rows_partitions_for(len(messages), table.nbytes))

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        seq, count, parts = int(end["seq"]), int(end["messages"]), int(end["partitions"])
        if count <= 0 or seq <= int(start["seq"]):
            return []
        ledger = self._driver().ledger
        if seq <= ledger.acked():
            log.warning("dirmq: batch %d was already acknowledged; it produces nothing now", seq)
            return []
        if self._options.path is not None:
            return self._lease_partitions(int(start["seq"]), seq, count, parts)
        table = ledger.rows(seq)
        if table is None:
            log.warning("dirmq: batch %d has no record; its messages return to the queue", seq)
            return []
        return list(rows_partitions(seq, table, parts))

    def _lease_partitions(
        self, committed: int, seq: int, count: int, parts: int
    ) -> list[InputPartition]:
        """Path mode: the read tasks of batch `seq`, each given its own slice of the batch's
        planned names (or a count to `get`), and charged with acknowledging the records of
        committed batches that nobody settles yet (spread over the tasks, by record)."""
        driver = self._driver()
        ledger = driver.ledger
        # The tasks follow from the offset alone (a replay must find every partition's record);
        # a plan names each task's messages, without one (a batch planned as a count: a group
        # at the head) each task leases its share with `get`.
        quotas = split(count, parts)
        names = driver.planned[1] if driver.planned and driver.planned[0] == seq else None
        if names is None:  # a restart: Spark runs the batch it logged without planning it again
            names, quotas = self._replan(driver, seq, quotas)
        if names is not None and len(names) == count:
            starts = [sum(quotas[:i]) for i in range(len(quotas))]
            tasks = [
                LeasePartition(seq, i, 0, names[start : start + quota])
                for i, (start, quota) in enumerate(zip(starts, quotas, strict=True))
                if quota
            ]
        else:
            tasks = [LeasePartition(seq, i, q) for i, q in enumerate(quotas) if q]
        records = [
            (earlier, part)
            for earlier in ledger.seqs()
            if driver.handed < earlier <= committed
            for part in ledger.part_numbers(earlier)
        ]
        for n, record in enumerate(records):
            tasks[n % len(tasks)].settle.append(record)
        driver.handed = max(driver.handed, committed)
        return list(tasks)

    def _replan(
        self, driver: _Driver, seq: int, quotas: list[int]
    ) -> tuple[list[str] | None, list[int]]:
        """Names, or else quotas, for a batch this driver did not plan. When none of it was
        recorded any ready messages will do: named ones are streamed, not held. Partitions
        that lease with `get` hold what they lease until it is recorded, so their quotas are
        cut to what a batch held in memory may take (a batch may come out smaller). An
        availableNow budget is charged with what the unrecorded partitions will lease."""
        recorded = set(driver.ledger.part_numbers(seq))
        names = None
        if not recorded and driver.backlog is not None:
            names = driver.backlog.take(sum(quotas), sum(quotas)) or None
        if names is None:  # a recorded partition replays its record, whatever its quota
            held = split(self._options.batch_cap(held=True), len(quotas))
            quotas = [
                quota if part in recorded else min(quota, most)
                for part, (quota, most) in enumerate(zip(quotas, held, strict=True))
            ]
        if self._budget is not None:
            fresh = sum(q for part, q in enumerate(quotas) if part not in recorded)
            self._budget = max(0, self._budget - fresh)
        return names, quotas

    def commit(self, end: Offset) -> None:
        if self._options.path is None:
            self._driver().upkeep.settle_through(int(end["seq"]))

    def stop(self) -> None:
        if self._driver_state is not None:
            if self._driver_state.ahead is not None:
                self._driver_state.ahead.close()  # gives back what no batch took
            self._driver_state.upkeep.close()
            self._driver_state.hold.release()

    # -- reading, on the executors --------------------------------------------------------------
    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, RowsPartition):
            return read_rows(partition, self._columns)
        if not isinstance(partition, LeasePartition):
            raise InvalidArgument(f"not a dirmq partition: {partition!r}")
        options = self._options
        queue = open_queue(options)
        ledger = Ledger(options.consumer_dir(), state_access(options))
        return read_leased(
            queue, ledger, partition, options.lease_s, self._columns, options.consumer
        )
