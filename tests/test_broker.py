"""The asyncio face of the store: group commit across requests, long polls without threads."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import dirmq
from dirmq.errors import QueueNotFound, StorageError
from dirmq.server import broker as broker_module
from dirmq.server import publish_line, store_load
from dirmq.server.broker import Broker
from dirmq.server.publish_line import on_memory_filesystem
from dirmq.store import OutgoingMessage

from .support.spies import spy


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def _memory_root() -> Path:
    if not on_memory_filesystem("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    return Path(tempfile.mkdtemp(dir="/dev/shm", prefix="dirmq-test-")) / "root"


@pytest.fixture(params=["disk", "memory"])
def any_root(request: pytest.FixtureRequest, root: Path, tmp_path: Path) -> Iterator[Path]:
    """A root in the test's temp dir (a pool thread drains publishes), and one on tmpfs (the
    event loop does)."""
    if request.param == "disk":
        if on_memory_filesystem(str(tmp_path)):
            pytest.skip("the temp dir is on a memory filesystem")
        yield root
        return
    memory = _memory_root()
    try:
        yield memory
    finally:
        shutil.rmtree(memory.parent, ignore_errors=True)


def test_memory_filesystems_are_recognised(tmp_path: Path) -> None:
    if not on_memory_filesystem("/dev/shm"):
        pytest.skip("no tmpfs at /dev/shm")
    assert not on_memory_filesystem("/proc")
    assert not on_memory_filesystem(str(tmp_path / "absent"))


def test_concurrent_publishes_share_flushes(
    any_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = dirmq.Store(any_root)
    queue = store.create_queue("g")
    calls = spy(  # a flush's messages, and its thread
        monkeypatch,
        dirmq.Queue,
        "put_many",
        lambda _, messages, **__: (len(messages), threading.get_ident()),
    )

    async def main() -> list[list[str]]:
        broker = Broker(store)
        try:
            return await asyncio.gather(
                *(broker.publish(queue, [OutgoingMessage(f"{i}".encode())]) for i in range(200))
            )
        finally:
            broker.close()

    results = run(main())
    assert isinstance(results, list)
    ids = [r[0] for r in results]
    assert len(set(ids)) == 200
    assert sum(size for size, _ in calls) == 200
    assert len(calls) < 50, f"200 concurrent publishes took {len(calls)} flushes"
    assert queue.stats().ready == 200
    threads = {thread for _, thread in calls}
    on_loop = threads == {threading.get_ident()}  # asyncio.run ran the loop in this thread
    assert on_loop == on_memory_filesystem(str(any_root))


def threads_of(monkeypatch: pytest.MonkeyPatch, method: str) -> list[int]:
    """The thread each call of `Queue.<method>` runs on from now on, in order."""
    return spy(monkeypatch, dirmq.Queue, method, lambda *_, **__: threading.get_ident())


@pytest.mark.parametrize("disk_is_quick", [True, False])
def test_a_quiet_publish_line_on_a_disk_stores_on_the_event_loop_if_its_disk_is_quick(
    root: Path, monkeypatch: pytest.MonkeyPatch, disk_is_quick: bool
) -> None:
    """Publishes far apart on a quick disk are stored on the event loop's thread (no hop to the
    pool and back); on a disk slower than INLINE_BELOW_S they stay on the pool. The first one
    always goes to the pool: it measures the disk. (Publishes close together go to the pool:
    test_concurrent_publishes_share_flushes.)"""
    if on_memory_filesystem(str(root)):
        pytest.skip("the temp dir is on a memory filesystem")
    # "Quick" and "slow" are set against this disk: a limit no store reaches, and one all do.
    monkeypatch.setattr(publish_line, "INLINE_BELOW_S", 60.0 if disk_is_quick else 0.0)
    store = dirmq.Store(root)
    queue = store.create_queue("quiet")
    threads = threads_of(monkeypatch, "put_many")

    async def main() -> int:
        broker = Broker(store)
        try:
            longest = 0.0  # of the publishes so far, each of which waited for its store
            for i in range(6):
                began = time.monotonic()
                await broker.publish(queue, [OutgoingMessage(f"q{i}".encode())])
                longest = max(longest, time.monotonic() - began)
                # A quiet line: the next publish comes after several of its stores' time (the
                # line's test is a gap over twice their mean; a loaded disk's take long).
                await asyncio.sleep(max(0.05, 3 * longest))
            return threading.get_ident()
        finally:
            broker.close()

    loop_thread = run(main())
    assert threads[0] != loop_thread  # measures the disk
    if disk_is_quick:
        assert threads[1:] == [loop_thread] * 5
    else:
        assert loop_thread not in threads
    assert queue.stats().ready == 6


def test_a_lines_store_time_is_measured_on_the_event_loop() -> None:
    """A pool store's time counts only until the loop has stored (a pool thread's store waits
    for the GIL, and took twice as long): a slow mean keeps quiet stores on the pool but every
    PROBE_EVERY-th, which measures again; a limit of 0 keeps them all there."""
    times = store_load.StoreTimes()
    gap, limit = 10.0, 0.002  # a gap no mean makes short
    assert not times.on_loop(gap, limit)  # nothing measured yet: the pool measures
    times.timed(0.001, here=False)
    assert times.on_loop(gap, limit)
    times.timed(0.001, here=True)
    for _ in range(20):  # pool stores, slowed by the GIL: no longer counted
        times.timed(0.050, here=False)
    assert times.mean == pytest.approx(0.001) and times.on_loop(gap, limit)
    for _ in range(40):  # the disk got slow
        times.timed(0.010, here=True)
    decisions = [times.on_loop(gap, limit) for _ in range(2 * store_load.PROBE_EVERY)]
    assert decisions.count(True) == 2 and decisions[store_load.PROBE_EVERY - 1]
    assert not any(times.on_loop(gap, 0.0) for _ in range(2 * store_load.PROBE_EVERY))


def test_the_loops_first_store_time_replaces_the_pools() -> None:
    """A line whose stores were measured on the pool only (slowed by the GIL) stores its next
    one on the loop, whatever the gap, and that store's time is the mean from then on, not
    blended into theirs (which kept the mean over the limit, and probes need a long gap:
    at 1,000 msg/s the direct path stored on the pool for good)."""
    times = store_load.StoreTimes()
    gap, limit = 10.0, 0.002
    times.timed(0.004, here=False)
    assert times.on_loop(0.0, limit)  # measured on the pool only: the loop measures at once
    times.timed(0.0004, here=True)
    assert times.mean == pytest.approx(0.0004)
    assert times.on_loop(gap, limit)


def test_a_failed_flush_fails_every_request_of_its_batch(any_root: Path) -> None:
    store = dirmq.Store(any_root)
    queue = store.create_queue("gone")

    async def main() -> list[object]:
        broker = Broker(store)
        try:
            await broker.publish(queue, [OutgoingMessage(b"first")])  # the line exists
            store.delete_queue("gone")
            return await asyncio.gather(
                *(broker.publish(queue, [OutgoingMessage(b"x")]) for _ in range(20)),
                return_exceptions=True,
            )
        finally:
            broker.close()

    results = run(main())
    assert isinstance(results, list)
    assert all(isinstance(r, QueueNotFound) for r in results), results


def test_a_publish_after_the_pool_is_shut_down_is_refused(
    any_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A quiet line on a quick disk stores on the event loop, as on a memory filesystem: this
    # one is the pool's.
    monkeypatch.setattr(publish_line, "INLINE_BELOW_S", 0.0)
    store = dirmq.Store(any_root)
    queue = store.create_queue("late")

    async def main() -> object:
        broker = Broker(store)
        await broker.publish(queue, [OutgoingMessage(b"in time")])
        # The pool thread that stored it may still be finishing its turn (it would store a
        # publish that joins the line now, rightly); the case here is a line at rest.
        line = broker._publishers[queue.name]
        deadline = time.monotonic() + 30
        while line._draining and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        broker.close()
        try:
            return await broker.publish(queue, [OutgoingMessage(b"late")])
        except StorageError as exc:
            return exc

    outcome = run(main())
    if on_memory_filesystem(str(any_root)):  # the event loop stores it: no pool involved
        assert isinstance(outcome, list)
    else:
        assert isinstance(outcome, StorageError) and "shutting down" in str(outcome)
        assert queue.stats().ready == 1


def test_a_cancelled_publish_is_stored_all_the_same(any_root: Path) -> None:
    store = dirmq.Store(any_root)
    queue = store.create_queue("c")

    async def main() -> None:
        broker = Broker(store)
        try:
            publishes = [
                asyncio.ensure_future(broker.publish(queue, [OutgoingMessage(b"%d" % i)]))
                for i in range(10)
            ]
            await asyncio.sleep(0)  # each is in the line
            publishes[3].cancel()
            await asyncio.gather(*publishes, return_exceptions=True)
            await broker.publish(queue, [OutgoingMessage(b"last")])
        finally:
            broker.close()

    run(main())
    assert queue.stats().ready == 11


def test_publishes_after_close_fail_instead_of_hanging(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("late")

    async def main() -> None:
        broker = Broker(store)
        broker.close()
        with pytest.raises(StorageError):
            await asyncio.wait_for(broker.publish(queue, [OutgoingMessage(b"x")]), 5)

    if on_memory_filesystem(str(root.parent)):
        pytest.skip("the event loop drains publishes on a memory filesystem")
    run(main())


def test_long_polls_are_all_served_when_woken_by_other_threads(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("w")

    def publish_later() -> None:
        time.sleep(0.3)
        other = dirmq.Store(root).queue("w")
        for i in range(30):
            other.put(f"m{i}".encode())

    async def main() -> list[bytes]:
        broker = Broker(store)
        thread = threading.Thread(target=publish_later)
        try:
            polls = [asyncio.ensure_future(broker.receive(queue, 1, 30, 10)) for _ in range(30)]
            await asyncio.sleep(0.1)
            thread.start()
            results = await asyncio.gather(*polls)
            return [r[0].body for r in results]
        finally:
            thread.join()
            broker.close()

    bodies = run(main())
    # Each poll gets exactly one message. Which poll gets which is not promised: a poll's first
    # look at the queue runs on the thread pool, concurrently with the waiter line.
    assert isinstance(bodies, list)
    assert sorted(bodies) == sorted(f"m{i}".encode() for i in range(30))


def test_a_cancelled_long_poll_gives_its_message_back(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("c")

    async def main() -> None:
        broker = Broker(store)
        try:
            poll = asyncio.ensure_future(broker.receive(queue, 1, 30, 10))
            await asyncio.sleep(0.1)
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
            await broker.call(queue.put, b"kept")
            got = await broker.receive(queue, 1, 30, 5)
            assert [m.body for m in got] == [b"kept"]
        finally:
            broker.close()

    run(main())


def _slow_leases(
    monkeypatch: pytest.MonkeyPatch, seconds: float, until: Callable[[], bool] | None = None
) -> None:
    """Every get that leases something returns `seconds` late, as on a slow shared mount (or,
    with `until`, once `until()` holds: at most 10 s)."""
    real = dirmq.Queue.get

    def slow(self: dirmq.Queue, *args: object, **kwargs: object) -> list[dirmq.Message]:
        got = real(self, *args, **kwargs)  # type: ignore[arg-type]
        if got and until is None:
            time.sleep(seconds)
        elif got and until is not None:
            deadline = time.monotonic() + 10
            while not until() and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(seconds)
        return got

    monkeypatch.setattr(dirmq.Queue, "get", slow)


def test_a_poll_that_ends_while_leasing_passes_its_messages_to_the_next_waiter(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parked poll at the head of the line whose wait ends while the dispatcher leases for it
    must not cost the waiter behind it (a stream, waiting forever) its messages: they go to
    that waiter as leased, not back to the queue for whoever polls next."""
    store = dirmq.Store(root, watch_mode="poll", poll_interval_s=0.1)
    queue = store.create_queue("handover")
    given_back: list[list[str]] = []
    real_nack_each = dirmq.Queue.nack_each

    def recording(self: dirmq.Queue, receipts: object, delay_s: float = 0.0) -> object:
        receipts = list(receipts)  # type: ignore[call-overload]
        given_back.append(receipts)
        return real_nack_each(self, receipts, delay_s)

    monkeypatch.setattr(dirmq.Queue, "nack_each", recording)

    async def main() -> tuple[list[dirmq.Message], list[dirmq.Message]]:
        broker = Broker(store)
        try:
            poll = asyncio.ensure_future(broker.receive(queue, 5, 30, 1.0))
            await asyncio.sleep(0.3)  # the poll looked, found nothing and parked first
            stream = asyncio.ensure_future(broker.receive(queue, 5, 30, None))
            await asyncio.sleep(0.3)
            _slow_leases(monkeypatch, 1.0)  # the poll's wait ends during its lease
            # Published by another process: no notice, the dispatcher finds it by polling.
            other = dirmq.Store(root, watch_mode="poll").queue("handover")
            await asyncio.to_thread(other.put_many, [b"a", b"b"])
            return await asyncio.wait_for(poll, 5), await asyncio.wait_for(stream, 5)
        finally:
            broker.close()

    polled, streamed = run(main())  # type: ignore[misc]
    assert polled == []
    assert sorted(m.body for m in streamed) == [b"a", b"b"]
    assert all(m.receive_count == 1 for m in streamed)  # leased once: handed over, not nacked
    assert given_back == []


