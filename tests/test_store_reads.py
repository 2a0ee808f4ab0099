"""Reading message files: without touching their access time where the kernel allows it."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

import dirmq
from dirmq.store import reading


def _file_of(queue: dirmq.Queue, state_dir: str) -> Path:
    [path] = (Path(queue.path) / state_dir).iterdir()
    return path


def test_reading_a_message_leaves_its_access_time_alone(root: Path) -> None:
    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        message_id = queue.put(b"body")
        path = _file_of(queue, "@ready")
        mtime = path.stat().st_mtime
        os.utime(path, (mtime - 3600, mtime))  # older than the write: relatime would update it
        assert queue.peek(message_id).body == b"body"
        [message] = queue.get(1)
        assert message.body == b"body"
        assert _file_of(queue, "@leased").stat().st_atime == mtime - 3600


def test_a_file_we_may_not_open_without_atime_is_read_anyway(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open
    attempts: list[bool] = []

    def open_as_non_owner(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        noatime = bool(flags & reading._NOATIME)
        attempts.append(noatime)
        if noatime:  # what Linux answers a caller that neither owns the file nor has CAP_FOWNER
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *args, **kwargs)

    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        ids = queue.put_many([b"a", b"b"])
        monkeypatch.setattr(reading, "_read_flags", reading._read_flags | reading._NOATIME)
        monkeypatch.setattr(os, "open", open_as_non_owner)
        assert [queue.peek(i).body for i in ids] == [b"a", b"b"]
    assert [a for a in attempts if a] == [True]  # asked once, then no more


def test_a_thread_whose_noatime_open_fails_retries_though_another_cleared_the_flag(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def another_thread_got_there_first(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & reading._NOATIME:
            monkeypatch.setattr(reading, "_read_flags", flags & ~reading._NOATIME)
            raise PermissionError(errno.EPERM, "Operation not permitted")
        return real_open(path, flags, *args, **kwargs)

    with dirmq.Store(root) as store:
        queue = store.create_queue("q")
        message_id = queue.put(b"a")
        monkeypatch.setattr(reading, "_read_flags", reading._read_flags | reading._NOATIME)
        monkeypatch.setattr(os, "open", another_thread_got_there_first)
        assert queue.peek(message_id).body == b"a"
