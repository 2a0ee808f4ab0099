"""Batch reads: a snapshot of a queue's messages, consuming nothing.

path mode: the driver lists the queue's state directories once (names only: a message's id,
receive count and state are in its file name, see docs/FORMAT.md) and hands each read partition
a slice of the names, in id order. Executors read and decode the files themselves, in parallel.
A message that changed state between the listing and the read is looked up by id and shown in
its new state; one that is gone by then (acknowledged meanwhile) is left out. Nothing is renamed,
leased or written: the queue is untouched.

url mode: the server's browse call returns ready messages, oldest first, a page of at most 1000
after a given id. The driver pages through the queue once, keeping only the ids, and cuts them
into ranges of near-equal counts; each read partition pages through its own range (after the
last id of the previous range, up to its own last id), so bodies cross the network to the
executors in parallel, and the driver holds ids, not messages.
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
from dirmq.spark.rows import READ_COLUMNS, Columns, messages_batch
from dirmq.store import Message, backlog, delays, layout
from dirmq.store.layout import parse_entry
from dirmq.store.names import queue_path
from dirmq.store.reading import read_at, stored_message

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
    """Ready messages to browse over HTTP: the `count` after the id `after` (None: from the
    head) up to the id `last`, inclusive."""

    after: str | None
    last: str
    count: int


class DirmqSnapshotReader(DataSourceReader):
    def __init__(self, options: Options, columns: Columns = READ_COLUMNS) -> None:
        self._options = options
        self._states = options.states or DEFAULT_STATES
        self._columns = columns

    def partitions(self) -> list[InputPartition]:
        options = self._options
        if options.path is None:
            return self._browse()
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

    def _browse(self) -> list[InputPartition]:
        if self._options.states not in (None, ("ready",)):
            raise InvalidArgument(
                "over `url`, a batch read sees ready messages only (the server's browse call): "
                "set the option states=ready, or read through `path`"
            )
        ids = [message.id for message in open_queue(self._options).browse()]
        if not ids:
            return [BrowsedPartition(None, "", 0)]
        result: list[InputPartition] = []
        offset = 0
        for size in split(len(ids), self._options.partitions_for(len(ids))):
            after = ids[offset - 1] if offset else None
            result.append(BrowsedPartition(after, ids[offset + size - 1], size))
            offset += size
        return result

    def _read_browsed(self, partition: BrowsedPartition) -> Iterator[pa.RecordBatch]:
        """The range's messages still ready (one acknowledged meanwhile is left out)."""
        messages: list[Message] = []
        queue = open_queue(self._options)
        for message in queue.browse(partition.count, after=partition.after):
            if message.id > partition.last:
                break
            messages.append(message)
            if len(messages) == ROWS_PER_BATCH:
                yield messages_batch(messages, columns=self._columns)
                messages = []
        if messages:
            yield messages_batch(messages, columns=self._columns)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, BrowsedPartition):
            yield from self._read_browsed(partition)
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
        if state == "delayed":  # in the buckets of their due minutes (and flat, format 4)
            for bucket, name in delays.names(directory):
                found.append((name[: layout.ID_LENGTH], bucket, name))
            continue
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
        if state == "ready":  # and those behind @ready (a deep queue's backlog)
            for bucket, name in backlog.names(directory):
                found.append((name[: layout.ID_LENGTH], bucket, name))
    found.sort()
    return [(state_dir, name) for _id, state_dir, name in found]
