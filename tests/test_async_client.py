"""The asyncio client, natively: concurrency, cancellation and errors (the contract suite covers
the rest through `async_adapter`, as the `http-async` transport)."""

from __future__ import annotations

import asyncio
import inspect
import socket
import textwrap
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

import dirmq
from dirmq.client import AsyncRemoteQueue, AsyncRemoteStore, RemoteQueue, RemoteStore
from dirmq.errors import StorageIOError
from dirmq.store.ids import new_id

from .support.async_adapter import BlockingAsyncQueue, BlockingAsyncStore
from .support.servers import ServerProcess, start_server

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T], timeout_s: float = 60) -> T:
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def unique(name: str) -> str:
    return f"aio-{uuid.uuid4().hex[:10]}/{name}"


# -- the API mirrors the sync client -------------------------------------------------------------
def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _parameters(fn: Callable[..., Any]) -> list[tuple[str, Any, Any, Any]]:
    """Parameters after self: name, kind, default, annotation (the return type may differ)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return [(p.name, p.kind, p.default, p.annotation) for p in params]


@pytest.mark.parametrize(
    ("sync_cls", "async_cls"), [(RemoteStore, AsyncRemoteStore), (RemoteQueue, AsyncRemoteQueue)]
)
def test_async_api_is_the_sync_api_awaitable(sync_cls: type, async_cls: type) -> None:
    assert _public(async_cls) == _public(sync_cls) - {"close"} | {"aclose"}
    # `consume` returns what `async with` enters (or what is awaited): not a coroutine function.
    for name in _public(async_cls) - {"aclose", "consume"}:
        sync_attr = getattr(sync_cls, name)
        if isinstance(sync_attr, property):  # RemoteQueue.config: a coroutine method here
            sync_attr = sync_attr.fget
        assert inspect.iscoroutinefunction(getattr(async_cls, name)), name
        assert _parameters(getattr(async_cls, name)) == _parameters(sync_attr), name


@pytest.mark.parametrize(
    ("sync_cls", "facade_cls"),
    [(RemoteStore, BlockingAsyncStore), (RemoteQueue, BlockingAsyncQueue)],
)
def test_the_blocking_facade_is_exactly_the_sync_api(sync_cls: type, facade_cls: type) -> None:
    # The stream (`consume`) is not in the facade: tests/test_stream.py tests it on both clients.
    assert _public(facade_cls) == _public(sync_cls) - {"consume"}
    for name in _public(sync_cls) - {"consume"}:
        sync_attr, facade_attr = getattr(sync_cls, name), getattr(facade_cls, name)
        assert isinstance(facade_attr, property) == isinstance(sync_attr, property), name
        if not isinstance(sync_attr, property):
            assert _parameters(facade_attr) == _parameters(sync_attr), name


# -- concurrency ---------------------------------------------------------------------------------
def test_many_concurrent_long_polls_are_all_served(http_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncRemoteStore(http_server.url, max_connections=None) as store:
            q = await store.create_queue(unique("polls"))
            polls = [asyncio.create_task(q.get_one(wait_s=30)) for _ in range(200)]
            await asyncio.sleep(1.0)  # every poll is now waiting at the server
            assert not any(poll.done() for poll in polls)
            started = time.monotonic()
            ids = await asyncio.gather(*(q.put(str(i).encode()) for i in range(200)))
            got = await asyncio.wait_for(asyncio.gather(*polls), 20)
            assert time.monotonic() - started < 10
            assert all(m is not None for m in got)
            delivered = [m for m in got if m is not None]
            assert sorted(m.id for m in delivered) == sorted(ids), "each message to one poll"
            # Nothing is left to receive. (Not `stats().ready == 0`: after such a burst the
            # store's index can count leased messages as ready until the next get; a store bug.)
            assert await q.get_one() is None
            assert (await q.stats()).in_flight == 200
            assert await q.ack_many(m.receipt or "" for m in delivered) == {}
            assert (await q.stats()).total == 0

    run(main())


def test_a_full_connection_pool_is_reported_clearly(http_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncRemoteStore(http_server.url, max_connections=2, timeout_s=0.5) as store:
            q = await store.create_queue(unique("pool"))
            polls = [asyncio.create_task(q.get_one(wait_s=3)) for _ in range(2)]
            await asyncio.sleep(0.3)
            with pytest.raises(StorageIOError, match="no free connection"):
                await q.put(b"x")  # both connections are held by the waiting polls
            assert await asyncio.gather(*polls) == [None, None]
            await q.put(b"x")

    run(main())


def test_a_put_may_wait_at_capacity_longer_than_the_request_timeout(
    http_server: ServerProcess,
) -> None:
    """The request's timeout covers the put's own wait (it used to be the client default: the
    put failed as StorageIOError while the server was still waiting for room)."""

    async def main() -> None:
        async with AsyncRemoteStore(http_server.url, timeout_s=0.5) as store:
            q = await store.create_queue(unique("capacity"), dirmq.QueueConfig(capacity=1))
            await q.put(b"x")
            started = time.monotonic()
            with pytest.raises(dirmq.QueueFull):
                await q.put(b"y", timeout_s=1.5)
            assert time.monotonic() - started > 1.4

    run(main())


# -- cancellation --------------------------------------------------------------------------------
def test_cancelled_waiting_gets_leave_no_message_stuck(http_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncRemoteStore(http_server.url) as store:
            config = dirmq.QueueConfig(visibility_timeout_s=60)
            q = await store.create_queue(unique("cancel"), config)
            waiting = [asyncio.create_task(q.get_one(wait_s=30)) for _ in range(10)]
            await asyncio.sleep(0.5)  # all ten are waiting at the server
            for task in waiting:
                task.cancel()
            results = await asyncio.gather(*waiting, return_exceptions=True)
            assert all(isinstance(r, asyncio.CancelledError) for r in results)
            ids = await q.put_many([b"a", b"b", b"c"])
            got = await q.get(10, wait_s=5)  # a message leased for a dead waiter would be missing
            assert [m.id for m in got] == ids
            assert [m.receive_count for m in got] == [1, 1, 1], "none was leased for a waiter"

    run(main())


def test_cancel_then_get_again_in_a_loop(http_server: ServerProcess) -> None:
    """A consumer that times out its own waits (asyncio.wait_for) loses nothing."""

    async def main() -> None:
        async with AsyncRemoteStore(http_server.url) as store:
            q = await store.create_queue(unique("loop"), dirmq.QueueConfig(visibility_timeout_s=60))
            for i in range(5):
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(q.get_one(wait_s=30), 0.2)
                message_id = await q.put(str(i).encode())
                got = await q.get_one(wait_s=5)
                assert got is not None and got.id == message_id
                await q.ack(got.receipt or "")

    run(main())


def _slowed_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, method: str, delay_s: float
) -> ServerProcess:
    """A server whose `Queue.<method>` first sleeps `delay_s` (a slow filesystem such as NFS),
    which holds a race window open (through a sitecustomize module on its PYTHONPATH)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
            import functools, time
            from dirmq.store.queue import Queue

            _slowed = Queue.{method}

            @functools.wraps(_slowed)
            def slow(self, *args, **kwargs):
                time.sleep({delay_s!r})
                return _slowed(self, *args, **kwargs)

            Queue.{method} = slow
        """)
    )
    monkeypatch.setenv("PYTHONPATH", str(site))
    return start_server(tmp_path / "root")


def test_cancel_during_the_servers_first_get_gives_the_message_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's first get runs on its thread pool; a client that hangs up meanwhile must not
    leave what it leased in flight until the visibility timeout (it once did)."""
    server = _slowed_server(tmp_path, monkeypatch, "get", 0.5)

    async def main() -> None:
        async with AsyncRemoteStore(server.url) as store:
            q = await store.create_queue("slow", dirmq.QueueConfig(visibility_timeout_s=60))
            message_id = await q.put(b"x")
            task = asyncio.create_task(q.get_one(wait_s=10))
            await asyncio.sleep(0.2)  # the server is inside its first get
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            got = await q.get_one(wait_s=3)
            assert got is not None and got.id == message_id

    try:
        run(main())
    finally:
        server.stop()


