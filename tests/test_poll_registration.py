"""What registering a long poll on a queue new to the process reads and asks of the kernel
(issue 35: polls on thousands of distinct queues cost about what as many on one queue do): the
watch mode is decided once a device, not once a queue; an empty backlog is told by a stat,
and one holding a message still makes the queue not idle; a lazily opened queue's
configuration is read at its first use as it is then, and later changes are still seen."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

import dirmq
from dirmq.errors import CorruptConfig
from dirmq.server import longpolls
from dirmq.server.broker import Broker
from dirmq.store import backlog, layout, watch

NAMES = [f"idle-{n}" for n in range(30)]


def _nothing() -> None:
    pass


@pytest.fixture
def statfs_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths whose filesystem `watch.polls` asked the kernel about (a statfs each)."""
    asked: list[str] = []
    real = watch.needs_polling

    def counted(path: str) -> bool:
        asked.append(path)
        return real(path)

    monkeypatch.setattr(watch, "needs_polling", counted)
    return asked


def test_the_watch_mode_is_decided_once_a_device(root: Path, statfs_calls: list[str]) -> None:
    """Thirty idle queues opened lazily and each only watched (a poll's registration): one
    statfs for all of them (they are on one device), not one each; each queue is still
    watched (a change of its own reaches its listener only)."""
    with dirmq.Store(root) as setup:
        for name in NAMES:
            setup.create_queue(name)
    heard: list[str] = []
    with dirmq.Store(root) as store:
        statfs_calls.clear()  # the Store's own look at its root (the shared mode) aside
        watches = []
        for name in NAMES:
            queue = store.queue(name, lazy=True)
            unsubscribe = queue.watch_if_idle(lambda name=name: heard.append(name))
            assert unsubscribe is not None, f"{name} is idle: only watched"
            watches.append(unsubscribe)
        assert len(statfs_calls) == 1, statfs_calls
        with dirmq.Store(root) as other:
            other.queue(NAMES[7]).put(b"x")
        store.pump_watches()
        assert heard == [NAMES[7]]
        for unsubscribe in watches:
            unsubscribe()


def test_a_store_that_polls_asks_no_filesystem(root: Path, statfs_calls: list[str]) -> None:
    """Under watch mode "poll" (as on NFS) nothing asks the filesystem per queue, and an idle
    queue is not only watched: its polls are served by polling, as before."""
    with dirmq.Store(root) as setup:
        setup.create_queue("polled")
    with dirmq.Store(root, watch_mode="poll") as store:
        statfs_calls.clear()
        assert store.queue("polled", lazy=True).watch_if_idle(_nothing) is None
        assert store.queue("polled").polled()
        assert statfs_calls == []


def _into_backlog(queue: dirmq.Queue, name: str) -> None:
    """Move the ready message `name` into its bucket of the backlog, as a spill lays it out."""
    bucket = Path(queue.path, backlog.relative_dir(name))
    bucket.mkdir(parents=True)
    os.rename(Path(queue.path, layout.READY, name), bucket / name)


def test_a_queue_whose_message_is_in_the_backlog_is_not_idle(root: Path) -> None:
    """A message in the backlog (its @ready empty, as after a publisher's spill whose @ready
    was then drained): the backlog has a subdirectory, so it is looked into, the queue is not
    only watched, and a poll on it gets the message at its registration; an empty epoch left
    behind (no message) is looked into too, and its queue's poll still gets a publish."""
    with dirmq.Store(root) as setup:
        spilled = setup.create_queue("spilled")
        message_id = spilled.put(b"in the backlog")
        _into_backlog(spilled, message_id)
        left = setup.create_queue("left")
        Path(left.path, layout.BACKLOG, "000000").mkdir()  # an emptied epoch, not yet removed
    store = dirmq.Store(root)

    async def main() -> tuple[list[dirmq.Message], list[dirmq.Message]]:
        broker = Broker(store)
        other = dirmq.Store(root)
        try:
            queue = store.queue("spilled", lazy=True)
            assert queue.watch_if_idle(_nothing) is None
            assert store.queue("left", lazy=True).watch_if_idle(_nothing) is None
            async with asyncio.timeout(30):
                got = await broker.receive(queue, 1, 30, 30)
                waiting = asyncio.ensure_future(broker.receive(store.queue("left"), 1, 30, 30))
                while broker.registering() or not store.queue("left").indexed():
                    await asyncio.sleep(0.01)
                other.queue("left").put(b"published")
                return got, await waiting
        finally:
            other.close()
            broker.close()

    try:
        spilled_got, left_got = asyncio.run(main())
    finally:
        store.close()
    assert [m.body for m in spilled_got] == [b"in the backlog"]
    assert [m.body for m in left_got] == [b"published"]


