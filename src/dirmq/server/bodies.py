"""Large request bodies written to their sink as they arrive, with back-pressure.

A body of at least `STREAM_BODY_BYTES` that a dialect gives a sink for (`contract.BodySinkFor`:
the native publish gives the message's file) is not gathered in memory: `http.py` hands each
piece it parses to the connection's `Upload`, which writes what has gathered on a thread (one of
`WRITER_THREADS` per worker), one write of at most `JOB_BYTES` at a time, in order, while the
event loop reads on. When more than `WINDOW_BYTES` wait for the disk, the connection stops
reading (`behind`; the kernel's buffers fill and TCP stops the client) until the writer is back
under `RESUME_BYTES`: the backlog falls a job at a time, so reading resumes while the writer
still has work, and the disk is never left waiting for the network. So an upload holds at most
about a window in memory whatever its size, and the window is what the server's `MemoryBudget`
is charged for it.

A failed write (a full disk) ends the writing: the rest of the body is read and dropped, and the
request's handler gets the error from `written()`. However the request ends (answered, refused,
its client gone mid-body), the runtime `close`s its upload, which discards the sink once no
write is in flight: what the application published is no longer the sink's to discard.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from dirmq.server.contract import BodySink

log = logging.getLogger("dirmq.server")

STREAM_BODY_BYTES = 1024 * 1024  # bodies from this size on may go to a sink as they arrive
WINDOW_BYTES = 4 * 1024 * 1024  # received, not yet written: reading pauses at this...
RESUME_BYTES = 2 * 1024 * 1024  # ...and resumes under this, while the writer still has work
JOB_BYTES = 1024 * 1024  # what one write takes at most: the backlog falls a step at a time
WRITER_THREADS = 4  # uploads written at once, per worker process


_writers: ThreadPoolExecutor | None = None


def _reset_writers() -> None:
    global _writers
    _writers = None


os.register_at_fork(after_in_child=_reset_writers)  # a forked worker makes its own threads


def _executor() -> ThreadPoolExecutor:
    global _writers
    if _writers is None:
        _writers = ThreadPoolExecutor(WRITER_THREADS, thread_name_prefix="dirmq-upload")
    return _writers


def window_for(size: int) -> int:
    """What an upload of `size` bytes is charged to the budget: more than it holds at most
    (a window, and the piece that went over it)."""
    return min(size, WINDOW_BYTES + JOB_BYTES)


def _write(sink: BodySink, pieces: list[bytes]) -> int:
    sink.write(pieces)  # as they came: no join, no copy
    return sum(len(piece) for piece in pieces)


def _discard(sink: BodySink) -> None:
    try:
        sink.discard()
    except Exception:  # nothing to answer any more: say it, and leave it to recovery
        log.exception("discarding an upload's sink failed")


class Upload:
    """One request body on its way to its sink (`contract.ReceivedBody`). Every method runs on
    the event loop; `progress` is called there when the writer has caught up (`behind` turned
    false) or failed, so the connection reads again."""

    __slots__ = (
        "_busy",
        "_closed",
        "_complete",
        "_error",
        "_loop",
        "_pieces",
        "_progress",
        "_sink",
        "_waiter",
        "backlog",
        "behind",
        "received",
        "size",
    )

    def __init__(self, sink: BodySink, size: int, progress: Callable[[], None]) -> None:
        self.size = size
        self.received = 0
        self.backlog = 0  # received, not yet written
        self.behind = False  # the connection must not read: too much waits for the writer
        self._sink = sink
        self._progress = progress
        self._loop = asyncio.get_running_loop()
        self._pieces: list[bytes] = []
        self._busy = False  # a write is in flight
        self._complete = False  # every byte received
        self._closed = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None

    def feed(self, piece: bytes) -> None:
        self.received += len(piece)
        if self._error is not None or self._closed:
            return  # dropped: the request's answer is the error
        self._pieces.append(piece)
        self.backlog += len(piece)
        if self.backlog >= WINDOW_BYTES:
            self.behind = True
        if not self._busy:
            self._write_next()

    def finish(self) -> None:
        """Every byte of the body was received (llhttp checked its Content-Length)."""
        self._complete = True
        self._settle()

    async def written(self) -> BodySink:
        if not self._done():
            self._waiter = self._loop.create_future()
            await self._waiter
        if self._error is not None:
            raise self._error
        return self._sink

    def close(self) -> None:
        """The request is over: discard the sink (once the write in flight is done)."""
        if self._closed:
            return
        self._closed = True
        self._pieces = []
        self.backlog = 0
        if not self._busy:
            self._loop.run_in_executor(_executor(), _discard, self._sink)
        if self._waiter is not None and not self._waiter.done():
            self._error = self._error or ConnectionResetError("the request ended")
            self._waiter.set_result(None)

    def _write_next(self) -> None:
        """Hand the writer the oldest pieces, up to `JOB_BYTES` (at least one)."""
        pieces, taken, count = self._pieces, 0, 0
        while count < len(pieces) and (count == 0 or taken + len(pieces[count]) <= JOB_BYTES):
            taken += len(pieces[count])
            count += 1
        pieces, self._pieces = pieces[:count], pieces[count:]
        self._busy = True
        future = self._loop.run_in_executor(_executor(), _write, self._sink, pieces)
        future.add_done_callback(self._written)

    def _written(self, future: asyncio.Future[int]) -> None:
        self._busy = False
        if self._closed:
            self._loop.run_in_executor(_executor(), _discard, self._sink)
            return
        if future.cancelled():
            error: BaseException | None = ConnectionResetError("the server is closing")
        else:
            error = future.exception()
        if error is not None:
            self._error = error
            self._pieces = []
            self.backlog = 0
        else:
            self.backlog -= future.result()
            if self._pieces:
                self._write_next()
        if self.behind and self.backlog <= RESUME_BYTES:
            self.behind = False
            self._progress()
        self._settle()

    def _done(self) -> bool:
        return self._error is not None or (self._complete and not self._busy and not self._pieces)

    def _settle(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self._done():
            waiter.set_result(None)
