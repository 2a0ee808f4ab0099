"""Reading the pub/sub retained log (`stream=retained`): batch and streaming, by sequence number.

The log (`<root>/@pubsub/retained/<seq>`, see docs/FORMAT.md "Pub/sub") is dense from 1 and
never shrinks, so a sequence number is a complete offset: `{"seq": n}` is the next entry to
read, and a micro-batch is the range [start, end). Nothing is leased, acknowledged or written:
`commit` does nothing, a checkpoint alone says where a query is, and any number of queries can
replay the log from any point.

The driver only finds the log's head (see `LogHead`) and cuts ranges; the executors read and
filter the entries of their range themselves (`dirmq.pubsub.retained`, as the server does). An
entry missing (or damaged) inside a range that was planned is lost data: `failOnDataLoss`
decides between failing the query and skipping it.

Over `url` the same plan holds with the server in between: the driver asks
`GET /@pubsub/retained/head` (`RemoteHead`) and each read task pages through its range with
`GET /@pubsub/retained` (at most 1000 entries a request, filtered by the server), whose explicit
`missing` markers stand for the `FileNotFoundError`/`CorruptMessage` of a local read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from dirmq.client.pubsub import MAX_RETAINED_LIMIT, RemotePubSub
from dirmq.errors import DirmqError, InvalidArgument
from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.model import Filter
from dirmq.pubsub.retained import ABSENT, LostEntry, read_retained
from dirmq.pubsub.seqlogs import LogHead
from dirmq.pubsub.transitions import Entry
from dirmq.spark.leasing import ROWS_PER_BATCH, split
from dirmq.spark.options import EARLIEST, LATEST, RetainedOptions, partitions_for
from dirmq.spark.rows import RETAINED_COLUMNS, Columns, retained_batch

log = logging.getLogger("dirmq.spark")

Offset = dict[str, Any]


class RetainedDataLoss(DirmqError):
    """An entry the read needs is missing or damaged, and `failOnDataLoss` is true."""


@dataclass
class SeqRange(InputPartition):
    """Retained entries `first` to `end - 1`."""

    first: int
    end: int


class RemoteHead:
    """`LogHead` over `url`: every `current()` is one `GET /@pubsub/retained/head` (the server
    keeps the head current cheaply, the same way)."""

    def __init__(self, url: str) -> None:
        self._client = RemotePubSub(url)
        self.head = 0
        self.current()

    def current(self) -> int:
        self.head = self._client.retained_head()
        return self.head

    def close(self) -> None:
        self._client.close()


Head = LogHead | RemoteHead


def _check_root(options: RetainedOptions) -> PubSubPaths:
    # A missing retained directory is an empty log; a missing root is surely a typo.
    assert options.path is not None
    if not os.path.isdir(options.path):
        raise InvalidArgument(f"path {options.path!r} is not a directory (a dirmq root)")
    return PubSubPaths.under(options.path)


def open_head(options: RetainedOptions) -> Head:
    if options.url is not None:
        return RemoteHead(options.url)
    return LogHead(_check_root(options).retained)


def seq_ranges(first: int, end: int, num_partitions: int | None) -> list[InputPartition]:
    """[first, end) as contiguous ranges, one per read partition."""
    count = max(0, end - first)
    if count == 0:
        return []
    result: list[InputPartition] = []
    for size in split(count, partitions_for(num_partitions, count)):
        result.append(SeqRange(first, first + size))
        first += size
    return result


def data_loss(options: RetainedOptions, what: str) -> None:
    """Fail with a clear error, or (failOnDataLoss=false) warn and let the caller skip."""
    if options.fail_on_data_loss:
        raise RetainedDataLoss(
            f"{what}: the retained log at {options.location} lost data (files deleted, or "
            "not the root this query was started on). Set the option failOnDataLoss=false to "
            "skip lost entries"
        )
    log.warning("dirmq: %s; skipped (failOnDataLoss=false)", what)


def read_range(
    options: RetainedOptions, partition: InputPartition, columns: Columns = RETAINED_COLUMNS
) -> Iterator[pa.RecordBatch]:
    """The rows of the entries of a `SeqRange` that match the filter, in sequence order."""
    if not isinstance(partition, SeqRange):
        raise InvalidArgument(f"not a dirmq retained-log partition: {partition!r}")
    entries = (
        _remote_entries(options, partition) if options.url else _local_entries(options, partition)
    )
    rows: list[tuple[int, Entry]] = []
    for row in entries:
        rows.append(row)
        if len(rows) == ROWS_PER_BATCH:
            yield retained_batch(rows, columns)
            rows = []
    if rows:
        yield retained_batch(rows, columns)


def _local_entries(options: RetainedOptions, partition: SeqRange) -> Iterator[tuple[int, Entry]]:
    assert options.path is not None
    paths = PubSubPaths.under(options.path)
    wanted = Filter(options.channels, options.subjects)
    for item in read_retained(paths, partition.first, partition.end, wanted):
        if not isinstance(item, LostEntry):
            yield item
            continue
        path = paths.retained_entry(item.seq)
        if item.why == ABSENT:
            data_loss(options, f"retained entry {item.seq} is missing ({path})")
        else:
            data_loss(options, f"retained entry {item.seq} is damaged ({path}: {item.error})")


def _remote_entries(options: RetainedOptions, partition: SeqRange) -> Iterator[tuple[int, Entry]]:
    """The range, page by page from the server (which filters); its missing markers are
    data loss, exactly as a missing file is for a local read."""
    assert options.url is not None
    seq = partition.first
    with RemotePubSub(options.url) as client:
        while seq < partition.end:
            page = client.read_retained(
                seq,
                min(MAX_RETAINED_LIMIT, partition.end - seq),
                channels=options.channels,
                subjects=options.subjects,
            )
            for lost, why in page.missing:
                state = "missing" if why == ABSENT else why
                data_loss(options, f"retained entry {lost} is {state} (at {options.url})")
            yield from page.entries
            if page.next_seq <= seq:
                # Planned from a head the server no longer has (its tail went, or this is
                # another root): the rest of the range is lost as well.
                data_loss(
                    options,
                    f"retained entries {seq} to {partition.end - 1} are past the head "
                    f"({page.head}) of the log at {options.url}",
                )
                return
            seq = page.next_seq


class DirmqRetainedReader(DataSourceReader):
    """Batch read of [startingOffsets, endingOffsets) of the retained log."""

    def __init__(self, options: RetainedOptions, columns: Columns = RETAINED_COLUMNS) -> None:
        if options.starting == LATEST:
            raise InvalidArgument(
                "startingOffsets=latest is for streaming reads; a batch read starts at earliest "
                "(the default) or at a sequence number"
            )
        starting, ending = options.starting, options.ending
        if isinstance(starting, int) and isinstance(ending, int) and starting > ending:
            raise InvalidArgument(f"startingOffsets {starting} is after endingOffsets {ending}")
        self._options = options
        self._columns = columns

    def partitions(self) -> list[InputPartition]:
        options = self._options
        log_head = open_head(options)
        head = log_head.head
        if isinstance(log_head, RemoteHead):
            log_head.close()
        first = 1 if options.starting == EARLIEST else int(options.starting)
        # An ending offset beyond the head reads up to the head: later entries do not exist yet.
        end = head + 1 if options.ending == LATEST else min(int(options.ending), head + 1)
        return seq_ranges(first, end, options.num_partitions) or [SeqRange(first, first)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self._options, partition, self._columns)


class DirmqRetainedStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read of the retained log; offsets `{"seq": n}`, the next entry to read."""

    def __init__(self, options: RetainedOptions, columns: Columns = RETAINED_COLUMNS) -> None:
        self._options = options
        self._columns = columns
        self._head: Head | None = None  # driver only: never pickled
        self._until: int | None = None  # availableNow: the end offset fixed at its start
        self._warned_shrunk = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_head"] = None
        return state

    def _log_head(self) -> Head:
        if self._head is None:
            self._head = open_head(self._options)
        return self._head

    def stop(self) -> None:
        if isinstance(self._head, RemoteHead):
            self._head.close()
        self._head = None

    def initialOffset(self) -> Offset:  # noqa: N802
        # Only a new query uses this (a restarted one starts from its checkpoint).
        starting = self._options.starting
        if starting == EARLIEST:
            return {"seq": 1}
        if starting == LATEST:
            return {"seq": self._log_head().current() + 1}
        return {"seq": int(starting)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_per_trigger is not None:
            return ReadMaxRows(self._options.max_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._until = self._log_head().current() + 1

    def reportLatestOffset(self) -> Offset | None:  # noqa: N802
        return {"seq": self._log_head().head + 1}

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        first = int(start["seq"])
        head = self._log_head().current()
        if head < first - 1 and first != self._options.starting:
            # The log ends before entries this query has read: it lost its tail (or this is
            # another root). A new query's own startingOffsets may point ahead: not a loss.
            if not self._warned_shrunk:
                self._warned_shrunk = not self._options.fail_on_data_loss
                data_loss(
                    self._options,
                    f"the retained log ends at {head} but this query has read up to {first - 1}",
                )
            return start
        end = head + 1
        if self._until is not None:
            end = min(end, self._until)
        if isinstance(limit, ReadMaxRows):
            end = min(end, first + limit.max_rows)
        elif isinstance(limit, ReadMinRows) and end - first < limit.min_rows:
            return start
        return {"seq": end} if end > first else start

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        return seq_ranges(int(start["seq"]), int(end["seq"]), self._options.num_partitions)

    def commit(self, end: Offset) -> None:
        pass  # nothing to acknowledge: the log is replayable, the checkpoint is the position

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self._options, partition, self._columns)