def _configured(root: Path, name: str, **changes: object) -> None:
    with dirmq.Store(root) as other:  # another process's change: a new @queue.json
        other.configure(name, **changes)


def test_a_lazily_opened_configuration_is_read_as_it_is_at_first_use(root: Path) -> None:
    """A queue opened lazily (a stat), then reconfigured by another process before its first
    use: the first use reads the new configuration; a change after that is seen at the next
    check; one that makes it bad is told to whoever uses the queue next (a poll's
    registration: CorruptConfig, the server's 500)."""
    with dirmq.Store(root) as setup:
        setup.create_queue("late")
    store = dirmq.Store(root)
    try:
        queue = store.queue("late", lazy=True)
        _configured(root, "late", visibility_timeout_s=11)
        assert queue.config.visibility_timeout_s == 11
        _configured(root, "late", visibility_timeout_s=12)
        queue.reload_config()
        assert queue.config.visibility_timeout_s == 12
    finally:
        store.close()
    with dirmq.Store(root) as reopened:  # a fresh process's lazy open, then a bad change
        fresh = reopened.queue("late", lazy=True)
        Path(fresh.path, layout.CONFIG_FILE).write_text('{"visibility_timeout_s": 1e13}')
        with pytest.raises(CorruptConfig, match="visibility_timeout_s"):
            fresh.watch_if_idle(_nothing)


def test_a_consumers_next_poll_on_its_idle_queue_is_not_registered_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A poll on an idle queue new to the worker is registered (only watched: three watches);
    its client leaves, and the consumer's next poll, within `LINGER_S`, joins the line still
    watched: no second registration, the same three watches; another process's publish
    reaches it."""
    monkeypatch.setattr(longpolls, "LINGER_S", 600.0)  # however slow the machine between polls
    registered: list[object] = []
    real = Broker.register_later

    def counted(self: Broker, step: Callable[[], None]) -> None:
        registered.append(step)
        real(self, step)

    monkeypatch.setattr(Broker, "register_later", counted)
    with dirmq.Store(root) as setup:
        setup.create_queue("again")
    store = dirmq.Store(root)
    watched = store.inotify_hub()._subscribers

    async def until(check: Callable[[], bool]) -> None:
        async with asyncio.timeout(30):
            while not check():
                await asyncio.sleep(0.01)

    async def main() -> list[dirmq.Message]:
        broker = Broker(store)
        other = dirmq.Store(root)
        try:
            queue = store.queue("again", lazy=True)
            first = asyncio.ensure_future(broker.receive(queue, 1, 30, 30))
            await until(lambda: not broker.registering() and len(watched) == 3)
            first.cancel()
            await until(lambda: broker.waiting_polls() == {})
            second = asyncio.ensure_future(broker.receive(queue, 1, 30, 30))
            await until(lambda: broker.waiting_polls() == {"again": 1})
            assert len(registered) == 1
            assert len(watched) == 3 and not queue.indexed()
            other.queue("again").put(b"to the second")
            async with asyncio.timeout(30):
                got = await second
            return got
        finally:
            other.close()
            broker.close()

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    assert [m.body for m in got] == [b"to the second"]
