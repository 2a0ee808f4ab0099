"""A queue's change notification (store/watch.py): the eventfd of a queue's watcher is written
only while somebody may wait on it, and nobody who waits misses a change for that."""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dirmq.store.watch import InotifyHub


@pytest.fixture
def hub() -> Iterator[InotifyHub]:
    hub = InotifyHub()
    yield hub
    hub.close()


def readable(fd: int | None) -> bool:
    assert fd is not None
    return bool(select.select([fd], [], [], 0)[0])


def test_changes_nobody_waits_for_write_no_eventfd(hub: InotifyHub, tmp_path: Path) -> None:
    watcher = hub.subscribe({"@ready": str(tmp_path)})
    (tmp_path / "a").touch()
    hub.pump()
    assert [e.name for e in watcher.pending] == ["a"]
    assert not watcher._written  # no eventfd_write for a change nobody waits on
    events = watcher.drain()
    assert isinstance(events, list) and [(e.name, e.added) for e in events] == [("a", True)]
    watcher.close()


def test_a_descriptor_handed_out_after_a_change_is_readable_at_once(
    hub: InotifyHub, tmp_path: Path
) -> None:
    watcher = hub.subscribe({"@ready": str(tmp_path)})
    (tmp_path / "a").touch()
    hub.pump()  # pending, unsignalled
    fd = watcher.fileno()
    assert readable(fd), "a change that arrived before fileno() was lost to its user"
    watcher.drain()
    assert not readable(fd)  # drained: cleared
    (tmp_path / "b").touch()
    hub.pump()
    assert readable(fd)  # handed out: every change writes it from now on
    watcher.close()


def test_a_waiting_thread_wakes_on_a_change_another_thread_pumps(
    hub: InotifyHub, tmp_path: Path
) -> None:
    watcher = hub.subscribe({"@ready": str(tmp_path)})
    woke: list[float] = []

    def wait() -> None:
        started = time.monotonic()
        watcher.wait(10.0)
        woke.append(time.monotonic() - started)

    for name in ("a", "b", "c"):
        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.05)
        (tmp_path / name).touch()
        hub.pump()  # this thread takes the event: the waiter must hear of it all the same
        waiter.join(10.0)
        assert not waiter.is_alive()
        watcher.drain()
    assert len(woke) == 3 and max(woke) < 5.0, woke
    assert watcher._waiting == 0
    watcher.close()


def test_one_pump_takes_a_burst_larger_than_one_read(hub: InotifyHub, tmp_path: Path) -> None:
    """A read that fills the buffer is followed by another: the short-read stop must not leave
    events behind."""
    watcher = hub.subscribe({"@ready": str(tmp_path)})
    names = [f"{i:0200d}" for i in range(600)]  # ~600 x 216 bytes: two reads of 64 KiB
    for name in names:
        os.close(os.open(tmp_path / name, os.O_CREAT | os.O_WRONLY, 0o600))
    hub.pump()
    events = watcher.drain()
    assert isinstance(events, list)
    assert [e.name for e in events] == names
    watcher.close()
