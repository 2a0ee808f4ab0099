"""A message file written as its body arrives (a large upload), then published like any other.

Theory of operation. `StreamedFile.create` makes the message's file in @tmp (an unnamed
O_TMPFILE inode where the filesystem has them, so a crash leaves nothing; else a named temp that
recovery.py removes once its writer is dead) and writes its head at once: the header lines
`codec.encode` writes, in its order, with the two values known only at the end, `Body-CRC32` and
`Dirmq-Id`, as placeholders of their fixed widths. `write` appends body bytes and folds them into
the CRC, so nothing but the pieces being written is held; for a `writethrough` publish it asks
the kernel to start writing them to the disk (`sync_file_range`, every `WRITEBACK_BYTES`): the
final fsync then waits for the last few megabytes rather than the whole body, so the disk works
while the body still arrives (a file written whole and then fsynced, as `dd conv=fsync` does,
leaves it idle until the end).
`publish` checks that exactly
`Content-Length` bytes came, mints the id (now: FIFO is publish order, as for every message),
writes it and the CRC over their placeholders (`pwrite`), and hands the file to the queue's own
commit (`Publisher._commit`: fsync, rename into @ready or @delayed, directory fsync, as the
durability says). The file is then byte for byte what `codec.encode` makes of the same message;
`discard` leaves nothing behind.

Not for every publish: the caller streams only a message with no dedup id into a queue without
a capacity (a capacity token is taken with the id and named in the file's head), on a local
filesystem (the shared mode writes beside the final name, which is not known until the end).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import threading
import zlib
from collections.abc import Mapping, Sequence

from dirmq.errors import InvalidArgument, MessageTooLarge, QueueNotFound, storage_error
from dirmq.store import backlog, codec, delays, layout
from dirmq.store.bounds import check_optional_seconds
from dirmq.store.config import Durability
from dirmq.store.filebase import now_ms
from dirmq.store.fsio import PendingFile, create_pending
from dirmq.store.ids import new_id
from dirmq.store.queue import Queue

_ID_PLACEHOLDER = "0" * 16 + "-" + "0" * 12  # an id's width (ids.py), overwritten at publish
_CRC_PLACEHOLDER = "00000000"
WRITEBACK_BYTES = 4 * 1024 * 1024  # written bytes handed to the disk at a time
_IOV_MAX = 1024  # pieces one writev takes (Linux)
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages, without waiting

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing `length` bytes at `offset` to the disk (no wait; a
    hint: where it is refused, the final fsync does it all)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


def _write_pieces(fd: int, pieces: Sequence[bytes | memoryview]) -> None:
    """All of `pieces`, in order, in as few `writev` calls as the kernel takes them."""
    views = [memoryview(p) for p in pieces if len(p)]
    while views:
        written = os.writev(fd, views[:_IOV_MAX])
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def streamable(queue: Queue) -> bool:
    """Whether a message for `queue` may be written as it arrives (see the module docstring)."""
    files = queue._files
    return queue.config.capacity is None and not files.context.shared


def head_of(length: int, headers: Mapping[str, str], group: str | None) -> tuple[bytes, int, int]:
    """The head `codec.encode` writes for a body of `length` bytes, with placeholders for the
    CRC and the id: (head, offset of the CRC's 8 hex digits, offset of the id)."""
    lines = [
        f"Dirmq-Format: {codec.FORMAT_VERSION}",
        f"Content-Length: {length}",
        f"Body-CRC32: {_CRC_PLACEHOLDER}",
        f"Dirmq-{codec.ID}: {_ID_PLACEHOLDER}",
    ]
    if group is not None:
        lines.append(f"Dirmq-Group: {group}")
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    text = "\n".join(lines) + "\n\n"
    head = text.encode("utf-8")
    if len(head) > codec.MAX_HEADER_BYTES:
        limit = codec.MAX_HEADER_BYTES
        raise InvalidArgument(f"headers take {len(head)} bytes; the limit is {limit}")
    crc_at = head.index(b"Body-CRC32: ") + len(b"Body-CRC32: ")
    id_at = head.index(b"Dirmq-Id: ") + len(b"Dirmq-Id: ")
    return head, crc_at, id_at


class StreamedFile:
    """One message's file being written as its body arrives. `write` is for one thread at a
    time (the server's upload writes its pieces in order, one after the other); `publish` and
    `discard` may race from two threads: the first takes the file, the other finds it gone."""

    def __init__(
        self,
        queue: Queue,
        pending: PendingFile,
        length: int,
        group: str | None,
        offsets: tuple[int, int],
        head_size: int,
        durability: Durability | None,
    ) -> None:
        self.queue = queue
        self.durability = durability  # None: the queue's, when it is published
        self.length = length  # the body's, from the request's Content-Length
        self.written = 0
        self._head_size = head_size
        self._flushed = 0  # the file's bytes up to here are handed to the disk
        # Early writeback only where the publish will wait for the disk anyway.
        level = durability or queue.config.durability
        self._write_back = level is Durability.WRITETHROUGH
        self._pending: PendingFile | None = pending
        self._taking = threading.Lock()
        self._group = group
        self._crc = 0
        self._crc_at, self._id_at = offsets

    @classmethod
    def create(
        cls,
        queue: Queue,
        length: int,
        headers: Mapping[str, str],
        group: str | None = None,
        durability: Durability | str | None = None,
    ) -> StreamedFile:
        """The file of a message of `length` body bytes, its head written, to be published as
        `durability` says (None: the queue's). Raises what a publish of the same message would
        (`MessageTooLarge`, `InvalidArgument`, a missing queue), before anything is written."""
        level = None if durability is None else Durability(durability)
        config = queue.config
        if length > config.max_message_bytes:
            raise MessageTooLarge.for_queue(queue.name, length, config.max_message_bytes)
        codec.check_headers(headers)
        codec.check_label("group", group)
        head, crc_at, id_at = head_of(length, headers, group)
        files = queue._files
        tmp_dir = files.dir[layout.TMP]
        try:
            # The final name is not known yet (the id is minted at publish): set then.
            pending = create_pending(tmp_dir, layout.tmp_name(new_id()), "", head, files.access)
            pending.data = None  # its body is written later: no journal record (journal.py)
        except FileNotFoundError:
            raise QueueNotFound.missing(queue.name) from None
        except OSError as exc:
            raise storage_error(exc, f"writing a message to queue {queue.name!r}") from exc
        return cls(queue, pending, length, group, (crc_at, id_at), len(head), level)

    def write(self, pieces: Sequence[bytes | memoryview]) -> None:
        """Append body bytes, the pieces in order (blocking: call it off an event loop). More
        than `length` in all is refused (`InvalidArgument`), and the file discarded."""
        pending = self._pending
        if pending is None:
            raise InvalidArgument("this message's file was published or discarded already")
        size = sum(len(piece) for piece in pieces)
        if self.written + size > self.length:
            self.discard()
            raise InvalidArgument(f"the body is longer than its Content-Length of {self.length}")
        crc = self._crc
        for piece in pieces:  # before the write: a piece is hot in the cache now
            crc = zlib.crc32(piece, crc)
        try:
            _write_pieces(pending.fd, pieces)
            self.written += size
            end = self._head_size + self.written
            if self._write_back and end - self._flushed >= WRITEBACK_BYTES:
                _start_writeback(pending.fd, self._flushed, end - self._flushed)
                self._flushed = end
        except OSError as exc:
            self.discard()
            raise storage_error(exc, f"writing a message to queue {self.queue.name!r}") from exc
        self._crc = crc

    def publish(self, delay_s: float | None = None) -> str:
        """Seal the file (its CRC and a fresh id written in place) and publish it as
        `Queue.put` would (`delay_s` None: the queue's default delay); its id. On any failure
        the file is discarded and nothing is published."""
        pending = self._take()
        if pending is None:
            raise InvalidArgument("this message's file was published or discarded already")
        queue = self.queue
        try:
            if self.written != self.length:
                raise InvalidArgument(
                    f"the body ended after {self.written} of its {self.length} bytes"
                )
            check_optional_seconds("delay_s", delay_s)
            publisher = queue._publisher
            view = queue._view
            config = view.config
            level = self.durability or config.durability
            message_id = new_id()
            try:
                os.pwrite(pending.fd, b"%08x" % self._crc, self._crc_at)
                os.pwrite(pending.fd, message_id.encode("ascii"), self._id_at)
            except OSError as exc:
                raise storage_error(exc, f"writing a message to queue {queue.name!r}") from exc
            pending.final_path = self._final_path(message_id, delay_s, config.delay_s)
            relative = os.path.relpath(os.path.dirname(pending.final_path), view.path)
            durable = config.durability is not Durability.MEMORY
            name = os.path.basename(pending.final_path)
            if backlog.is_bucket_dir(relative):
                pending.make_dir = functools.partial(queue._files.backlog.remake, name, durable)
            elif delays.is_bucket_dir(relative):  # a consumer may remove a bucket of the past
                due = delays.due_of(name)
                assert due is not None
                remake = queue._files.delay_buckets.remake
                pending.make_dir = functools.partial(remake, due, durable)
            publisher._commit([pending], level, config)
        except BaseException:
            pending.discard()
            raise
        with view.lock:
            # As `Publisher._publish_files`: a polled index hears nothing of our own rename.
            index = view.index
            if index is not None and view.polling():
                directory, _, name = os.path.relpath(pending.final_path, view.path).rpartition("/")
                index.add(directory, name)
        return message_id

    def _final_path(self, message_id: str, delay_s: float | None, default_delay_s: float) -> str:
        """Where `Publisher._write_tmp` puts the same message: @delayed when it is delayed."""
        files = self.queue._files
        delay_s = default_delay_s if delay_s is None else delay_s
        tag = None if self._group is None else layout.group_tag(self._group)
        if delay_s > 0:  # into the bucket of its due minute (delays.py)
            due_ms = now_ms() + round(delay_s * 1000)
            name = layout.timed_name(message_id, 0, due_ms, tag)
            durable = self.queue._view.config.durability is not Durability.MEMORY
            return f"{files.delay_buckets.prepare(due_ms, durable)}/{name}"
        name = layout.ready_name(message_id, 0, tag)
        index = self.queue._view.index
        if files.backlog.room(None if index is None else len(index.ready)) > 0:
            files.backlog.published_into_ready(1)
            return f"{files.dir[layout.READY]}/{name}"
        # behind a long @ready, as every publish (backlog.py)
        durable = self.queue._view.config.durability is not Durability.MEMORY
        return f"{files.backlog.prepare(name, durable)}/{name}"

    def discard(self) -> None:
        """Remove the unpublished file (idempotent; a published one stays)."""
        pending = self._take()
        if pending is not None:
            pending.discard()

    def _take(self) -> PendingFile | None:
        with self._taking:
            pending, self._pending = self._pending, None
        return pending


__all__ = ["StreamedFile", "head_of", "streamable"]
