"""The publish path's shortcuts: linking an O_TMPFILE by AT_EMPTY_PATH (and the fallback where
the kernel refuses it), a message validated once, the temp name's pid after a fork."""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import os
from pathlib import Path
from typing import Any

import pytest

import dirmq
from dirmq.store import fsio, layout
from dirmq.store.processes import current
from dirmq.store.publishing import Publisher


class _RefusingLibc:
    """libc whose linkat refuses AT_EMPTY_PATH (as before Linux 6.10 without
    CAP_DAC_READ_SEARCH: ENOENT), counting the calls of each kind."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.empty_path_calls = 0
        self.procfs_calls = 0

    def linkat(self, olddirfd: int, old: bytes, newdirfd: int, new: bytes, flags: int) -> int:
        if flags & fsio._AT_EMPTY_PATH:
            self.empty_path_calls += 1
            ctypes.set_errno(errno.ENOENT)
            return -1
        self.procfs_calls += 1
        result: int = self._real.linkat(olddirfd, old, newdirfd, new, flags)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _tmpfile(directory: Path, data: bytes) -> int:
    fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
    os.write(fd, data)
    return fd


def test_link_by_empty_path_names_the_open_file(tmp_path: Path) -> None:
    fd = _tmpfile(tmp_path, b"hello")
    try:
        fsio._link_fd(fd, str(tmp_path / "named"))
    finally:
        os.close(fd)
    assert (tmp_path / "named").read_bytes() == b"hello"


def test_refused_empty_path_falls_back_to_procfs_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libc = _RefusingLibc(fsio._libc)
    monkeypatch.setattr(fsio, "_libc", libc)
    monkeypatch.setattr(fsio, "_empty_path_link", True)
    for name in ("a", "b"):
        fd = _tmpfile(tmp_path, name.encode())
        try:
            fsio._link_fd(fd, str(tmp_path / name))
        finally:
            os.close(fd)
        assert (tmp_path / name).read_bytes() == name.encode()
    assert (libc.empty_path_calls, libc.procfs_calls) == (1, 2)
    assert fsio._empty_path_link is False


def test_missing_target_directory_is_not_taken_for_a_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsio, "_empty_path_link", True)
    fd = _tmpfile(tmp_path, b"x")
    try:
        with pytest.raises(FileNotFoundError):
            fsio._link_fd(fd, str(tmp_path / "gone" / "name"))
    finally:
        os.close(fd)
    assert fsio._empty_path_link is True


def test_puts_work_where_empty_path_is_refused(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fsio, "_libc", _RefusingLibc(fsio._libc))
    monkeypatch.setattr(fsio, "_empty_path_link", True)
    q = store.create_queue("q")
    ids = q.put_many([b"one", b"two"])
    assert [m.body for m in q.get(2, max_per_group=None)] == [b"one", b"two"]
    assert len(ids) == 2


def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[dirmq.OutgoingMessage]:
    checked: list[dirmq.OutgoingMessage] = []
    real = Publisher._check_outgoing

    def counting(self: Publisher, message: dirmq.OutgoingMessage, config: Any) -> None:
        checked.append(message)
        real(self, message, config)

    monkeypatch.setattr(Publisher, "_check_outgoing", counting)
    return checked


def test_a_validated_message_is_not_checked_again(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")
    checked = _count_checks(monkeypatch)
    validated = dirmq.OutgoingMessage(b"a", {"X-A": "1"})
    q.validate(validated)
    unvalidated = dirmq.OutgoingMessage(b"b")
    copy = dataclasses.replace(validated, body=b"c")
    q.put_many([validated, unvalidated, copy])
    assert checked == [validated, unvalidated, copy]
    # The record is used once: publishing the same object again checks it again.
    q.put_many([validated])
    assert checked[-1] is validated and len(checked) == 4


def test_validation_under_another_configuration_is_redone(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")
    message = dirmq.OutgoingMessage(b"x" * 100)
    q.validate(message)
    store.configure("q", max_message_bytes=10)
    q.reload_config()
    with pytest.raises(dirmq.MessageTooLarge):
        q.put_many([message])


def test_a_mutable_body_is_always_checked(
    store: dirmq.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = store.create_queue("q")
    store.configure("q", max_message_bytes=10)
    q.reload_config()
    body = bytearray(b"short")
    message = dirmq.OutgoingMessage(body)  # type: ignore[arg-type]
    q.validate(message)
    body.extend(b"x" * 100)
    with pytest.raises(dirmq.MessageTooLarge):
        q.put_many([message])


def test_records_of_unpublished_messages_are_bounded(store: dirmq.Store) -> None:
    q = store.create_queue("q")
    for _ in range(5000):
        q.validate(dirmq.OutgoingMessage(b"x"))
    assert len(q._publisher._validated) <= 4096


def test_tmp_name_carries_the_pid_of_a_forked_child() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, layout.tmp_name("x").encode())
        finally:
            os._exit(0)
    os.close(write)
    name = os.read(read, 200).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert name.startswith(f"x.{layout.HOST_TAG}.{current().pid_ns}.{pid}.")
    assert layout.tmp_name("x") == f"x.{current().token()}.tmp"
    assert current().pid == os.getpid()