def test_a_publish_racing_the_start_of_a_long_poll_is_not_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = _slowed_server(tmp_path, monkeypatch, "subscribe", 0.5)  # widens the window

    async def main() -> None:
        async with AsyncRemoteStore(server.url) as store:
            q = await store.create_queue("race")
            # A first long poll, served: the server now pumps inotify from its event loop, and
            # the poll's watcher has ended (the next poll starts a new one).
            first = asyncio.create_task(q.get_one(wait_s=4))
            await asyncio.sleep(0.8)
            await q.put(b"first")
            assert await first is not None
            poll = asyncio.create_task(q.get_one(wait_s=4))
            await asyncio.sleep(0.2)  # the poll's first get found nothing; it is subscribing
            message_id = await q.put(b"x")
            started = time.monotonic()
            got = await poll
            assert got is not None and got.id == message_id
            assert time.monotonic() - started < 2

    try:
        run(main())
    finally:
        server.stop()


# -- errors and lifecycle ------------------------------------------------------------------------
def test_errors_are_the_library_exceptions(http_server: ServerProcess) -> None:
    async def main() -> None:
        async with AsyncRemoteStore(http_server.url) as store:
            name = unique("errors")
            with pytest.raises(dirmq.QueueNotFound):
                await store.queue(name)
            assert not await store.exists(name)
            config = dirmq.QueueConfig(max_message_bytes=10, capacity=1)
            q = await store.create_queue(name, config)
            with pytest.raises(dirmq.QueueExists):
                await store.create_queue(name, exist_ok=False)
            with pytest.raises(dirmq.InvalidName):
                await store.create_queue("a/../b")
            with pytest.raises(dirmq.InvalidArgument):
                await q.get(0)  # refused by the client
            with pytest.raises(dirmq.InvalidArgument):
                await q.get(wait_s=4000)  # refused by the server: at most an hour
            with pytest.raises(dirmq.MessageTooLarge):
                await q.put(b"x" * 11)
            with pytest.raises(dirmq.MessageNotFound):
                await q.peek(new_id())
            assert not await q.delete(new_id())
            await q.put(b"x")
            with pytest.raises(dirmq.QueueFull):
                await q.put(b"y", timeout_s=0.1)
            message = await q.get_one()
            assert message is not None and message.receipt is not None
            await q.ack(message.receipt)
            for settle in (q.ack(message.receipt), q.nack(message.receipt)):
                with pytest.raises(dirmq.StaleReceipt):
                    await settle
            failures = await q.ack_many([message.receipt, "nonsense"])
            assert isinstance(failures[message.receipt], dirmq.StaleReceipt)
            assert isinstance(failures["nonsense"], dirmq.InvalidArgument)
            await store.delete_queue(name)
            with pytest.raises(dirmq.QueueNotFound):
                await q.put(b"z")

    run(main())


def test_an_unreachable_server_is_a_storage_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once closed

    async def main() -> None:
        async with AsyncRemoteStore(f"http://127.0.0.1:{port}", timeout_s=2) as store:
            with pytest.raises(StorageIOError, match="cannot reach dirmq"):
                await store.list_queues()

    run(main())


def test_browse_returns_a_list_and_queues_are_listed(http_server: ServerProcess) -> None:
    async def main() -> None:
        store = AsyncRemoteStore(http_server.url)
        try:
            name = unique("browse")
            q = await store.create_queue(name)
            assert name in await store.list_queues(name.split("/")[0])
            ids = await q.put_many([b"a", b"b", b"c"])
            assert [m.id for m in await q.browse()] == ids
            assert [m.body for m in await q.browse(limit=2)] == [b"a", b"b"]
            assert (await q.peek(ids[1])).body == b"b"
            assert (await q.config()).visibility_timeout_s == 30
            assert (await store.configure(name, visibility_timeout_s=5)).visibility_timeout_s == 5
            assert await q.purge() == 3
            await q.aclose()
            assert repr(q) == f"<dirmq.client.AsyncRemoteQueue {name!r} at {http_server.url}>"
        finally:
            await store.aclose()

    run(main())
