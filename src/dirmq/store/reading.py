"""Reading a message file: one open without touching its access time, one read of the whole
file for the common small message, and one `pread` of its own for a large body.

A message file is read once or twice in its life (a get, maybe a peek), so each read costs as
few system calls as it can: `open` (O_NOATIME: no inode write per read), one `read` of up to
`_FIRST_READ` bytes that decodes a whole small file, and for a larger one an `fstat` and one
`pread` of the body, so the body is not copied out of the whole file's bytes (1x its size to
deliver, not 3x; none at all for a caller that sends it from the file: bodyfiles.py). A file
that holds another message, or fails its length or CRC check, is `CorruptMessage` (codec.py).
"""

from __future__ import annotations

import errno
import os

from dirmq.errors import CorruptMessage
from dirmq.store import bodyfiles, codec, layout
from dirmq.store.deadletters import from_system
from dirmq.store.expiry import read_deadline_s
from dirmq.store.ids import id_time_us
from dirmq.store.layout import Entry
from dirmq.store.message import Message

_FIRST_READ = 64 * 1024  # one read() takes a whole message file of up to this size


def stored_message(entry: Entry, directory: str, decoded: codec.Decoded) -> Message:
    """The message a state file holds, as it stands (no receipt: it is not being leased)."""
    deadline = entry.at_ms / 1000 if directory == layout.LEASED and entry.at_ms else None
    return Message(
        id=entry.message_id,
        body=decoded.body,
        headers=decoded.headers,
        receive_count=entry.count,
        published_at_s=id_time_us(entry.message_id) / 1e6,
        lease_deadline_s=deadline,
        # a backlog bucket (@backlog/<epoch>/<second>) holds ready messages (backlog.py); a
        # delay bucket (@delayed/<minute>) delayed ones (delays.py)
        state="ready"
        if directory.startswith(layout.BACKLOG)
        else directory.lstrip("@").partition("/")[0],
        group=decoded.system.get("Group"),
        dead=from_system(decoded.system) if len(decoded.system) > 1 else None,
        expires_at_s=read_deadline_s(decoded.system) if len(decoded.system) > 1 else None,
        priority=entry.level,
    )


_NOATIME = getattr(os, "O_NOATIME", 0)
_read_flags = os.O_RDONLY | os.O_CLOEXEC | _NOATIME


def _open_to_read(name: str, dir_fd: int | None = None) -> int:
    """Open a message file to read it, without updating its access time: a message is read
    once or twice before it is renamed or removed, nobody needs its atime, and updating it
    (relatime does, on the first read after a write or rename) dirties the inode: one more
    metadata write per message. Only the file's owner (or CAP_FOWNER) may ask for that: after
    an EPERM, this process reads without it."""
    global _read_flags
    flags = _read_flags  # one read of the global: another thread may clear the flag meanwhile
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except PermissionError as exc:
        if exc.errno != errno.EPERM or not flags & _NOATIME:
            raise
        _read_flags = flags & ~_NOATIME
        return os.open(name, flags & ~_NOATIME, dir_fd=dir_fd)


def read_at(dir_fd: int, name: str, message_id: str) -> codec.Decoded:
    """`read_message` of the file `name` in the directory open as `dir_fd`."""
    return _decode_fd(_open_to_read(name, dir_fd), message_id)


def read_message(path: str, message_id: str, body_file_over: int | None = None) -> codec.Decoded:
    """Decode the file at `path`, named for `message_id`: one holding another message (see
    codec.py) is `CorruptMessage`, like a damaged one. A body of `body_file_over` bytes or more
    is left in the file (`bodyfiles.FileBody`): only for a caller that sends it from there."""
    return _decode_fd(_open_to_read(path), message_id, body_file_over)


def _decode_fd(fd: int, message_id: str, body_file_over: int | None = None) -> codec.Decoded:
    """Decode the file open as `fd`, and close it. One read takes a whole message file of up to
    `_FIRST_READ` bytes; when that does not decode, the rest is read before deciding."""
    try:
        data = os.read(fd, _FIRST_READ)
        try:
            return codec.decode(data, message_id)
        except CorruptMessage:
            # Maybe a read cut short (a large file, or a network filesystem): read on to the
            # end, then decide.
            split = data.find(b"\n\n")
            if split >= 0 and len(data) == _FIRST_READ:
                over = body_file_over
                if over is not None:  # a caller that sends a large body from its file
                    left = bodyfiles.decode_in_file(fd, data[:split], split + 2, message_id, over)
                    if left is not None:
                        return left
                # A large file whose head we have: its body in one read of its own, so the
                # body is not a copy out of the whole file's bytes (1x its size, not 3x).
                body = _read_to_end(fd, split + 2)
                return codec.decode_parts(data[:split], body, message_id)
            rest = _read_to_end(fd, len(data))
            if not rest:
                raise
            return codec.decode(data + rest, message_id)
    finally:
        os.close(fd)


def _read_to_end(fd: int, offset: int) -> bytes:
    """The file's bytes from `offset` on, in one read of the size it has when it can be (a
    single read's bytes are returned as they are: no join, no copy)."""
    chunks = []
    size = os.fstat(fd).st_size - offset
    while chunk := os.pread(fd, max(size, 1 << 20), offset):
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
