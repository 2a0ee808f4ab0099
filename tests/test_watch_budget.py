"""The user's inotify budget: out of watches (ENOSPC) or instances (EMFILE), a queue is polled,
never refused, and a long poll on it still gets what another process publishes; the watches of
queues nobody waits on are given back (`Store.release_idle`).

The limits are per user and shared with every other process of the user, so they are not
spent for real here: `watch.add_watch` (and the inotify instance) fail as the kernel would past
them, in the style of faultfs.py."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

import dirmq
from dirmq.server import broker as broker_module
from dirmq.server.broker import Broker
from dirmq.store import watch

from .support.metrics_helpers import inotify_watches


def _publish_from_another_process(root: Path, queue: str, body: str) -> None:
    code = (
        "import sys, dirmq\n"
        "with dirmq.Store(sys.argv[1]) as store:\n"
        "    store.queue(sys.argv[2]).put(sys.argv[3].encode())\n"
    )
    subprocess.run([sys.executable, "-c", code, str(root), queue, body], check=True, timeout=60)


def _limit_watches(monkeypatch: pytest.MonkeyPatch, allowed: int) -> list[int]:
    """From now on inotify_add_watch fails with ENOSPC once `allowed` more watches were
    added (as at fs.inotify.max_user_watches); returns the refusals as they happen."""
    real = watch.add_watch
    given = [0]
    refused: list[int] = []

    def add_watch(fd: int, path: str, mask: int) -> int:
        if given[0] >= allowed:
            refused.append(errno.ENOSPC)
            raise OSError(errno.ENOSPC, f"inotify_add_watch {path}: No space left on device")
        given[0] += 1
        return real(fd, path, mask)

    monkeypatch.setattr(watch, "add_watch", add_watch)
    return refused


def test_past_the_watch_limit_a_long_poll_still_gets_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "root"
    with dirmq.Store(root) as setup:
        setup.create_queue("watched")
        setup.create_queue("polled")
    refused = _limit_watches(monkeypatch, allowed=7)  # one queue's five, then two of five
    monkeypatch.setattr(watch, "_last_warning", [-watch.WARN_EVERY_S])  # none warned yet
    gc.collect()  # an earlier test's unclosed Store must not give its watches back meanwhile
    before = inotify_watches()

    async def main() -> tuple[list[bytes], float, int | None, int | None]:
        store = dirmq.Store(root, poll_interval_s=0.2)
        broker = Broker(store)
        try:
            watched = store.queue("watched")
            watched_fd = await broker.call(watched.fileno)
            polled = store.queue("polled")
            polled_fd = await broker.call(polled.fileno)  # no error: polled
            assert inotify_watches() - before == 5  # the half-watched one gave back its two
            started = time.monotonic()
            waiting = asyncio.ensure_future(broker.receive(polled, 1, None, 20.0))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await asyncio.to_thread(_publish_from_another_process, root, "polled", "hello")
            got = await asyncio.wait_for(waiting, 20)
            return [m.body for m in got], time.monotonic() - started, watched_fd, polled_fd
        finally:
            broker.close()
            store.close()

    with caplog.at_level("WARNING", logger="dirmq.store.watch"):
        bodies, waited_s, watched_fd, polled_fd = asyncio.run(main())
    assert bodies == [b"hello"]
    assert waited_s < 10
    assert watched_fd is not None and polled_fd is None
    assert refused == [errno.ENOSPC]
    assert "out of inotify watches" in caplog.text


def test_without_an_inotify_instance_every_queue_is_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's 128 instances spent (EMFILE from inotify_init1): queues still work."""

    def no_instance() -> watch.InotifyHub:
        raise OSError(errno.EMFILE, "inotify_init1: Too many open files")

    with dirmq.Store(tmp_path / "root", poll_interval_s=0.05) as store:
        monkeypatch.setattr(store, "context", replace(store.context, inotify_hub=no_instance))
        queue = store.create_queue("q")
        assert queue.fileno() is None
        _publish_from_another_process(Path(store.root), "q", "x")
        (got,) = queue.get(1, wait_s=5)
        assert got.body == b"x"


def test_queues_nobody_waits_on_give_their_watches_back(tmp_path: Path) -> None:
    root = tmp_path / "root"
    gc.collect()  # an earlier test's unclosed Store must not give its watches back meanwhile
    before = inotify_watches()
    with dirmq.Store(root) as store:
        queues = [store.create_queue(f"q{n}") for n in range(25)]
        for queue in queues:
            assert queue.get(1) == []  # used: watched, indexed
        assert inotify_watches() - before == 5 * 25
        woken: list[int] = []
        unsubscribe = queues[0].subscribe(lambda: woken.append(1))  # someone waits on q0
        assert store.release_idle(3600) == 0  # all used within the hour
        assert store.release_idle(0) == 24
        assert inotify_watches() - before == 5
        _publish_from_another_process(root, "q7", "after")
        (got,) = queues[7].get(1)  # a released queue builds its index again
        assert got.body == b"after"
        assert inotify_watches() - before == 10
        unsubscribe()
        assert store.release_idle(0) == 2
        assert inotify_watches() - before == 0
    assert os.path.isdir(root)


def test_the_server_gives_idle_queues_watches_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broker releases now and then (here every 50 ms, after 0.1 s idle) what `release_idle`
    releases; a queue a long poll waits on keeps its watches."""
    monkeypatch.setattr(broker_module, "RELEASE_EVERY_S", 0.05)
    monkeypatch.setattr(broker_module, "IDLE_RELEASE_S", 0.1)
    root = tmp_path / "root"
    gc.collect()  # an earlier test's unclosed Store must not give its watches back meanwhile
    before = inotify_watches()

    async def main() -> tuple[int, int, list[bytes]]:
        store = dirmq.Store(root)
        broker = Broker(store)
        broker.start()
        try:
            queues = [store.create_queue(f"q{n}") for n in range(10)]
            for queue in queues:
                assert await broker.receive(queue, 1, None, 0) == []
            touched = inotify_watches() - before
            waiting = asyncio.ensure_future(broker.receive(queues[0], 1, None, 10.0))
            await asyncio.sleep(0.5)
            idle = inotify_watches() - before
            await asyncio.to_thread(_publish_from_another_process, root, "q0", "woken")
            got = await asyncio.wait_for(waiting, 10)
            return touched, idle, [m.body for m in got]
        finally:
            broker.close()
            store.close()

    touched, idle, bodies = asyncio.run(main())
    assert touched == 50
    assert idle == 5  # q0's, which a long poll waits on
    assert bodies == [b"woken"]
