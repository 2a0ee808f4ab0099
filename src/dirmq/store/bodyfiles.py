"""Large bodies left in their message file when a message is leased, for a caller that sends
them from there (the server's plain GET: `sendfile`) instead of holding them in memory.

Opt-in, per call: inside `bodies_by_file(over_bytes)` (this thread only) a message a get leases
(files.py, `open_lease`: nothing else the store reads meanwhile, such as a dead letter it
rewrites) whose body has at least `over_bytes` comes back with a `FileBody` as its `body`: an empty
`bytes` that stands for the body, with a descriptor of its own of the message's file, the
body's offset and size. Its length and CRC are checked as for any read (reading the file a
megabyte at a time), so a corrupt file is still never delivered. The descriptor keeps the bytes
whatever happens to the name meanwhile (an ack, an expiry, a purge): a file this large is never
recycled (pool.py keeps only small ones), so what it holds stays what was checked. Whoever gets a
`FileBody` reads it (`read`) or sends it and `close`s it; one dropped is closed when collected.

Outside the block nothing changes: every other reader gets `bytes`. Code that cannot tell a
`FileBody` from a body must not call a get inside the block.
"""

from __future__ import annotations

import contextlib
import os
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from dirmq.store import codec

CHECK_CHUNK_BYTES = 1024 * 1024  # read this much at a time to check a body left in its file

T = TypeVar("T")


class _Local(threading.local):
    # A class default: a thread that never set it reads None without the AttributeError
    # a bare `threading.local` raises and `getattr` catches (a get reads it per message).
    over: int | None = None


_local = _Local()


@contextlib.contextmanager
def bodies_by_file(over_bytes: int) -> Iterator[None]:
    """Gets made in this thread within the block leave bodies of `over_bytes` or more in their
    files (`FileBody`)."""
    before = _local.over
    _local.over = over_bytes
    try:
        yield
    finally:
        _local.over = before


def call_by_file(over_bytes: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` inside `bodies_by_file(over_bytes)`, without a generator's cost
    (the server's every plain GET comes this way)."""
    before = _local.over
    _local.over = over_bytes
    try:
        return fn(*args, **kwargs)
    finally:
        _local.over = before


def threshold() -> int | None:
    """The size from which bodies stay in their files in this thread now (None: never)."""
    return _local.over


class FileBody(bytes):
    """An empty `bytes` standing for a body of `size` bytes at `offset` in the file open as
    `fd` (this object's own descriptor)."""

    fd: int
    offset: int
    size: int

    def __new__(cls, fd: int, offset: int, size: int) -> FileBody:
        body = super().__new__(cls, b"")
        body.fd, body.offset, body.size = fd, offset, size
        return body

    def read(self) -> bytes:
        """The body's bytes, all in memory (for a caller that cannot send from the file)."""
        chunks: list[bytes] = []
        offset, end = self.offset, self.offset + self.size
        while offset < end:
            chunk = os.pread(self.fd, end - offset, offset)
            if not chunk:
                raise OSError(f"a message file ended {end - offset} bytes before its body did")
            chunks.append(chunk)
            offset += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"FileBody(fd={self.fd}, offset={self.offset}, size={self.size})"


def decode_in_file(
    fd: int, head: bytes, offset: int, message_id: str, over_bytes: int
) -> codec.Decoded | None:
    """The message in the file open as `fd` whose head (without the blank line) is `head` and
    whose body starts at `offset`, its body left in the file (`FileBody`, a descriptor of its
    own) when it has at least `over_bytes`; None if it is smaller. `CorruptMessage` as
    `codec.decode`."""
    size = os.fstat(fd).st_size - offset
    if size < over_bytes:
        return None

    def crc() -> int:
        # One buffer read into again and again: no allocation (and its page faults) a chunk.
        buffer = bytearray(min(CHECK_CHUNK_BYTES, size))
        view = memoryview(buffer)
        value, at, end = 0, offset, offset + size
        while at < end:
            got = os.preadv(fd, [view[: min(len(buffer), end - at)]], at)
            if not got:
                break  # cut short meanwhile: the CRC then tells
            value = zlib.crc32(view[:got], value)
            at += got
        return value

    headers, system = codec.decode_head(head, size, crc, message_id)
    return codec.Decoded(headers, FileBody(os.dup(fd), offset, size), system)
