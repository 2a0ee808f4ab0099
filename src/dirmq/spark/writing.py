"""Writes: a DataFrame's rows published to a queue, all of them or none.

Each write task stages its rows (as an Arrow IPC file under `<stateDir>/staging/<job>/` in path
mode; inside its commit message in url mode, where executors and driver may share no
filesystem). Nothing is published until Spark commits the job: then the driver publishes the
staged rows in task order with `put_many` and removes the staging; an aborted job only removes
its staging. A failed job therefore publishes nothing.

Streaming writes do the same per micro-batch, and are exactly-once across Spark's retries of a
batch (a restart after a failure re-runs the last batch and commits it again):
- every message carries a dedup id derived from the query id, the batch id and the row's
  content (plus its occurrence number among identical rows of the batch), so a batch whose
  commit was interrupted after publishing some rows publishes only the rest when it is retried
  within the queue's `dedup_window_s`;
- once a batch is fully published, a marker `<stateDir>/sinks/<queue>/@<query id>` records its
  id, so a retry at any later time publishes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from dirmq.errors import InvalidArgument, storage_error, storage_errors
from dirmq.spark.connect import (
    QueueHandle,
    flush_local,
    message_checker,
    open_queue,
    state_access,
)
from dirmq.spark.options import Options
from dirmq.spark.rows import check_write_schema, outgoing
from dirmq.spark.staging import discard_tree, remove_stale
from dirmq.store import OutgoingMessage, smallfiles

PUT_CHUNK = 500  # messages per put_many: one group commit, one HTTP request
STALE_STAGING_S = 24 * 3600.0  # staging left by a crashed driver is removed after a day
_STAGED_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC  # a retried task rewrites
QUERY_ID_KEY = "sql.streaming.queryId"  # Spark's local properties of a streaming task
BATCH_ID_KEY = "streaming.sql.batchId"


@dataclass
class StagedRows(WriterCommitMessage):
    """What one write task staged: a file (path mode) or the rows themselves (url mode)."""

    partition: int
    rows: int
    path: str | None = None
    data: bytes | None = None
    query_id: str | None = None
    batch_id: int | None = None


def _ipc_bytes(batches: Iterable[pa.RecordBatch]) -> tuple[bytes, int]:
    """Batches as one Arrow IPC stream, and their row count (no batches: no bytes)."""
    sink = pa.BufferOutputStream()
    rows = 0
    writer: pa.ipc.RecordBatchStreamWriter | None = None
    for batch in batches:
        if writer is None:
            writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
        rows += batch.num_rows
    if writer is None:
        return b"", 0
    writer.close()
    return sink.getvalue().to_pybytes(), rows


def stage(
    options: Options,
    job_dir: str | None,
    batches: Iterator[pa.RecordBatch],
    query_id: str | None = None,
    batch_id: int | None = None,
    create_dir: bool = False,
) -> StagedRows:
    """Stage one task's rows (runs on an executor): into `job_dir`, or into the message. Every
    row is checked as the queue would check it, so a bad row fails its task, and so the job,
    before anything is published. `job_dir` must exist unless `create_dir`: a task never
    recreates the directory of a job its driver has aborted."""
    context = TaskContext.get()
    partition = context.partitionId() if context else 0
    attempt = context.attemptNumber() if context else 0
    data, rows = _ipc_bytes(_checked(batches, message_checker(options)))
    if job_dir is None:
        return StagedRows(partition, rows, data=data, query_id=query_id, batch_id=batch_id)
    # A staged file needs no fsync: if the machine fails before the commit, so does the job.
    path = os.path.join(job_dir, f"part-{partition:05d}-{attempt}.arrow")
    access = state_access(options)
    if create_dir:
        access.makedirs(job_dir)
    try:
        access.write_new(path, data, _STAGED_FLAGS)
    except FileNotFoundError:
        # The driver made the directory before any task ran and removes it on abort: the job
        # failed elsewhere while this task still ran (Spark does not wait for it).
        raise InvalidArgument(
            f"the write job was aborted: its staging directory {job_dir} is gone"
        ) from None
    return StagedRows(partition, rows, path=path, query_id=query_id, batch_id=batch_id)


def _checked(
    batches: Iterator[pa.RecordBatch], check: Callable[[OutgoingMessage], None]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for message in outgoing(batch):
            check(message)
        yield batch


def staged_tables(messages: Sequence[WriterCommitMessage | None]) -> Iterator[pa.Table]:
    """The staged rows of the tasks that succeeded, in partition order."""
    staged = sorted((m for m in messages if isinstance(m, StagedRows)), key=lambda m: m.partition)
    for message in staged:
        if message.rows == 0:
            continue
        if message.path is None:
            raw = message.data
        else:
            with storage_errors(f"reading {message.path}"):
                raw = smallfiles.read_file(message.path)
        if raw is None:
            raise InvalidArgument(f"staged rows {message.path} disappeared before the commit")
        yield pa.ipc.open_stream(pa.py_buffer(raw)).read_all()


def publish(queue: QueueHandle, messages: Iterable[OutgoingMessage]) -> int:
    """`put_many` in chunks; returns how many were published."""
    count = 0
    chunk: list[OutgoingMessage] = []
    for message in messages:
        chunk.append(message)
        if len(chunk) == PUT_CHUNK:
            count += len(queue.put_many(chunk))
            chunk = []
    if chunk:
        count += len(queue.put_many(chunk))
    return count


def _cleanup(messages: Sequence[WriterCommitMessage | None], job_dir: str | None) -> None:
    # Renamed away before removal: a task of a failed job may still be running (Spark returns
    # the job's failure without waiting for its other tasks), and must find nothing to write to.
    if job_dir is not None:
        discard_tree(job_dir)
    for message in messages:
        if isinstance(message, StagedRows) and message.path is not None:
            discard_tree(os.path.dirname(message.path))


class DirmqBatchWriter(DataSourceArrowWriter):
    """`df.write.format("dirmq")`: stage in tasks, publish on commit."""

    def __init__(self, options: Options, schema: StructType) -> None:
        check_write_schema(schema)
        open_queue(options, create=options.create_queue)  # fail before any task runs
        self._options = options
        staging = options.staging_dir()
        if staging is not None:
            remove_stale(staging, STALE_STAGING_S)
        self._job_dir = None if staging is None else os.path.join(staging, uuid.uuid4().hex)
        if self._job_dir is not None:  # made here, never by a task (see `stage`)
            try:
                state_access(options).makedirs(self._job_dir)
            except OSError as exc:
                raise storage_error(exc, f"creating {self._job_dir}") from exc

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        return stage(self._options, self._job_dir, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        queue = open_queue(self._options)
        try:
            for table in staged_tables(messages):
                publish(queue, outgoing(table))
        finally:
            _cleanup(messages, self._job_dir)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _cleanup(messages, self._job_dir)


class DirmqStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("dirmq")`: each micro-batch staged, then published exactly once."""

    def __init__(self, options: Options, schema: StructType) -> None:
        check_write_schema(schema)
        open_queue(options, create=options.create_queue)  # fail at the start of the query
        self._options = options
        staging = options.staging_dir()
        if staging is not None:  # what crashed drivers, or late tasks of a failed batch, left
            remove_stale(staging, STALE_STAGING_S)
        sinks = options.sink_dir()
        if sinks is not None:  # marker writes a crashed driver left unfinished
            smallfiles.remove_stale_temps(sinks)

    def _batch_dir(self, query_id: str, batch_id: int) -> str | None:
        """Where the tasks of one micro-batch stage their rows (None over `url`)."""
        staging = self._options.staging_dir()
        if staging is None:
            return None
        return os.path.join(staging, f"stream-{query_id}-{batch_id}")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> StagedRows:
        context = TaskContext.get()
        query_id = context.getLocalProperty(QUERY_ID_KEY) if context else None
        batch_text = context.getLocalProperty(BATCH_ID_KEY) if context else None
        batch_id = int(batch_text) if batch_text else None
        if query_id is None or batch_id is None:  # not a micro-batch: stage under a fresh name
            job_dir = self._batch_dir("job", uuid.uuid4().int)
        else:
            job_dir = self._batch_dir(query_id, batch_id)
        # Only the tasks know the batch id: they make its directory. (A task still running
        # after its batch was aborted may leave a file there; the batch's retry removes it.)
        return stage(self._options, job_dir, iterator, query_id, batch_id, create_dir=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        staged = [m for m in messages if isinstance(m, StagedRows)]
        if not staged:
            return
        query_id = staged[0].query_id
        marker = None if query_id is None else self._marker(query_id)
        try:
            if marker is not None and _marked(marker) >= batchId:
                return  # published already: this is a retry of a committed batch
            queue = open_queue(self._options)
            publish(queue, with_dedup_ids(query_id or "", batchId, staged_tables(messages)))
            if marker is not None:
                flush_local(self._options)  # the marker must not outlive unflushed messages
                with storage_errors(f"writing {marker}"):
                    smallfiles.replace_file(
                        marker,
                        json.dumps({"batch": batchId}).encode() + b"\n",
                        durable=True,
                        access=state_access(self._options),
                        make_parents=True,
                    )
        finally:
            _cleanup(messages, None if query_id is None else self._batch_dir(query_id, batchId))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        staged = [m for m in messages if isinstance(m, StagedRows)]
        query_id = staged[0].query_id if staged else None
        _cleanup(messages, None if query_id is None else self._batch_dir(query_id, batchId))

    def _marker(self, query_id: str) -> str | None:
        sinks = self._options.sink_dir()
        return None if sinks is None else os.path.join(sinks, "@" + query_id)


def _marked(marker: str) -> int:
    with storage_errors(f"reading {marker}"):
        raw = smallfiles.read_file(marker)
    return -1 if raw is None else int(json.loads(raw)["batch"])


def with_dedup_ids(
    query_id: str, batch_id: int, tables: Iterable[pa.Table]
) -> Iterator[OutgoingMessage]:
    """The batch's messages, each with a dedup id that a retry of the batch reproduces: a hash of
    the query, the batch and the message's content, and its occurrence number among identical
    messages of the batch (so identical rows stay distinct, whatever order a retry sees them in).
    A dedup id given by the writer's own `dedup_id` column is kept."""
    seen: Counter[str] = Counter()
    for table in tables:
        for message in outgoing(table):
            if message.dedup_id is not None:
                yield message
                continue
            digest = hashlib.sha256(f"{query_id}\n{batch_id}\n".encode())
            digest.update(message.body)
            for name, value in sorted(message.headers.items()):
                digest.update(f"\n{name}: {value}".encode())
            digest.update(f"\n{message.delay_s!r}\n{message.group!r}".encode())
            key = digest.hexdigest()[:32]
            yield replace(message, dedup_id=f"spark:{key}:{seen[key]}")
            seen[key] += 1
