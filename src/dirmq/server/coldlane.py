"""The cold lane: the store calls of queues this worker is only taking up, run on the broker's
pool a few at a time.

A queue's first call in a process builds its index (its watches added, its state directories
listed: on a deep backlog, seconds), and a long poll on a queue that cannot be subscribed to on
the event loop subscribes on the pool. A burst of them (thousands of queues polled at once,
after a restart) handed to the pool one call each stood in the pool's queue ahead of every
publish and delivery of the worker: a publish sent during a burst of 5,000 reached its waiting
poll after 7.4 s. Here they wait in a line of their own, worked by at most `LANES` pool threads
a batch at a time, the next batch handed out once the event loop has taken the last one's
results: the pool keeps its other threads for everything else, a burst costs a hand-off to a
pool thread per batch, not per call, and it takes what the event loop leaves of the CPU rather
than racing the requests and deliveries for it.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
# Pool threads at most on the cold line at once. More than one: a deep queue's first use (its
# listing, seconds) must not hold up every other queue's. Few: on 2 cores, each busy thread
# is one more holder of the GIL the event loop waits for between its system calls.
LANES = 2
# Calls a lane takes at a time: a turn of the event loop runs at most LANES * BATCH of them
# (a few ms of a pool thread's work), so deliveries and requests are not starved of the CPU
# and the GIL by a burst of first uses.
BATCH = 16
Done = Callable[[Any, BaseException | None], None]


class ColdLane:
    """Calls run in arrival order by up to `lanes` threads of a pool; each caller told on the
    event loop."""

    def __init__(self, submit: Callable[[Callable[[], None]], Future[Any]], lanes: int = LANES):
        self._submit = submit  # the broker's pool: RuntimeError once it is shut down
        self._lanes = lanes
        self._running = 0  # lanes submitted and not yet ended (changed on the loop only)
        self._calls: deque[tuple[Callable[[], Any], Done]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._start_scheduled = False

    def submit(self, call: Callable[[], Any], done: Done) -> None:
        """Run `call()` on the cold line; `done(result, None)`, or `done(None, error)`, on the
        event loop once it has run (from the event loop)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        self._calls.append((call, done))
        if not self._start_scheduled:  # at the end of this turn: its calls in one batch
            self._start_scheduled = True
            self._loop.call_soon(self._start_lanes)

    async def run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn(*args, **kwargs)` on the cold line, awaited."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self.submit(functools.partial(fn, *args, **kwargs), functools.partial(_settle, future))
        return await future

    def _start_lanes(self) -> None:
        self._start_scheduled = False
        calls = self._calls
        while self._running < self._lanes and calls:
            batch = [calls.popleft() for _ in range(min(BATCH, len(calls)))]
            try:
                self._submit(functools.partial(self._lane, batch))
            except RuntimeError as exc:  # the pool is shut down: nothing here will run
                for _call, done in [*batch, *calls]:
                    done(None, exc)
                calls.clear()
                return
            self._running += 1

    def _lane(self, batch: list[tuple[Callable[[], Any], Done]]) -> None:
        """On a pool thread: `batch`, one call after another; the outcomes told in one go."""
        outcomes: list[tuple[Done, Any, BaseException | None]] = []
        try:
            for call, done in batch:
                try:
                    outcomes.append((done, call(), None))
                except Exception as exc:
                    outcomes.append((done, None, exc))
        finally:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._ended, outcomes)

    def _ended(self, outcomes: list[tuple[Done, Any, BaseException | None]]) -> None:
        """On the loop: a lane's batch is done. The next batch is handed out only now, a turn
        of the loop later: a loop busy with requests (long turns) gets few first uses done
        meanwhile, an idle one all of them back to back."""
        self._running -= 1
        self._start_lanes()
        for done, result, error in outcomes:
            done(result, error)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # its caller was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
