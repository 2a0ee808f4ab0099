"""Long polls on many queues at once (issue 35): each answered by its own queue's message, none
lost; a delivery never waits for the registrations of a burst of polls on other queues; a poll
nobody publishes to answers empty at its deadline; a closed connection leaves nothing behind."""

from __future__ import annotations

import asyncio
import errno
import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import dirmq
from dirmq.server.broker import Broker
from dirmq.server.dialect import Router
from dirmq.server.http import HttpServer
from dirmq.server.metrics import Metrics
from dirmq.server.multiprocess import MetricsFiles
from dirmq.store import watch

from .support.fixtures import serve
from .support.servers import ServerProcess

server = serve()
MANY = 1_000


async def _poll(port: int, name: str, wait_s: int) -> tuple[asyncio.StreamReader, Any]:
    """A long poll on `name` on a connection of its own, sent (not answered)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /{name}/messages?wait={wait_s} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP answer (Content-Length framed): its status and body."""
    status = int((await reader.readline()).split()[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def _publish(port: int, name: str, body: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"POST /{name}/messages HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        status, _ = await _answer(reader)
        return status
    finally:
        writer.close()


def test_polls_on_a_thousand_queues_each_get_their_own_message(server: ServerProcess) -> None:
    """1,000 queues polled at once, one connection each (the server has used none of them
    before), then one message published to each: every poll answers with its own queue's
    message, and every message is leased once (none lost, none twice). Polls on queues nobody
    publishes to answer 204 at their deadline, not before."""
    names = [f"many-{n:04d}" for n in range(MANY)]
    idle = [f"idle-{n}" for n in range(20)]
    with dirmq.Store(server.root) as store:
        for name in names + idle:
            store.create_queue(name)
    port = httpx.URL(server.url).port
    assert port is not None

    async def main() -> tuple[list[tuple[int, bytes]], list[tuple[int, float]]]:
        polls = [await _poll(port, name, 60) for name in names]
        idle_sent = time.monotonic()
        idle_polls = [await _poll(port, name, 1) for name in idle]
        statuses = await asyncio.gather(*(_publish(port, name, name.encode()) for name in names))
        assert set(statuses) == {201}
        async with asyncio.timeout(60):
            answers = await asyncio.gather(*(_answer(reader) for reader, _ in polls))
            empty = []
            for reader, _ in idle_polls:
                status, _body = await _answer(reader)
                empty.append((status, time.monotonic() - idle_sent))
        for _, writer in polls + idle_polls:
            writer.close()
        return answers, empty

    answers, empty = asyncio.run(main())
    assert [body for _, body in answers] == [name.encode() for name in names]
    assert {status for status, _ in answers} == {200}
    assert {status for status, _ in empty} == {204}
    assert min(waited for _, waited in empty) >= 1.0  # the deadline, not sooner
    with dirmq.Store(server.root) as store:
        stats = [store.queue(name).stats() for name in names]
    assert {(s.ready, s.in_flight) for s in stats} == {(0, 1)}


def _delay_one(store: dirmq.Store, name: str) -> None:
    """A message in `name`'s @delayed for an hour: the queue is not idle (something falls
    due), so a poll on it is armed with an index (subscribed, on the cold lane)."""
    store.queue(name).put(b"later", delay_s=3600, durability="memory")


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[str]]]:
    """Subscribing to a queue named `burst-*` (a long poll's registration) waits until the
    event is set; each such subscription is recorded as it begins."""
    opened = threading.Event()
    begun: list[str] = []
    real = dirmq.Queue.subscribe

    def gated(self: dirmq.Queue, listener: Any) -> Any:
        if self.name.startswith("burst-"):
            begun.append(self.name)
            if not opened.wait(60):
                raise TimeoutError("the test never opened the gate")
        return real(self, listener)

    monkeypatch.setattr(dirmq.Queue, "subscribe", gated)
    try:
        yield opened, begun
    finally:
        opened.set()  # no pool thread is left waiting


def test_a_delivery_does_not_wait_for_a_burst_of_registrations(
    root: Path, metrics_files: MetricsFiles, gate: tuple[threading.Event, list[str]]
) -> None:
    """A real server in this process (its HTTP on a socket, the native API, the broker). A poll
    waits on one queue; then 1,000 polls on as many new queues arrive, and their registrations
    cannot finish (held at a gate). A message published to the first queue meanwhile reaches
    its poll all the same (before the held registrations, in the order of events: the gate is
    still shut when it arrives). Then the gate opens and every poll of the burst gets its own
    message. Once every connection is closed, the broker keeps no waiter line and no queue a
    subscription (nothing left to leak)."""
    opened, begun = gate
    names = [f"burst-{n:04d}" for n in range(MANY)]
    with dirmq.Store(root) as setup:
        for name in ["first", *names]:
            setup.create_queue(name)
        for name in names:  # not idle (something falls due): each is armed on the cold lane
            _delay_one(setup, name)
    store = dirmq.Store(root)

    async def main() -> None:
        from dirmq.dialects.native.app import NativeApp

        metrics = Metrics(metrics_files, str(store.root))
        broker = Broker(store, counts=metrics)
        app = NativeApp(broker, metrics)
        router = Router([app], observe=metrics.observe)
        http = HttpServer(router, fast=router.fast, observe=router.observe)
        listener = await asyncio.get_running_loop().create_server(http.protocol, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        writers: list[Any] = []
        try:
            # A get without waiting first: the queue's index is built, so the poll after it
            # registers (subscribes, looks) as its request is handled.
            reader, writer = await _poll(port, "first", 0)
            writers.append(writer)
            assert await _answer(reader) == (204, b"")
            first, writer = await _poll(port, "first", 60)
            writers.append(writer)
            while broker.waiting_polls().get("first") != 1:
                await asyncio.sleep(0.01)
            polls = [await _poll(port, name, 60) for name in names]
            writers += [writer for _, writer in polls]
            while not begun:  # the burst's registrations have begun, and are held
                await asyncio.sleep(0.01)
            async with asyncio.timeout(30):
                assert await _publish(port, "first", b"now") == 201
                assert await _answer(first) == (200, b"now")
            assert not opened.is_set()  # delivered while every registration of the burst waits
            assert len(begun) < len(names)
            opened.set()
            async with asyncio.timeout(60):
                statuses = await asyncio.gather(*(_publish(port, n, n.encode()) for n in names))
                assert set(statuses) == {201}
                answers = await asyncio.gather(*(_answer(reader) for reader, _ in polls))
            assert answers == [(200, name.encode()) for name in names]
            # Closed connections: their polls (now idle ones, waiting again) are released.
            again = [await _poll(port, name, 60) for name in names[:100]]
            writers += [writer for _, writer in again]
            while sum(broker.waiting_polls().values()) < len(again):
                await asyncio.sleep(0.01)
        finally:
            for writer in writers:
                writer.close()
        async with asyncio.timeout(30):
            while broker.waiting_polls():
                await asyncio.sleep(0.01)
        listener.close()
        await listener.wait_closed()
        broker.close()

    try:
        asyncio.run(main())
        later = time.monotonic() + 1
        # No listener left on any queue: each can give its watches back (`release_if_idle`
        # refuses a queue somebody is subscribed to).
        assert all(store.queue(name).release_if_idle(later) for name in ["first", *names])
    finally:
        store.close()


def test_first_uses_take_two_pool_threads_at_most(root: Path) -> None:
    """Polls on 40 queues this process has no index of: their first looks run off the event
    loop, never more than two at once (the cold lane), and meanwhile the pool still runs other
    calls at once (a publish's or delivery's would not wait behind them)."""
    names = [f"cold-{n}" for n in range(40)]
    with dirmq.Store(root) as setup:
        for name in names:
            setup.create_queue(name)
            _delay_one(setup, name)
    store = dirmq.Store(root)
    inside = [0]
    most = [0]
    threads: set[int] = set()
    lock = threading.Lock()
    release = threading.Event()
    real = dirmq.Queue.subscribe

    def counted(self: dirmq.Queue, listener: Any) -> Any:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            threads.add(threading.get_ident())
        try:
            release.wait(30)
            return real(self, listener)
        finally:
            with lock:
                inside[0] -= 1

    async def main() -> tuple[int, list[list[dirmq.Message]]]:
        broker = Broker(store)
        try:
            polls = [
                asyncio.ensure_future(broker.receive(store.queue(name), 1, 30, 30))
                for name in names
            ]
            while inside[0] < 2:  # both lanes are held
                await asyncio.sleep(0.01)
            assert await broker.call(lambda: "free") == "free"  # the rest of the pool is
            release.set()
            for name in names:
                await broker.call(store.queue(name).put, name.encode())
            async with asyncio.timeout(30):
                return threading.get_ident(), await asyncio.gather(*polls)
        finally:
            release.set()
            broker.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dirmq.Queue, "subscribe", counted)
        try:
            loop_thread, got = asyncio.run(main())
        finally:
            store.close()
    assert [[m.body for m in messages] for messages in got] == [[n.encode()] for n in names]
    assert most[0] == 2
    assert loop_thread not in threads


def test_polls_on_idle_queues_are_only_watched_until_a_change(root: Path) -> None:
    """Polls on 50 queues this process has no index of, each with nothing ready, in the
    backlog, delayed or leased: registered without an index or a subscription (no pool call,
    no listing), only watched. Another process's publish, a delayed publish (delivered once
    due) and a deletion each reach their poll; a queue not idle is subscribed to as before."""
    names = [f"idle-{n}" for n in range(50)]
    with dirmq.Store(root) as setup:
        for name in [*names, "busy", "doomed"]:
            setup.create_queue(name)
        _delay_one(setup, "busy")
    store = dirmq.Store(root)
    subscribed: list[str] = []
    real = dirmq.Queue.subscribe

    def recorded(self: dirmq.Queue, listener: Any) -> Any:
        subscribed.append(self.name)
        return real(self, listener)

    async def main() -> None:
        broker = Broker(store)
        other = dirmq.Store(root)  # another process's view: it publishes
        try:
            polls = {
                name: asyncio.ensure_future(broker.receive(store.queue(name), 1, 30, 30))
                for name in [*names, "busy", "doomed"]
            }
            # Registered once the loop has no more polls to read (registrations.py), "busy"'s
            # on the cold lane.
            while broker.registering() or not store.queue("busy").indexed():
                await asyncio.sleep(0.01)
            assert sum(broker.waiting_polls().values()) == len(polls)
            assert subscribed == ["busy"]
            assert not any(store.queue(name).indexed() for name in [*names, "doomed"])
            other.queue(names[0]).put(b"later", delay_s=0.2)
            for name in names[1:]:
                other.queue(name).put(name.encode())
            other.delete_queue("doomed")
            async with asyncio.timeout(30):
                got = await asyncio.gather(*(polls[name] for name in names))
                with pytest.raises(dirmq.QueueNotFound):
                    await polls["doomed"]
            assert [[m.body for m in messages] for messages in got] == [
                [b"later"],
                *[[name.encode()] for name in names[1:]],
            ]
            assert not polls["busy"].done()
            polls["busy"].cancel()
        finally:
            other.close()
            broker.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dirmq.Queue, "subscribe", recorded)
        try:
            asyncio.run(main())
        finally:
            store.close()