def test_messages_leased_for_a_poll_that_ended_are_given_back_at_once(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With nobody else waiting, what was leased for a poll whose wait ended is ready again
    (in one call), for the next receive, long before its 30 s lease would end."""
    store = dirmq.Store(root, watch_mode="poll", poll_interval_s=0.1)
    queue = store.create_queue("back")

    async def main() -> tuple[list[dirmq.Message], list[dirmq.Message]]:
        broker = Broker(store)
        try:
            poll = asyncio.ensure_future(broker.receive(queue, 5, 30, 2.0))
            await asyncio.sleep(0.2)
            with monkeypatch.context() as patch:
                # The poll's wait ends during its lease, however slow the machine: the lease
                # returns only once the poll is over.
                _slow_leases(patch, 0.1, until=poll.done)
                other = dirmq.Store(root, watch_mode="poll").queue("back")
                await asyncio.to_thread(other.put_many, [b"a", b"b"])
                async with asyncio.timeout(15):
                    polled = await poll
                await asyncio.sleep(0.5)  # until the lease is done: nobody waits for it then
            again: list[dirmq.Message] = []
            deadline = time.monotonic() + 5
            while len(again) < 2 and time.monotonic() < deadline:
                again += await broker.receive(queue, 5, 30, 0.2)
            return polled, again
        finally:
            broker.close()

    polled, again = run(main())  # type: ignore[misc]
    assert polled == []
    assert sorted(m.body for m in again) == [b"a", b"b"]
    assert all(m.receive_count == 2 for m in again)  # leased for the poll, then given back


def test_leases_and_acks_run_on_the_loop_until_one_stalls(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a local filesystem a lease line's store call runs on the event loop's thread (no
    hand-off to the pool); one call slower than INLINE_STALL_S sends the line to the pool, so a
    stalled disk stops holding up the loop."""
    store = dirmq.Store(root)
    queue = store.create_queue("inline")
    queue.put_many([f"m{i}".encode() for i in range(3)])
    queue.stats()  # the index is open: see the test below for the first use
    assert queue.indexed()
    threads: list[int] = []
    stall = [False]
    real = dirmq.Queue.get

    def recording(self: dirmq.Queue, *args: object, **kwargs: object) -> list[dirmq.Message]:
        threads.append(threading.get_ident())
        if stall[0]:
            stall[0] = False
            time.sleep(broker_module.INLINE_STALL_S * 2)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dirmq.Queue, "get", recording)

    async def main() -> int:
        broker = Broker(store)
        try:
            for expected in (1, 1, 1):
                got = await broker.receive(queue, 1, 30, 0)
                assert len(got) == expected
                await broker.ack(queue, got[0].receipt or "")
                stall[0] = len(threads) == 1  # the second lease stalls
            return threading.get_ident()
        finally:
            broker.close()

    loop_thread = run(main())
    assert threads[0] == loop_thread and threads[1] == loop_thread  # the stall ran here
    assert threads[2] != loop_thread  # then the line moved to the pool


