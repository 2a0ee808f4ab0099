"""Batch reads: a snapshot of a queue's messages, consuming nothing.

path mode: the driver lists the queue's state directories once (names only: a message's id,
receive count and state are in its file name, see docs/FORMAT.md) and hands each read partition
a slice of the names, in id order. Executors read and decode the files themselves, in parallel.
A message that changed state between the listing and the read is looked up by id and shown in
its new state; one that is gone by then (acknowledged meanwhile) is left out. Nothing is renamed,
leased or written: the queue is untouched.

url mode: the server's browse call returns ready messages, oldest first, at most 1000 of them; a
queue holding more is refused rather than read partially (see docs/spark.md).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, InputPartition

from dirmq.errors import (
    CorruptMessage,
    InvalidArgument,
    MessageNotFound,
    QueueNotFound,
    storage_error,
)
from dirmq.spark.connect import local_store, open_queue
from dirmq.spark.leasing import ROWS_PER_BATCH, split
from dirmq.spark.options import DEFAULT_STATES, Options
from dirmq.spark.rows import READ_COLUMNS, Columns, messages_batch, project
from dirmq.store import Message, layout
from dirmq.store.layout import parse_entry
from dirmq.store.names import queue_path
from dirmq.store.reading import read_at, stored_message

HTTP_BROWSE_LIMIT = 1000
_DIRS = {
    "ready": layout.READY,
    "leased": layout.LEASED,
    "delayed": layout.DELAYED,
    "dead": layout.DEAD,
}


@dataclass
class FilesPartition(InputPartition):
    """Message files to read: (state directory, file name) pairs, in id order."""

    entries: list[tuple[str, str]]


@dataclass
class BrowsedPartition(InputPartition):
    """Messages the driver already read over HTTP, as Arrow IPC."""

    data: bytes


class DirmqSnapshotReader(DataSourceReader):
    def __init__(self, options: Options, columns: Columns = READ_COLUMNS) -> None:
        self._options = options
        self._states = options.states or DEFAULT_STATES
        self._columns = columns

    def partitions(self) -> list[InputPartition]:
        options = self._options
        if options.path is None:
            return [self._browse()]
        if not local_store(options.path).exists(options.queue):  # an error, not an empty result
            raise QueueNotFound(f"queue {options.queue!r} does not exist under {options.path}")
        entries = list_entries(queue_path(options.path, options.queue), self._states)
        if not entries:
            return [FilesPartition([])]
        result: list[InputPartition] = []
        offset = 0
        for size in split(len(entries), options.partitions_for(len(entries))):
            result.append(FilesPartition(entries[offset : offset + size]))
            offset += size
        return result

    def _browse(self) -> BrowsedPartition:
        if self._options.states not in (None, ("ready",)):
            raise InvalidArgument(
                "over `url`, a batch read sees ready messages only (the server's browse call): "
                "set the option states=ready, or read through `path`"
            )
        queue = open_queue(self._options)
        messages = list(queue.browse(HTTP_BROWSE_LIMIT))
        if len(messages) >= HTTP_BROWSE_LIMIT and queue.stats().ready > len(messages):
            raise InvalidArgument(
                f"queue {queue.name!r} holds more than {HTTP_BROWSE_LIMIT} ready messages, the "
                "most a dirmq server returns to one browse call: read it through `path`"
            )
        table = pa.Table.from_batches([messages_batch(messages, columns=self._columns)])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return BrowsedPartition(sink.getvalue().to_pybytes())

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, BrowsedPartition):
            for batch in pa.ipc.open_stream(pa.py_buffer(partition.data)):
                yield project(batch, self._columns)
            return
        if not isinstance(partition, FilesPartition):
            raise InvalidArgument(f"not a dirmq partition: {partition!r}")
        assert self._options.path is not None
        directory = queue_path(self._options.path, self._options.queue)
        dir_fds: dict[str, int] = {}
        messages: list[Message] = []
        try:
            for state_dir, name in partition.entries:
                if state_dir not in dir_fds:
                    dir_fds[state_dir] = _open_dir(os.path.join(directory, state_dir))
                message = self._read_one(dir_fds[state_dir], state_dir, name)
                if message is not None:
                    messages.append(message)
                if len(messages) == ROWS_PER_BATCH:
                    yield messages_batch(messages, columns=self._columns)
                    messages = []
        finally:
            for fd in dir_fds.values():
                if fd >= 0:
                    os.close(fd)
        if messages:
            yield messages_batch(messages, columns=self._columns)

    def _read_one(self, dir_fd: int, state_dir: str, name: str) -> Message | None:
        entry = parse_entry(name)
        assert entry is not None
        try:
            if dir_fd < 0:
                raise FileNotFoundError(name)
            decoded = read_at(dir_fd, name, entry.message_id)
        except FileNotFoundError:
            return self._moved(entry.message_id)
        except CorruptMessage:  # damaged, or another message's content (codec.py: Dirmq-Id)
            return None  # never delivered either; `dirmq fsck` reports it
        except OSError as exc:
            raise storage_error(exc, f"reading a message of queue {self._options.queue!r}") from exc
        return stored_message(entry, state_dir, decoded)

    def _moved(self, message_id: str) -> Message | None:
        assert self._options.path is not None
        queue = local_store(self._options.path).queue(self._options.queue)
        try:
            message = queue.peek(message_id)
        except (MessageNotFound, CorruptMessage):  # damaged: never delivered, as above
            return None
        return message if message.state in self._states else None


def _open_dir(path: str) -> int:
    """A descriptor of a state directory, to open its files by name alone (-1 if it is gone)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return -1


def list_entries(directory: str, states: tuple[str, ...]) -> list[tuple[str, str]]:
    """(state directory, file name) of every message in `states`, in id (FIFO) order."""
    found: list[tuple[str, str, str]] = []
    for state in states:
        state_dir = _DIRS[state]
        try:
            names = os.listdir(os.path.join(directory, state_dir))
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise storage_error(exc, f"listing {directory}") from exc
        for name in names:
            entry = parse_entry(name)
            if entry is not None:
                found.append((entry.message_id, state_dir, name))
    found.sort()
    return [(state_dir, name) for _id, state_dir, name in found]
