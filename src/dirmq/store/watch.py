"""Change notification for a queue's state directories: inotify, or polling where it cannot work.

The index of each process learns what other processes did (publish, claim, ack, requeue) from
these events instead of listing directories. inotify is used through `ctypes` (the standard
library has no binding). On NFS and other filesystems where inotify does not see other hosts'
changes, `PollingWatcher` reports `RESCAN` every `interval_s` and the index re-reads the
directories. inotify's own queue overflow also degrades to one `RESCAN`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import time
from dataclasses import dataclass
from typing import Protocol

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

IN_MODIFY = 0x00000002
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_MASK = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF
_EVENT = struct.Struct("iIII")
_NFS_MAGIC = {0x6969, 0xFF534D42, 0xFE534D42, 0x517B, 0x65735546}  # nfs, cifs, smb2, smb, fuse


@dataclass(frozen=True, slots=True)
class Event:
    directory: str  # the watched directory's key (e.g. "@ready")
    name: str
    added: bool  # True: the name appeared; False: it went away


RESCAN = "rescan"


class Watcher(Protocol):
    def fileno(self) -> int | None: ...
    def wait(self, timeout_s: float) -> None: ...
    def drain(self) -> list[Event] | str: ...
    def close(self) -> None: ...


class InotifyWatcher:
    """Watches a fixed set of directories; `drain` returns events or RESCAN."""

    def __init__(self, directories: dict[str, str]) -> None:
        fd = _libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = ctypes.get_errno()
            raise OSError(code, f"inotify_init1: {os.strerror(code)}")
        self._fd = fd
        self._keys: dict[int, str] = {}
        self.lost = False  # a watched directory was deleted or moved (the queue is gone)
        for key, path in directories.items():
            wd = _libc.inotify_add_watch(fd, os.fsencode(path), _MASK | IN_ONLYDIR)
            if wd < 0:
                code = ctypes.get_errno()
                self.close()
                raise OSError(code, f"inotify_add_watch {path}: {os.strerror(code)}")
            self._keys[wd] = key

    def fileno(self) -> int | None:
        return int(self._fd)

    def wait(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            return
        select.select([self._fd], [], [], timeout_s)

    def drain(self) -> list[Event] | str:
        events: list[Event] = []
        overflow = False
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                break
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                raw = data[offset : offset + length].rstrip(b"\0")
                offset += length
                if mask & IN_Q_OVERFLOW:
                    overflow = True
                elif mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_IGNORED):
                    self.lost = True
                elif key := self._keys.get(wd):
                    added = bool(mask & (IN_MOVED_TO | IN_CREATE))
                    events.append(Event(key, os.fsdecode(raw), added))
        return RESCAN if overflow else events

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class PollingWatcher:
    """For filesystems without cross-host inotify: asks for a rescan every `interval_s`."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._next = time.monotonic() + interval_s

    def fileno(self) -> int | None:
        return None

    def wait(self, timeout_s: float) -> None:
        delay = min(timeout_s, self._next - time.monotonic())
        if delay > 0:
            time.sleep(delay)

    def drain(self) -> list[Event] | str:
        now = time.monotonic()
        if now < self._next:
            return []
        self._next = now + self._interval_s
        return RESCAN

    def close(self) -> None:
        pass


def needs_polling(path: str) -> bool:
    """True on network filesystems, where inotify misses other hosts' changes."""
    try:
        buf = ctypes.create_string_buffer(128)
        if _libc.statfs(os.fsencode(path), buf) != 0:
            return False
        (f_type,) = struct.unpack_from("l", buf.raw)
        return (f_type & 0xFFFFFFFF) in _NFS_MAGIC
    except (OSError, AttributeError):
        return False


def open_watcher(directories: dict[str, str], mode: str, poll_interval_s: float) -> Watcher:
    """`mode`: "auto" (inotify unless on a network filesystem), "inotify" or "poll"."""
    first = next(iter(directories.values()))
    if mode == "poll" or (mode == "auto" and needs_polling(first)):
        return PollingWatcher(poll_interval_s)
    return InotifyWatcher(directories)