def test_the_first_lease_of_a_queue_builds_its_index_on_the_pool(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an index a lease lists the queue's directories first (on a deep backlog,
    seconds): that one call runs on the pool, not on the loop every connection waits on."""
    with dirmq.Store(root) as other:  # another process's publishes
        other.create_queue("deep").put_many([f"m{i}".encode() for i in range(3)])
    store = dirmq.Store(root)
    queue = store.queue("deep")
    assert not queue.indexed()
    threads = threads_of(monkeypatch, "get")

    async def main() -> int:
        broker = Broker(store)
        try:
            for _ in range(2):
                (got,) = await broker.receive(queue, 1, 30, 0)
                await broker.ack(queue, got.receipt or "")
            return threading.get_ident()
        finally:
            broker.close()

    try:
        loop_thread = run(main())
    finally:
        store.close()
    assert threads[0] != loop_thread  # the index was built on the pool
    assert threads[1] == loop_thread  # and then the line runs on the loop


def test_leases_on_a_shared_filesystem_run_on_the_pool(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = dirmq.Store(root, shared=True)
    queue = store.create_queue("pooled")
    queue.put(b"m")
    threads = threads_of(monkeypatch, "get")

    async def main() -> int:
        broker = Broker(store)
        try:
            assert len(await broker.receive(queue, 1, 30, 0)) == 1
            return threading.get_ident()
        finally:
            broker.close()

    loop_thread = run(main())
    assert threads and threads[0] != loop_thread


def test_large_leases_and_acks_run_on_the_loop_a_chunk_at_a_time(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's 1,000-message lease or ack on a local disk runs on the event loop as calls of
    at most `INLINE_MAX_MESSAGES`, the loop free between them, not on a pool thread (where it
    held the queue's lock while waiting for the GIL, and the loop's own leases waited)."""
    chunk = broker_module.INLINE_MAX_MESSAGES
    assert chunk < 1000
    sizes = [chunk] * (1000 // chunk) + ([1000 % chunk] if 1000 % chunk else [])
    total = 1000 + 7
    store = dirmq.Store(root)
    queue = store.create_queue("big")
    queue.put_many([f"m{i}".encode() for i in range(total)])
    queue.stats()  # indexed: the first lease does not need the pool
    calls: list[tuple[str, int, int]] = []  # (what, how many, thread)
    real_get, real_ack = dirmq.Queue.get, dirmq.Queue.ack_each

    def get(self: dirmq.Queue, max_count: int, **kwargs: Any) -> list[dirmq.Message]:
        calls.append(("get", max_count, threading.get_ident()))
        return real_get(self, max_count, **kwargs)

    def ack_each(self: dirmq.Queue, receipts: list[str]) -> dict[str, Exception]:
        calls.append(("ack", len(receipts), threading.get_ident()))
        return real_ack(self, receipts)

    monkeypatch.setattr(dirmq.Queue, "get", get)
    monkeypatch.setattr(dirmq.Queue, "ack_each", ack_each)
    # A chunk slower than INLINE_STALL_S sends the rest to the pool by design: a stalled
    # machine (CI's, under load) must not decide what this test sees.
    monkeypatch.setattr(broker_module, "INLINE_STALL_S", 3600.0)
    between: list[int] = []  # how many store calls had been made each time the loop got a turn

    async def main() -> tuple[int, list[dirmq.Message], dict[str, Exception]]:
        broker = Broker(store)
        ticking = True

        async def tick() -> None:
            while ticking:
                between.append(len(calls))
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        try:
            got = await broker.receive(queue, 1000, 30, 0)
            failures = await broker.ack_many(queue, [m.receipt or "" for m in got])
            return threading.get_ident(), got, failures
        finally:
            ticking = False
            await ticker
            broker.close()

    try:
        loop_thread, got, failures = run(main())
        assert queue.stats().ready == total - 1000
    finally:
        store.close()
    assert len(got) == 1000 and not failures
    assert len({m.id for m in got}) == 1000
    assert [c[:2] for c in calls] == [("get", n) for n in sizes] + [("ack", n) for n in sizes]
    assert {thread for _, _, thread in calls} == {loop_thread}
    assert set(range(1, len(calls))) <= set(between)  # the loop ran between every two calls


def test_concurrent_gets_beyond_one_batch_are_served_not_told_the_queue_is_empty(
    root: Path,
) -> None:
    """Gets that arrive together share a lease of at most `MAX_GET_BATCH` messages. One the
    cap leaves without a share waits for the next batch: with 2,500 ready, three gets of
    1,000 that do not wait get 1,000, 1,000 and 500, none an empty answer."""
    store = dirmq.Store(root)
    queue = store.create_queue("deep")
    queue.put_many([f"m{i}".encode() for i in range(2500)])
    queue.stats()

    async def main() -> list[list[dirmq.Message]]:
        broker = Broker(store)
        try:
            return list(
                await asyncio.gather(*(broker.receive(queue, 1000, 30, 0) for _ in range(3)))
            )
        finally:
            broker.close()

    try:
        got = run(main())
        assert sorted(len(g) for g in got) == [500, 1000, 1000]
        assert len({m.id for g in got for m in g}) == 2500
        assert queue.stats().in_flight == 2500
    finally:
        store.close()


def _two_chunks(root: Path, name: str) -> tuple[dirmq.Store, dirmq.Queue]:
    """A queue of two inline chunks' worth of ready messages, indexed (leases run inline)."""
    store = dirmq.Store(root)
    queue = store.create_queue(name)
    queue.put_many([f"m{i}".encode() for i in range(2 * broker_module.INLINE_MAX_MESSAGES)])
    queue.stats()
    return store, queue


def _all_ready_again(queue: dirmq.Queue) -> None:
    """Wait (up to 10 s) for what was leased to be given back (on the pool): all ready."""
    deadline = time.monotonic() + 10
    while queue.stats().in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (2 * broker_module.INLINE_MAX_MESSAGES, 0)


@pytest.mark.parametrize("interruption", ["failure", "cancel"])
def test_a_lease_interrupted_after_its_first_chunk_gives_that_chunk_back(
    root: Path, monkeypatch: pytest.MonkeyPatch, interruption: str
) -> None:
    """A large lease runs a chunk at a time: a second chunk that fails, or a cancel at the
    turn between two chunks, leaves none of the first leased."""
    chunk = broker_module.INLINE_MAX_MESSAGES
    store, queue = _two_chunks(root, interruption)
    real_get = dirmq.Queue.get
    leasing: list[asyncio.Task[list[dirmq.Message]]] = []
    gets = [0]

    def get(self: dirmq.Queue, max_count: int, **kwargs: Any) -> list[dirmq.Message]:
        gets[0] += 1
        if interruption == "failure" and gets[0] == 2:
            raise dirmq.StorageError(5, "the disk failed (injected)")
        got = real_get(self, max_count, **kwargs)
        if interruption == "cancel":
            leasing[0].cancel()  # lands at the lease's next await: the turn between chunks
        return got

    monkeypatch.setattr(dirmq.Queue, "get", get)

    async def main() -> None:
        broker = Broker(store)
        try:
            leasing.append(asyncio.create_task(broker.lease(queue, 2 * chunk, 30)))
            expected = dirmq.StorageError if interruption == "failure" else asyncio.CancelledError
            with pytest.raises(expected):
                await leasing[0]
            assert gets[0] == (2 if interruption == "failure" else 1)
        finally:
            broker.close()  # (waits for nothing: the give-back may still be on the pool)

    try:
        run(main())
        _all_ready_again(queue)
    finally:
        store.close()


def test_messages_given_back_while_closing_are_ready_at_once(root: Path) -> None:
    """A request that ends while the server shuts down gives its leases back on the spot (the
    pool is gone): they do not wait out their lease, unseen by the next server's consumers."""
    store = dirmq.Store(root)
    queue = store.create_queue("closing")
    queue.put_many([b"a", b"b"])

    async def main() -> None:
        broker = Broker(store)
        got = await broker.receive(queue, 2, 300, 0)
        assert len(got) == 2
        broker.close()
        broker.give_back(queue, got)

    try:
        run(main())
        stats = queue.stats()
        assert (stats.ready, stats.in_flight) == (2, 0)
    finally:
        store.close()


def test_closing_releases_waiting_polls(root: Path) -> None:
    store = dirmq.Store(root)
    queue = store.create_queue("r")

    async def main() -> list[object]:
        broker = Broker(store)
        poll = asyncio.ensure_future(broker.receive(queue, 1, 30, 30))
        await asyncio.sleep(0.1)
        broker.close()
        return await asyncio.wait_for(poll, 2)

    assert run(main()) == []


def test_batch_settles_are_one_store_call_each(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ack_many`, `extend_many`: one call of the store's per-receipt primitive for the whole
    batch (each receipt once), the failures by receipt, the acks counted."""
    store = dirmq.Store(root)
    queue = store.create_queue("settle")
    queue.put_many([b"m"] * 6)
    receipts = [m.receipt or "" for m in queue.get(6)]
    calls: list[tuple[str, list[str]]] = []
    for name in ("ack_each", "extend_each"):
        real = getattr(dirmq.Queue, name)

        def recording(
            self: dirmq.Queue, got: list[str], *args: object, _n: str = name, _real: object = real
        ) -> dict[str, Exception]:
            calls.append((_n, list(got)))
            return _real(self, got, *args)  # type: ignore[operator, no-any-return]

        monkeypatch.setattr(dirmq.Queue, name, recording)
    acked: list[int] = []

    class Counts:
        def published(self, count: int) -> None: ...
        def delivered(self, count: int) -> None: ...
        def acked(self, count: int) -> None:
            acked.append(count)

        def nacked(self, count: int) -> None: ...

    async def main() -> tuple[dict[str, Exception], ...]:
        broker = Broker(store, counts=Counts())
        try:
            extended = await broker.extend_many(queue, [*receipts, receipts[0], "x"], 60.0)
            first = await broker.ack_many(queue, [*receipts[:4], receipts[0], "nonsense"])
            nacked = await broker.nack_many(queue, [receipts[4], receipts[0]])
            return extended, first, nacked, await broker.ack_many(queue, [])
        finally:
            broker.close()

    extended, first, nacked, empty = run(main())  # type: ignore[misc]
    assert calls == [("extend_each", [*receipts, "x"]), ("ack_each", [*receipts[:4], "nonsense"])]
    assert list(extended) == ["x"] and list(first) == ["nonsense"]
    assert list(nacked) == [receipts[0]] and isinstance(nacked[receipts[0]], dirmq.StaleReceipt)
    assert empty == {}
    assert acked == [4]
    stats = queue.stats()
    assert (stats.ready, stats.in_flight) == (1, 1)