def test_an_idle_queue_past_the_watch_limit_is_polled(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no inotify watch to be had (the user's budget spent), a poll on an idle queue new
    to the worker cannot be only watched: it is armed as before, its queue polled, and another
    process's publish still reaches it."""
    with dirmq.Store(root) as setup:
        setup.create_queue("spent")
    refused: list[str] = []

    def add_watch(fd: int, path: str, mask: int) -> int:
        refused.append(path)
        raise OSError(errno.ENOSPC, f"inotify_add_watch {path}: No space left on device")

    monkeypatch.setattr(watch, "add_watch", add_watch)
    store = dirmq.Store(root, poll_interval_s=0.1)

    async def main() -> list[dirmq.Message]:
        broker = Broker(store)
        other = dirmq.Store(root)
        try:
            queue = store.queue("spent")
            waiting = asyncio.ensure_future(broker.receive(queue, 1, 30, 30))
            while broker.waiting_polls().get("spent") != 1 or not queue.indexed():
                await asyncio.sleep(0.01)
            assert queue.polled()
            other.queue("spent").put(b"polled")
            async with asyncio.timeout(30):
                return await waiting
        finally:
            other.close()
            broker.close()

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    assert [m.body for m in got] == [b"polled"]
    assert len(refused) >= 2  # watched alone (quiet), then for the index: both refused


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The broker's registrations are held here (never run unless the test runs them)."""
    steps: list[Any] = []
    monkeypatch.setattr(Broker, "register_later", lambda self, step: steps.append(step))
    return steps


def test_a_publish_here_runs_its_queues_pending_registration(root: Path, held: list[Any]) -> None:
    """A poll on an idle queue whose registration has not run (held): a publish through the
    same broker runs it at once, and the poll gets the message without the held line ever
    running."""
    with dirmq.Store(root) as setup:
        setup.create_queue("pending")
    store = dirmq.Store(root)

    async def main() -> list[dirmq.Message]:
        broker = Broker(store)
        try:
            queue = store.queue("pending")
            poll = asyncio.ensure_future(broker.receive(queue, 1, 30, 30))
            while not held:
                await asyncio.sleep(0.01)
            assert broker.waiting_polls() == {"pending": 1}
            await broker.publish(queue, [dirmq.OutgoingMessage(b"here", {})])
            async with asyncio.timeout(10):
                return await poll
        finally:
            broker.close()

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    assert [m.body for m in got] == [b"here"]
    assert len(held) == 1  # never run: the publish ran the registration


def test_a_registration_finds_what_was_published_while_it_waited(
    root: Path, held: list[Any]
) -> None:
    """Polls on idle queues whose registrations wait; another process publishes to each
    meanwhile (no watch of this process could see it). Once the registrations run, each poll
    gets its queue's message: the registration's look finds what its watch was too late for."""
    names = [f"late-{n}" for n in range(20)]
    with dirmq.Store(root) as setup:
        for name in names:
            setup.create_queue(name)
    store = dirmq.Store(root)

    async def main() -> list[list[dirmq.Message]]:
        broker = Broker(store)
        other = dirmq.Store(root)
        try:
            polls = [
                asyncio.ensure_future(broker.receive(store.queue(name), 1, 30, 30))
                for name in names
            ]
            while len(held) < len(names):
                await asyncio.sleep(0.01)
            for name in names:
                other.queue(name).put(name.encode())
            assert not any(poll.done() for poll in polls)
            for step in held:
                step()
            async with asyncio.timeout(30):
                return await asyncio.gather(*polls)
        finally:
            other.close()
            broker.close()

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    assert [[m.body for m in messages] for messages in got] == [[n.encode()] for n in names]


def test_registrations_wait_while_polls_keep_coming() -> None:
    """Registrations run on the loop turns that added none (polls are still coming: the
    requests first), except one that has waited its longest; each in arrival order."""
    from dirmq.server.registrations import Registrations

    async def main(max_wait_s: float) -> tuple[list[int], list[int]]:
        lane = Registrations(per_turn=4, max_wait_s=max_wait_s)
        ran: list[int] = []
        ran_while_coming: list[int] = []
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def arrive(n: int) -> None:  # a poll a loop turn, 20 turns
            lane.add(functools.partial(ran.append, n))
            if n < 19:
                loop.call_soon(arrive, n + 1)
            else:
                ran_while_coming.extend(ran)
                done.set_result(None)

        loop.call_soon(arrive, 0)
        await done
        while len(lane):
            await asyncio.sleep(0)
        return ran_while_coming, ran

    while_coming, ran = asyncio.run(main(60.0))
    assert while_coming == []
    assert ran == list(range(20))
    while_coming, ran = asyncio.run(main(0.0))  # every one overdue at once: 4 a turn
    assert while_coming[:4] == [0, 1, 2, 3]
    assert ran == list(range(20))


def test_after_a_stall_idle_queues_are_watched_off_the_loop_without_an_index(root: Path) -> None:
    """After a stall of the event loop (store calls go to the pool for a while), polls on idle
    queues new to the worker are still only watched, not indexed: the watch and looks run on
    the cold lane. Another process's publish reaches each poll."""
    names = [f"stalled-{n}" for n in range(20)]
    with dirmq.Store(root) as setup:
        for name in names:
            setup.create_queue(name)
    store = dirmq.Store(root)

    async def main() -> list[list[dirmq.Message]]:
        broker = Broker(store)
        broker._on_pool_until = time.monotonic() + 600  # as `call_here` leaves it after a stall
        other = dirmq.Store(root)
        try:
            assert not broker.looks_here()
            polls = [
                asyncio.ensure_future(broker.receive(store.queue(name), 1, 30, 30))
                for name in names
            ]
            while broker.registering() or len(store.inotify_hub()._subscribers) < 3 * len(names):
                await asyncio.sleep(0.01)
            assert not any(store.queue(name).indexed() for name in names)
            for name in names:
                other.queue(name).put(name.encode())
            async with asyncio.timeout(30):
                return await asyncio.gather(*polls)
        finally:
            other.close()
            broker.close()

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    assert [[m.body for m in messages] for messages in got] == [[n.encode()] for n in names]


def test_a_poll_on_a_queue_with_a_bad_configuration_is_told_so(server: ServerProcess) -> None:
    """The server opens a queue new to it without reading its @queue.json (a stat: the read
    waits for the poll's registration); a configuration that is bad is still reported to the
    poll (500, naming the field), not waited on until its deadline, and to a publish."""
    with dirmq.Store(server.root) as store:
        queue = store.create_queue("bad-config")
    Path(queue.path, "@queue.json").write_text('{"visibility_timeout_s": 1e13}')
    with httpx.Client(base_url=server.url, timeout=60) as client:
        polled = client.get("/bad-config/messages", params={"wait": "50"})
        published = client.post("/bad-config/messages", content=b"x")
        missing = client.get("/no-such-queue/messages", params={"wait": "50"})
    assert polled.status_code == 500, polled.text
    assert "visibility_timeout_s" in polled.text
    assert published.status_code == 500, published.text
    assert missing.status_code == 404, missing.text


def test_thousands_of_polls_ending_together_leave_the_line_swept_and_in_order(
    root: Path,
) -> None:
    """3,000 polls on one queue; all but the first and the last leave (their clients gone, as
    when a fleet of consumers restarts). The line keeps no trace of them beyond half its
    length (ended waiters leave it in sweeps, not each by a scan of the line: that was
    O(n^2) on the event loop), and the two left get the next two messages in their order."""
    with dirmq.Store(root) as setup:
        setup.create_queue("crowd")
    store = dirmq.Store(root)
    count = 3_000

    async def main() -> tuple[int, list[list[bytes]]]:
        broker = Broker(store)
        try:
            queue = store.queue("crowd")
            polls = []
            for _ in range(count):
                polls.append(asyncio.ensure_future(broker.receive(queue, 1, 30, 60)))
                await asyncio.sleep(0)  # each joins the line in turn: FIFO is theirs
            async with asyncio.timeout(30):
                while broker.waiting_polls().get("crowd", 0) < count:
                    await asyncio.sleep(0.01)
            for poll in reversed(polls[1:-1]):  # the worst order for a scan from the head
                poll.cancel()
            await asyncio.gather(*polls[1:-1], return_exceptions=True)
            line = broker.waiter_line(queue)
            kept = len(line._waiters)
            assert line.waiting() == 2
            for body in (b"first", b"second"):
                await broker.publish(queue, [dirmq.OutgoingMessage(body, {})])
            async with asyncio.timeout(30):
                got = [await polls[0], await polls[-1]]
            return kept, [[m.body for m in messages] for messages in got]
        finally:
            broker.close()

    try:
        kept, got = asyncio.run(main())
    finally:
        store.close()
    assert kept <= 4, kept  # the two live ones, and what ended after the last sweep
    assert got == [[b"first"], [b"second"]]


def test_streams_served_by_a_dispatch_go_to_the_back_in_the_order_last_served(
    root: Path,
) -> None:
    """A dispatch moves the streams it served (still in the line, credit left) to the line's
    back, in one pass: the others keep their order, a stream served twice takes its place by
    its last serving, and one no longer in the line is not put back."""
    from dirmq.server.waiter import Waiter

    with dirmq.Store(root) as setup:
        setup.create_queue("streams")
    store = dirmq.Store(root)

    async def main() -> list[int]:
        broker = Broker(store)
        try:
            line = broker.waiter_line(store.queue("streams"))
            loop = asyncio.get_running_loop()
            waiters = [Waiter(n + 1, None, loop.create_future()) for n in range(6)]
            line._waiters.extend(waiters[:5])  # the sixth has left the line
            _a, b, _c, d, _e, gone = waiters
            line._to_the_back([b, d, gone, b])  # b served twice: its last serving counts
            order = [w.max_count for w in line._waiters]
            line._waiters.clear()
            return order
        finally:
            broker.close()

    try:
        order = asyncio.run(main())
    finally:
        store.close()
    assert order == [1, 3, 5, 4, 2]  # a, c, e stay in order; then d, then b
