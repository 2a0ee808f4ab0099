"""A message file written as its body arrives (a large upload), then published like any other.

Theory of operation. `StreamedFile.create` makes the message's file in @tmp (an unnamed
O_TMPFILE inode where the filesystem has them, so a crash leaves nothing; else a named temp that
recovery.py removes once its writer is dead) and writes its head at once: the header lines
`codec.encode` writes, in its order, with the values known only at the end, `Body-CRC32`,
`Dirmq-Id` and a time to live's `Dirmq-Expires`, as placeholders of their fixed widths. `write`
appends body bytes and folds them into the CRC, so nothing but the pieces being written is
held; for a `writethrough` publish it asks the kernel to start writing them to the disk
(`sync_file_range`, every `WRITEBACK_BYTES`): the final fsync then waits for the last few
megabytes rather than the whole body, so the disk works while the body still arrives (a file
written whole and then fsynced, as `dd conv=fsync` does, leaves it idle until the end).
`publish` checks that exactly `Content-Length` bytes came, mints the id (now: FIFO is publish
order, as for every message), writes it, the CRC and the deadline over their placeholders
(`pwrite`), and hands the file to the queue's own commit (`Publisher._commit`: fsync, rename
into @ready, its level's backlog bucket or @delayed, directory fsync, as the durability says).
The file is then byte for byte what `codec.encode` makes of the same message; `discard` leaves
nothing behind.

A priority is the `^<level>` of the name, chosen at publish like the rest of the name. A time to
live (the publish's own, else the queue's `message_ttl_s` when the upload begins: the head needs
its line then) counts from the publish, as every message's does (expiry.py): its deadline is
written at publish, not when the upload began, so a slow upload does not eat into it. The
placeholder is as wide as the deadline would be at the start; the one written at publish is
zero-padded to it (only a clock set back across a power of ten makes it narrower; one past
10^13 ms, in the year 2286, is needed to make it wider, then it is the largest that fits).

Not for every publish: the caller streams only a message with no dedup id into a queue without
a capacity (a capacity token is taken with the id and named in the file's head), on a local
filesystem (the shared mode writes beside the final name, which is not known until the end).
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dirmq.errors import InvalidArgument, MessageTooLarge, QueueNotFound, storage_error
from dirmq.store import backlog, codec, layout
from dirmq.store.bounds import check_optional_seconds, check_seconds
from dirmq.store.clock import due_after_ms, now_ns
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.expiry import EXPIRES
from dirmq.store.fsio import PendingFile, create_pending
from dirmq.store.ids import new_id
from dirmq.store.libc import LIBC_PATH
from dirmq.store.priorities import check_priority
from dirmq.store.queue import Queue

_ID_PLACEHOLDER = "0" * 16 + "-" + "0" * 12  # an id's width (ids.py), overwritten at publish
_CRC_PLACEHOLDER = "00000000"
WRITEBACK_BYTES = 4 * 1024 * 1024  # written bytes handed to the disk at a time
_IOV_MAX = 1024  # pieces one writev takes (Linux)
_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages, without waiting

_libc = ctypes.CDLL(LIBC_PATH, use_errno=True)
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


@dataclass(frozen=True, slots=True)
class Head:
    """A streamed file's head (`head_of`): its bytes, and where the values written at publish
    go (offsets into it; `expires_at` None: no time to live, `expires_width` digits else)."""

    data: bytes
    crc_at: int
    id_at: int
    expires_at: int | None = None
    expires_width: int = 0


def head_of(
    length: int, headers: Mapping[str, str], group: str | None, expires_width: int = 0
) -> Head:
    """The head `codec.encode` writes for a body of `length` bytes, with placeholders for the
    CRC, the id and (`expires_width` > 0) a deadline of that many digits."""
    lines = [
        f"Dirmq-Format: {codec.FORMAT_VERSION}",
        f"Content-Length: {length}",
        f"Body-CRC32: {_CRC_PLACEHOLDER}",
        f"Dirmq-{codec.ID}: {_ID_PLACEHOLDER}",
    ]
    if group is not None:  # system headers in `Publisher._encode`'s order
        lines.append(f"Dirmq-Group: {group}")
    expires_label = f"Dirmq-{EXPIRES}: "
    if expires_width:
        lines.append(expires_label + "0" * expires_width)
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    text = "\n".join(lines) + "\n\n"
    data = text.encode("utf-8")
    if len(data) > codec.MAX_HEADER_BYTES:
        limit = codec.MAX_HEADER_BYTES
        raise InvalidArgument(f"headers take {len(data)} bytes; the limit is {limit}")
    expires_at = None
    if expires_width:
        expires_at = data.index(b"\n" + expires_label.encode()) + 1 + len(expires_label)
    return Head(
        data,
        data.index(b"Body-CRC32: ") + len(b"Body-CRC32: "),
        data.index(b"Dirmq-Id: ") + len(b"Dirmq-Id: "),
        expires_at,
        expires_width,
    )


def _deadline_ms(at_ns: int, ttl_ns: int) -> int:
    """A time to live's deadline, as expiry.deadline_ms reckons it: rounded down once."""
    return (at_ns + ttl_ns) // 1_000_000


