"""Leasing the messages of one micro-batch, and producing them again when Spark replays it.

Two placements, one contract (see `ledger.py`): a batch's messages are recorded durably before
any of its rows reaches Spark, and a replay produces the recorded messages.

- path mode: each read task leases its own share of the batch, on the executor, and records its
  receipts (and lease names) under its partition number. Leasing (a rename and a read per
  message) is the expensive part of a batch, and this spreads it over every executor core. The
  driver names each task's messages (`names`: disjoint slices of the oldest ready ones), so the
  tasks never race each other for the head of the queue; when it cannot (the head holds a
  message group, whose order only `get` keeps), each task gets a count (`quota`) instead.
- url mode: executors may share no filesystem with the driver, so the driver leases the whole
  batch over HTTP, records the rows in the ledger and ships each partition's rows inside the
  partition object.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import InputPartition

from dirmq.errors import CorruptMessage, MessageNotFound
from dirmq.spark.connect import PER_REQUEST, QueueHandle
from dirmq.spark.ledger import Ledger, Record
from dirmq.spark.rows import READ_COLUMNS, Columns, messages_batch, project
from dirmq.spark.upkeep import give_back, settle_record
from dirmq.store import Message, Queue
from dirmq.store.layout import parse_receipt

log = logging.getLogger("dirmq.spark")
GET_CHUNK = PER_REQUEST  # messages per get(), also a bound on time under the queue's lock
ROWS_PER_BATCH = 10_000  # rows per Arrow record batch handed to Spark
BATCH_BYTES = 32 * 1024 * 1024  # and bodies per batch: what a read task holds at a time


@dataclass
class LeasePartition(InputPartition):
    """Partition `part` of batch `seq` (path mode): lease the ready messages `names` (those
    still there) or else up to `quota` messages, or replay the record. `settle` names records of
    batches Spark has already committed, (seq, part): the task acknowledges them once its own
    rows are out, so acknowledging runs on every executor."""

    seq: int
    part: int
    quota: int
    names: list[str] = field(default_factory=list)
    settle: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class RowsPartition(InputPartition):
    """Partition `part` of batch `seq` (url mode): the rows the driver leased, as Arrow IPC."""

    seq: int
    part: int
    data: bytes


def split(count: int, parts: int) -> list[int]:
    """`count` as `parts` near-equal non-negative quotas (the first ones get the remainder)."""
    base, extra = divmod(count, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def lease(
    queue: QueueHandle,
    count: int,
    lease_s: float,
    *,
    first_wait_s: float = 0.0,
    consumer: str | None = None,
) -> list[Message]:
    """Lease up to `count` messages, oldest first; fewer if the queue runs dry. Only the first
    get may wait (`first_wait_s`) for a message to arrive. `consumer`: the holder's label the
    leases carry on a local queue (over `url` the server names the request's principal)."""
    got: list[Message] = []
    wait_s = first_wait_s
    named = {"consumer": consumer} if consumer is not None and isinstance(queue, Queue) else {}
    while len(got) < count:
        chunk = queue.get(
            min(GET_CHUNK, count - len(got)), visibility_s=lease_s, wait_s=wait_s, **named
        )
        if not chunk:
            break
        got.extend(chunk)
        wait_s = 0.0
    return got


def lease_named(
    queue: Queue, names: list[str], lease_s: float, consumer: str | None = None
) -> list[str]:
    """Lease the named ready messages that are still there, in chunks (the queue's lock is not
    held for a whole batch); their lease names. Nothing is read yet. Each chunk tells the
    store the whole share's size (`drain`), so the acks that free these files keep them all
    (pool.py) instead of unlinking all but a chunk's worth: an unlink is the dearest step of
    an ack on a disk mounted with `discard`."""
    leases: list[str] = []
    for start in range(0, len(names), GET_CHUNK):
        chunk = names[start : start + GET_CHUNK]
        leases.extend(
            queue.lease_named(chunk, visibility_s=lease_s, drain=len(names), consumer=consumer)
        )
    return leases


def read_leased(
    queue: QueueHandle,
    ledger: Ledger,
    partition: LeasePartition,
    lease_s: float,
    columns: Columns = READ_COLUMNS,
    consumer: str | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of a path-mode partition: its recorded messages on a replay, else fresh leases,
    recorded before the first row is produced. Named leases are read after the record is
    written, a chunk at a time, so a task holds one Arrow batch of messages, not its share."""
    seq, part = partition.seq, partition.part
    record = ledger.part_record(seq, part)
    if record is None:
        if partition.names and isinstance(queue, Queue):
            leases = lease_named(queue, partition.names, lease_s, consumer)
            mine = [_receipt(lease) for lease in leases]
            if ledger.record_part(seq, part, mine, leases):
                yield from _batches(read_leases(queue, leases), columns)
                settle_committed(queue, ledger, partition.settle)
                return
        else:
            messages = lease(queue, partition.quota, lease_s, consumer=consumer)
            mine = [m.receipt or "" for m in messages]
            if ledger.record_part(seq, part, mine):
                yield from _batches(messages, columns)
                settle_committed(queue, ledger, partition.settle)
                return
        # Another attempt of this task recorded first: its messages are the batch's.
        give_back(queue, mine)
        record = ledger.part_record(seq, part) or Record([], [])
    if record.leases and isinstance(queue, Queue):
        replayed = read_leases(queue, record.leases)
    else:
        replayed = replay(queue, record.receipts)
    yield from _batches(replayed, columns)
    settle_committed(queue, ledger, partition.settle)


def _receipt(lease: str) -> str:
    """The receipt of a named lease, `<id>.<count>.<deadline>` (no group: planned names have
    none): a string cut, not a parse, once per message."""
    return lease.rpartition(".")[0]


def read_leases(queue: Queue, leases: list[str]) -> Iterator[Message]:
    """The messages behind our lease names, one at a time (see `Queue.read_leases`). One that
    is gone is skipped (see `replay`)."""
    produced = 0
    for message in queue.read_leases(leases):
        produced += 1
        yield message
    if produced < len(leases):
        _warn_missing(queue.name, len(leases) - produced, len(leases))


def settle_committed(queue: QueueHandle, ledger: Ledger, records: list[tuple[int, int]]) -> None:
    """Acknowledge the messages of committed batches' records, then remove the records. A
    failure here must not fail the batch: the driver settles whatever is left."""
    try:
        for seq, part in records:
            record = ledger.part_record(seq, part)
            if record is not None:
                settle_record(queue, record)
                ledger.drop_part(seq, part)
    except Exception as exc:
        log.warning("dirmq: acknowledging committed batches failed (the driver will): %s", exc)


def replay(queue: QueueHandle, receipts: list[str]) -> Iterator[Message]:
    """The messages behind recorded receipts, read by id (whatever their lease state now): from
    listings of the queue's directories when it is local (an executor's index, polling on a
    network filesystem, can be seconds behind), else one `peek` each. A message that is gone
    was acknowledged by someone who received it after our lease expired: it has been
    processed, and is skipped."""
    ids = [parsed[0] for receipt in receipts if (parsed := parse_receipt(receipt)) is not None]
    produced = 0
    for message in queue.read_ids(ids) if isinstance(queue, Queue) else _peeked(queue, ids):
        produced += 1
        yield message
    if produced < len(ids):
        _warn_missing(queue.name, len(ids) - produced, len(ids))


def _peeked(queue: QueueHandle, ids: list[str]) -> Iterator[Message]:
    for message_id in ids:
        try:
            yield queue.peek(message_id)
        except (MessageNotFound, CorruptMessage):  # a damaged one is skipped, as by a get
            pass


def _warn_missing(queue_name: str, missing: int, total: int) -> None:
    log.warning(
        "dirmq: reading a batch of %s: %d of %d messages were acknowledged elsewhere after "
        "their lease expired, and are skipped",
        queue_name,
        missing,
        total,
    )


def _batches(messages: Iterable[Message], columns: Columns) -> Iterator[pa.RecordBatch]:
    """Arrow batches of at most `ROWS_PER_BATCH` rows and about `BATCH_BYTES` of bodies."""
    rows: list[Message] = []
    size = 0
    for message in messages:
        rows.append(message)
        size += len(message.body)
        if len(rows) == ROWS_PER_BATCH or size >= BATCH_BYTES:
            yield messages_batch(rows, "leased", columns)
            rows, size = [], 0
    if rows:
        yield messages_batch(rows, "leased", columns)


# -- url mode -------------------------------------------------------------------------------------
def leased_table(messages: list[Message]) -> pa.Table:
    """Rows for the ledger: every column of the read schema (a restart may declare other
    columns than the run that recorded them) plus each message's `receipt`."""
    batch = messages_batch(messages, "leased")
    receipts = pa.array([m.receipt for m in messages], pa.string())
    return pa.Table.from_batches([batch]).append_column("receipt", receipts)


def rows_partitions(seq: int, table: pa.Table, parts: int) -> list[RowsPartition]:
    """The recorded rows of batch `seq`, without receipts, in `parts` IPC-encoded slices."""
    rows = table.drop_columns(["receipt"])
    result = []
    offset = 0
    for part, size in enumerate(split(rows.num_rows, parts)):
        if size:
            sink = pa.BufferOutputStream()
            piece = rows.slice(offset, size)
            with pa.ipc.new_stream(sink, piece.schema) as writer:
                writer.write_table(piece)
            result.append(RowsPartition(seq, part, sink.getvalue().to_pybytes()))
        offset += size
    return result


def read_rows(
    partition: RowsPartition, columns: Columns = READ_COLUMNS
) -> Iterator[pa.RecordBatch]:
    for batch in pa.ipc.open_stream(pa.py_buffer(partition.data)):
        yield project(batch, columns)
