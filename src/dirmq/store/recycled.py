"""What makes a retired message file fit to recycle (pool.py): its size, its blanking, the space.

Only files of at most `MAX_RECYCLED_BYTES` are kept, at most `DEFAULT_POOL_FILES` in a queue's
shared pool. A retired file is blanked (overwritten with zeros, `blank`) before a put may take
it: an acknowledged message is not left readable, and a file found blank (`is_blank`) is one a
dead process had finished with.

Space first. While the filesystem is short of space or inodes (under `SHORT_FREE_FRACTION`
free, `space_short`), a retired file is unlinked instead: at a full disk, draining a queue must
give its space back, not park it in `@free`.
"""

from __future__ import annotations

import errno
import os

from dirmq.store.fsio import DirHandle

MAX_RECYCLED_BYTES = 64 * 1024
DEFAULT_POOL_FILES = 1024
SHORT_FREE_FRACTION = 0.05  # less free space or inodes than this: retired files are unlinked
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}

_ZEROS = memoryview(bytes(MAX_RECYCLED_BYTES))  # what a retired file is overwritten with


def blank(name: str, size: int, directory: DirHandle) -> None:
    """Overwrite the first `size` bytes of file `name` in `directory` with zeros (its length
    stays: a later put overwrites it, as `overwrite_pending` expects).

    Why zeros and not a truncate: on this project's ext4 (mounted with `discard`) truncating a
    file whose blocks are allocated costs 60-70 µs (the blocks are freed, then allocated again
    by the next put, which gets slower too), while this open + pwrite + close of a page that
    is almost always cached (the consumer has just read it) costs ~2.5 µs."""
    if size == 0:
        return
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=directory.fd)
    try:
        done = os.pwrite(fd, _ZEROS[:size], 0)
        while done < size:  # rare (a signal): no loop on the common path
            done += os.pwrite(fd, _ZEROS[done:size], done)
    finally:
        os.close(fd)


def is_blank(path: str, size: int) -> bool:
    """Whether the file at `path` holds nothing but zeros (it was blanked when retired)."""
    with open(path, "rb") as f:
        return f.read(MAX_RECYCLED_BYTES + 1) == _ZEROS[:size]


def unlink_quietly(name: str, directory: DirHandle) -> None:
    try:
        os.unlink(name, dir_fd=directory.fd)
    except OSError:
        pass


def space_short(path: str) -> bool:
    """Whether the filesystem holding `path` has less than `SHORT_FREE_FRACTION` of its space
    or of its inodes free (for this user: `f_bavail`). False when that cannot be told."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    if st.f_bavail < st.f_blocks * SHORT_FREE_FRACTION:
        return True
    return bool(st.f_files) and st.f_favail < st.f_files * SHORT_FREE_FRACTION