def _deadline_text(deadline_ms: int, width: int) -> bytes:
    """`deadline_ms` in exactly `width` digits (zero-padded; the largest that fits if wider,
    which no clock before the year 2286 makes: see the module docstring)."""
    return b"%0*d" % (width, min(deadline_ms, 10**width - 1))


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
        head: Head,
        durability: Durability | None,
        priority: int = 0,
        ttl_ns: int | None = None,
    ) -> None:
        self.queue = queue
        self.durability = durability  # None: the queue's, when it is published
        self.length = length  # the body's, from the request's Content-Length
        self.priority = priority
        self.written = 0
        self._head = head
        self._ttl_ns = ttl_ns  # the deadline is the publish's time plus this
        self._flushed = 0  # the file's bytes up to here are handed to the disk
        # Early writeback only where the publish will wait for the disk anyway.
        level = durability or queue.config.durability
        self._write_back = level is Durability.WRITETHROUGH
        self._pending: PendingFile | None = pending
        self._taking = threading.Lock()
        self._group = group
        self._crc = 0

    @classmethod
    def create(
        cls,
        queue: Queue,
        length: int,
        headers: Mapping[str, str],
        group: str | None = None,
        durability: Durability | str | None = None,
        *,
        priority: int = 0,
        ttl_s: float | None = None,
    ) -> StreamedFile:
        """The file of a message of `length` body bytes, its head written, to be published as
        `durability` says (None: the queue's), at `priority`, with a time to live of `ttl_s`
        (None: the queue's `message_ttl_s` now). Raises what a publish of the same message
        would (`MessageTooLarge`, `InvalidArgument`, a missing queue), before anything is
        written."""
        level = None if durability is None else Durability(durability)
        config = queue.config
        if length > config.max_message_bytes:
            raise MessageTooLarge.for_queue(queue.name, length, config.max_message_bytes)
        codec.check_headers(headers)
        codec.check_label("group", group)
        if priority:
            check_priority(queue.name, priority, config)
        if ttl_s is not None:
            check_seconds("ttl_s", ttl_s, minimum=0.001)
        else:
            ttl_s = config.message_ttl_s
        ttl_ns = None if ttl_s is None else round(ttl_s * 1e9)
        width = 0 if ttl_ns is None else len(str(_deadline_ms(now_ns(), ttl_ns)))
        head = head_of(length, headers, group, width)
        files = queue._files
        tmp_dir = files.dir[layout.TMP]
        try:
            # The final name is not known yet (the id is minted at publish): set then.
            pending = create_pending(
                tmp_dir, layout.tmp_name(new_id()), "", head.data, files.access
            )
            pending.data = None  # its body is written later: no journal record (journal.py)
        except FileNotFoundError:
            raise QueueNotFound.missing(queue.name) from None
        except OSError as exc:
            raise storage_error(exc, f"writing a message to queue {queue.name!r}") from exc
        return cls(queue, pending, length, group, head, level, priority, ttl_ns)

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
            end = len(self._head.data) + self.written
            if self._write_back and end - self._flushed >= WRITEBACK_BYTES:
                _start_writeback(pending.fd, self._flushed, end - self._flushed)
                self._flushed = end
        except OSError as exc:
            self.discard()
            raise storage_error(exc, f"writing a message to queue {self.queue.name!r}") from exc
        self._crc = crc

    def publish(self, delay_s: float | None = None) -> str:
        """Seal the file (its CRC, a fresh id and its deadline written in place) and publish
        it as `Queue.put` would (`delay_s` None: the queue's default delay); its id. On any
        failure the file is discarded and nothing is published."""
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
            view = queue._view
            config = view.config
            if self.priority:  # the queue's levels may have changed during the upload
                check_priority(queue.name, self.priority, config)
            message_id = new_id()
            self._seal(pending, message_id, now_ns())
            spilled = self._place(pending, message_id, delay_s, config)
            queue._publisher._commit([pending], self.durability or config.durability, config)
        except BaseException:
            pending.discard()
            raise
        self._published(pending, spilled)
        return message_id

    def _seal(self, pending: PendingFile, message_id: str, at_ns: int) -> None:
        """The values known only now, written over their placeholders."""
        head = self._head
        try:
            os.pwrite(pending.fd, b"%08x" % self._crc, head.crc_at)
            os.pwrite(pending.fd, message_id.encode("ascii"), head.id_at)
            if head.expires_at is not None and self._ttl_ns is not None:
                deadline_ms = _deadline_ms(at_ns, self._ttl_ns)
                deadline = _deadline_text(deadline_ms, head.expires_width)
                os.pwrite(pending.fd, deadline, head.expires_at)
        except OSError as exc:
            raise storage_error(exc, f"writing a message to queue {self.queue.name!r}") from exc

    def _place(
        self,
        pending: PendingFile,
        message_id: str,
        delay_s: float | None,
        config: QueueConfig,
    ) -> bool:
        """Set where `Publisher._write_tmp` puts the same message (@delayed's bucket when it is
        delayed; @ready, or its level's backlog bucket behind a long @ready) and how its
        directory is made again if a consumer removes it first; whether it goes to the
        backlog."""
        files = self.queue._files
        delay_s = config.delay_s if delay_s is None else delay_s
        tag = None if self._group is None else layout.group_tag(self._group)
        level = self.priority
        durable = config.durability is not Durability.MEMORY
        if delay_s > 0:  # into the bucket of its due minute (delays.py)
            due_ms = due_after_ms(delay_s)
            name = layout.timed_name(message_id, 0, due_ms, tag, None, level)
            pending.final_path = f"{files.delay_buckets.prepare(due_ms, durable)}/{name}"
            pending.make_dir = functools.partial(files.delay_buckets.remake, due_ms, durable)
            return False
        name = layout.ready_name(message_id, 0, tag, level)
        index = self.queue._view.index
        count = None if index is None else index.ready_count(level)
        if files.backlog.room(count, level, config.priority_levels) > 0:
            pending.final_path = f"{files.dir[layout.READY]}/{name}"
            return False
        pending.final_path = f"{files.backlog.prepare(name, durable)}/{name}"
        pending.make_dir = functools.partial(files.backlog.remake, name, durable)
        return True

    def _published(self, pending: PendingFile, spilled: bool) -> None:
        """What `Publisher._publish_once` keeps once a file is published, for this one."""
        view = self.queue._view
        with view.lock:
            index = view.index
            # As `Publisher._publish_once`: a polled index hears nothing of our own rename,
            # and the index may not hear of a backlog tree made now.
            if index is not None and view.polling():
                directory, _, name = os.path.relpath(pending.final_path, view.path).rpartition("/")
                index.add(directory, name)
            if index is not None and spilled:
                index.backlog.add(backlog.tree_key(os.path.basename(pending.final_path)))
        files = self.queue._files
        if spilled:
            files.backlog.spilled(self.priority, pending.final_path)
        elif pending.final_path.startswith(f"{files.dir[layout.READY]}/"):
            files.backlog.published_into_ready(1, self.priority)

    def discard(self) -> None:
        """Remove the unpublished file (idempotent; a published one stays)."""
        pending = self._take()
        if pending is not None:
            pending.discard()

    def _take(self) -> PendingFile | None:
        with self._taking:
            pending, self._pending = self._pending, None
        return pending


__all__ = ["Head", "StreamedFile", "head_of", "streamable"]
