"""Spark's own ceiling for the url-mode pipeline: a streaming source with no queue behind it.

`bench/spark.py --cluster` runs it beside the dirmq source on the same kind of fresh cluster,
so a reader sees how much of a run is Spark's and how much dirmq's. It plans the same
micro-batches as the dirmq source does over `url` under availableNow (half of the run first,
then two halves of the rest), builds their rows with dirmq's own code (`leased_table`, one
Arrow IPC partition per batch, `read_rows` on the executors), and writes the same columns; it
leases, records, sends and acknowledges nothing. The messages exist only in the planner's
memory: ids and bodies of the same sizes as the benchmark's.

This directory is put on the driver's and the executors' PYTHONPATH by `bench/spark_cluster.py`:
Spark's Python workers import the source by its top-level name, `dirmq_bench_floor`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from dirmq.spark.leasing import RowsPartition, leased_table, read_rows, rows_partitions
from dirmq.spark.rows import READ_SCHEMA
from dirmq.store import Message


def body(i: int) -> bytes:
    """The benchmark's message body (`spark_cluster.measure` publishes the same)."""
    return b'{"event": %d, "pad": "%s"}' % (i, b"x" * 70)


def rows(first: int, count: int) -> pa.Table:
    """Messages `first`.. as the dirmq source reads them (ids as long as dirmq's)."""
    now = time.time()
    messages = [
        Message(f"{i:016d}-000000000000", body(i), {}, 1, now, f"{i:016d}-000000000000.1.")
        for i in range(first, first + count)
    ]
    return leased_table(messages)  # as the dirmq source records a batch: with receipts


def batch_sizes(total: int) -> list[int]:
    """What the dirmq source plans over `url` for an availableNow run of `total` (over 10,000):
    half first, then the rest in two."""
    first = total - total // 2
    rest = total - first
    return [size for size in (first, rest - rest // 2, rest // 2) if size]


class FloorDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "dirmqfloor"

    def schema(self) -> StructType:
        return READ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _FloorReader(int(self.options["messages"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return _FloorStreamReader(int(self.options["messages"]))


class _FloorReader(DataSourceReader):
    """The batch read (the dirmq trial's snapshot `count()`): the same rows, one partition."""

    def __init__(self, total: int) -> None:
        self.total = total

    def partitions(self) -> list[InputPartition]:
        return list(rows_partitions(0, rows(0, self.total), 1))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowsPartition)
        return read_rows(partition)


class _FloorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, total: int) -> None:
        self.total = total
        self.sizes: list[int] = []

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        return {"seq": 0, "end": 0}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.sizes = batch_sizes(self.total)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        seq = int(start["seq"])
        if seq >= len(self.sizes):
            return start
        return {"seq": seq + 1, "end": int(start["end"]) + self.sizes[seq]}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        first, last = int(start["end"]), int(end["end"])
        if last <= first:
            return []
        return list(rows_partitions(int(end["seq"]), rows(first, last - first), 1))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RowsPartition)
        return read_rows(partition)

    def commit(self, end: dict[str, Any]) -> None:
        pass
