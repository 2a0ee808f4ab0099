"""Which creation of a queue a directory is: its incarnation, named in each commit journal record
(journal 2; docs/FORMAT.md, "The commit journal").

A queue deleted and created again has the same name and new directories. A record named its
queue by name only, so a replay after a machine crash wrote the deleted queue's messages into
its successor. The incarnation is its `@ready/` directory's inode number and birth time
(`statx`): made when the queue is created, renamed away when it is deleted, never replaced in
between. The inode number alone does not do: ext4 gives a directory made just after another
was removed the same number. Where the filesystem keeps no birth time it is 0, and a queue
created again whose `@ready/` got its predecessor's inode number is taken for it. So is one
whose predecessor was created in the same clock tick: a birth time is the kernel's coarse
clock (a tick of 1-4 ms: a directory made, removed and made again at once gets the same
inode and birth time three times in four on ext4), so a queue created, deleted and created
again within a few milliseconds is one incarnation.

A birth time of 0 is unknown, not another: a process with no `statx` (glibc before 2.28:
CentOS 7, Amazon Linux 2) names the inode alone for a queue whose birth time another reads,
and so may a kernel booted after a crash that reports birth times where its predecessor did
not. `same` matches such a record by its inode.

Read by `statx(2)` through ctypes (Python 3.11 has no birth time on Linux): about 2 µs.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

from dirmq.store import layout
from dirmq.store.libc import LIBC_PATH

# PyDLL: the GIL kept for a call that takes a microsecond (released, a publisher's other
# threads would take it over at each).
_libc = ctypes.PyDLL(LIBC_PATH, use_errno=True)
_statx = getattr(_libc, "statx", None)  # glibc 2.28 and later
if _statx is not None:
    _statx.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    _statx.restype = ctypes.c_int
_AT_FDCWD = -100
_STATX_WANTED = 0x100 | 0x800  # STATX_INO | STATX_BTIME
_STATX_BTIME = 0x800
# struct statx (linux/stat.h): stx_mask at 0, stx_ino at 32, stx_btime (a 64-bit tv_sec, a
# 32-bit tv_nsec) at 80; 256 bytes in all.
_FIELDS = struct.Struct("=I28xQ40xqI")
_buffers = threading.local()  # one struct statx a thread


def incarnation(queue_dir: str) -> str:
    """`<inode>.<birth time, ns>` of the queue at `queue_dir` (birth time 0 where unknown).
    Raises OSError (FileNotFoundError: the queue has no `@ready/`, deleted or being made)."""
    path = os.fsencode(queue_dir + "/" + layout.READY)
    if _statx is None:
        return f"{os.stat(path).st_ino}.0"
    buffer = getattr(_buffers, "statx", None)
    if buffer is None:
        buffer = _buffers.statx = ctypes.create_string_buffer(256)
    if _statx(_AT_FDCWD, path, 0, _STATX_WANTED, buffer) != 0:
        # A kernel before 4.11 (ENOSYS), or a seccomp filter that refuses statx (EPERM:
        # Docker's default profile before 18.04), which the C library does not emulate: the
        # inode alone, as a process with no statx names it. stat raises what is really wrong.
        return f"{os.stat(path).st_ino}.0"
    mask, inode, seconds, nanoseconds = _FIELDS.unpack_from(buffer)
    born = seconds * 1_000_000_000 + nanoseconds if mask & _STATX_BTIME else 0
    return f"{inode}.{born}"


def same(recorded: str, now: str) -> bool:
    """Whether a record's incarnation `recorded` is the queue's `now`: the same inode, and the
    same birth time where both know one (the module's docstring)."""
    if recorded == now:
        return True
    inode, _, born = recorded.partition(".")
    inode_now, _, born_now = now.partition(".")
    return inode == inode_now and (born == "0" or born_now == "0")
