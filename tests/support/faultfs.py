"""A fault-injecting wrapper of the filesystem calls the store makes.

`FaultyFS` replaces chosen functions of `os` (which every store module calls through the one
`os` module object) and the store's own ctypes helpers (`fsio.syncfs`, `fsio._link_fd`) with
wrappers that raise a chosen errno, but only for calls that touch a path under `root` (for
descriptor calls, the file the descriptor names): pytest, the interpreter and other tests
keep a working filesystem. Faults are switched on and off while a test runs; `monkeypatch`
undoes the patching at the end.

`CALLS` are the calls that change the filesystem, `READ_CALLS` those that only look at it
(reading a message file, listing a state directory, reading a capacity or dedup symlink).
Not covered: the builtin `open()` (io's C code calls no `os` function; the store uses it for
`@queue.json` and a file's slot header) and `DirEntry.stat` (no `os` call either).
"""

from __future__ import annotations

import errno
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from dirmq.store import fsio

# The calls that can be failed, and how each names what it touches.
PATH_CALLS = ("rename", "replace", "link", "unlink", "open", "mkdir", "symlink")
FD_CALLS = ("write", "fsync", "ftruncate")
STORE_CALLS = ("syncfs", "link_fd")
CALLS = (*PATH_CALLS, *FD_CALLS, *STORE_CALLS)
# Made by the pool's reaper thread only (blanking a retired file), never on a caller's path:
# failable, but not in every transition's matrix.
REAPER_CALLS = ("pwrite",)
# The commit journal's append and flush (store/journal.py): failable, not in every matrix.
JOURNAL_CALLS = ("writev", "fdatasync")
READ_PATH_CALLS = ("listdir", "scandir", "stat", "lstat", "readlink")
READ_FD_CALLS = ("read", "pread", "fstat")
READ_CALLS = (*READ_PATH_CALLS, *READ_FD_CALLS)
ERRORS = {
    "ENOSPC": errno.ENOSPC,
    "EROFS": errno.EROFS,
    "EIO": errno.EIO,
    "EMFILE": errno.EMFILE,
}
# The errors each read can meet, as its man page lists them: all of them EIO (a failing disk);
# listing opens the directory (EMFILE, ENOMEM); the stat family and readlink ENOMEM.
READ_ERRORS: dict[str, tuple[str, ...]] = {
    "read": ("EIO",),
    "pread": ("EIO",),
    "fstat": ("EIO", "ENOMEM"),
    "stat": ("EIO", "ENOMEM"),
    "lstat": ("EIO", "ENOMEM"),
    "readlink": ("EIO", "ENOMEM"),
    "listdir": ("EIO", "EMFILE", "ENOMEM"),
    "scandir": ("EIO", "EMFILE", "ENOMEM"),
}

_real_readlink = os.readlink


def _fd_target(fd: int) -> str:
    try:
        return _real_readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


class FaultyFS:
    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: str | os.PathLike[str]) -> None:
        self.root = os.path.realpath(os.fspath(root))
        self.failing: dict[str, int] = {}  # call name -> errno it raises
        self.raised: Counter[str] = Counter()  # call name -> faults injected so far
        self._grace: dict[str, int] = {}  # call name -> calls still allowed to work
        self._left: dict[str, int | None] = {}  # call name -> faults still to inject
        for name in (*PATH_CALLS, *READ_PATH_CALLS):
            monkeypatch.setattr(os, name, self._path_call(name, getattr(os, name)))
        for name in (*FD_CALLS, *READ_FD_CALLS, *REAPER_CALLS, *JOURNAL_CALLS):
            monkeypatch.setattr(os, name, self._fd_call(name, getattr(os, name)))
        monkeypatch.setattr(fsio, "syncfs", self._fd_call("syncfs", fsio.syncfs))
        monkeypatch.setattr(fsio, "_link_fd", self._link_fd_call(fsio._link_fd))

    def fail(self, call: str, error: int, after: int = 0, times: int | None = None) -> None:
        """From now on (after `after` more such calls have worked), `call` on anything under
        the root raises OSError(`error`), `times` times (None: until `clear`)."""
        assert call in (*CALLS, *READ_CALLS, *REAPER_CALLS, *JOURNAL_CALLS), call
        self.failing[call] = error
        self._grace[call] = after
        self._left[call] = times

    def clear(self) -> None:
        """The filesystem recovers: every call works again."""
        self.failing.clear()
        self._grace.clear()
        self._left.clear()

    def _under_root(self, path: object, dir_fd: int | None) -> bool:
        if isinstance(path, int):
            target = _fd_target(path)
        else:
            text = os.fsdecode(path)  # type: ignore[arg-type]
            if dir_fd is not None and not text.startswith("/"):
                text = f"{_fd_target(dir_fd)}/{text}"
            target = os.path.abspath(text)
        return target == self.root or target.startswith(self.root + "/")

    def _raise(self, call: str, path: object) -> None:
        if self._grace.get(call, 0) > 0:
            self._grace[call] -= 1
            return
        code = self.failing[call]
        left = self._left.get(call)
        if left is not None:
            if left <= 0:
                return
            self._left[call] = left - 1
        self.raised[call] += 1
        raise OSError(code, os.strerror(code), path)

    def _path_call(self, call: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if call in self.failing and args:
                dir_fds = [kwargs.get(k) for k in ("dir_fd", "src_dir_fd", "dst_dir_fd")]
                dir_fd = next((d for d in dir_fds if d is not None), None)
                if any(self._under_root(p, dir_fd) for p in args[:2] if isinstance(p, str)):
                    self._raise(call, args[0])
            return real(*args, **kwargs)

        return wrapper

    def _fd_call(self, call: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(fd: int, *args: Any) -> Any:
            if call in self.failing and self._under_root(fd, None):
                self._raise(call, fd)
            return real(fd, *args)

        return wrapper

    def _link_fd_call(self, real: Callable[[int, str], None]) -> Callable[[int, str], None]:
        def wrapper(fd: int, path: str) -> None:
            if "link_fd" in self.failing and self._under_root(path, None):
                self._raise("link_fd", path)
            real(fd, path)

        return wrapper
