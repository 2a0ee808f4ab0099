"""Spreading connections and streams evenly over a server's workers.

With `--workers N` every worker listens on the same port with SO_REUSEPORT, and the kernel picks
a worker for each new connection by a hash of its addresses. A few long-lived connections (the
streaming consumers of a queue, a pool of keep-alive clients) then often land unevenly: two
streaming consumers on one worker of two get half the server (measured: a 60,000-message drain
by two streaming consumers ran at 16,400 msg/s split over both workers and at 7,500 msg/s with
both on one).

So a worker passes a connection on to a less loaded worker, at one of two moments, before it
has parsed or answered anything on it:
- when it accepts it while it holds more connections than another worker;
- when the connection's first bytes ask for a protocol upgrade (a streaming consumer) while it
  serves more streams than another worker: idle keep-alive connections weigh like busy ones in
  the first count, so the streams, which carry the load, are evened out on their own.
The socket goes over a Unix datagram socket (`SCM_RIGHTS`) with the bytes already read, and the
receiver serves it as if it had accepted it. A connection moves at most once at each moment: one
passed on at accept may move again for its upgrade (the accept counted it as one connection
among idle ones), one passed on for its upgrade stays. A stream counts for the worker that keeps
it from the moment its upgrade request is read, not from its 101: streams that arrive together
would otherwise each see the same counts and all stay where the kernel put them.

Each worker's counts live in memory shared by the run (`shared_slots`), written only by their
own worker and read by the others as a hint. A connection on its way counts for its receiver
from the moment it is sent: each worker counts what it sent to each other worker and what it
received from each, so a burst of connections accepted by one worker before the others have
read what it passed them is not all sent to the same one. TLS listeners pass nothing on: the
handshake runs before the server sees the connection.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

from dirmq.server.budget import WorkerSlots, shared_slots

# A draining worker's counts: nobody passes it anything more.
_LEAVING = 1 << 40
# The most bytes passed with a connection (one datagram): an upgrade request's head.
MAX_PASSED_BYTES = 32 * 1024
# Before them: the listener's index, the sender's worker number, the kind (0 connection, 1 stream).
_HEADER_BYTES = 3


class HasFileno(Protocol):
    def fileno(self) -> int: ...


# (listener index, socket, bytes read, `arrived`): `arrived` is to be called once the
# connection is counted here (or is known never to be: its client left before it was set up).
OnSocket = Callable[[int, socket.socket, bytes, Callable[[], None]], None]


class ConnectionBalance:
    """Created by the parent before forking; each worker then `attach`es as its number."""

    def __init__(self, workers: int) -> None:
        self._connections: WorkerSlots = shared_slots(workers)
        self._streams: WorkerSlots = shared_slots(workers)
        # Per kind (0: connections, 1: streams), [sender * workers + receiver]: passed so far
        # (written by the sender) and received so far (written by the receiver).
        self._sent = (shared_slots(workers * workers), shared_slots(workers * workers))
        self._got = (shared_slots(workers * workers), shared_slots(workers * workers))
        # [i][0]: worker i receives on it; [i][1]: every worker sends to worker i on it. The
        # parent keeps both, so a restarted worker finds its own again.
        self._pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(workers)]
        for receive, send in self._pairs:
            receive.setblocking(False)
            send.setblocking(False)
        self._workers = workers
        self._me = -1
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, worker: int, loop: asyncio.AbstractEventLoop, on_socket: OnSocket) -> None:
        """This process is worker `worker` (a restarted one starts from nothing): connections
        passed to it go to `on_socket`."""
        self._me = worker
        self._connections[worker] = 0
        self._streams[worker] = 0
        # What was on its way to a worker that died waits in its socket (the parent keeps it):
        # this one receives it, so the sent and received counts stay as they were.
        self._loop = loop
        receiver = self._pairs[worker][0]
        loop.add_reader(receiver.fileno(), self._receive, receiver, on_socket)

    # -- this worker's counts --------------------------------------------------------------------
    def opened(self) -> None:
        self._add(self._connections, 1)

    def closed(self) -> None:
        self._add(self._connections, -1)

    def stream_opened(self) -> None:
        self._add(self._streams, 1)

    def stream_closed(self) -> None:
        self._add(self._streams, -1)

    def _add(self, counts: WorkerSlots, change: int) -> None:
        if counts[self._me] < _LEAVING:  # a leaving worker's count stays put
            counts[self._me] += change

    # -- passing on ------------------------------------------------------------------------------
    def pass_connection(self, sock: HasFileno | None, listener: int) -> bool:
        """Pass the just-accepted `sock` to a worker holding fewer connections than this one;
        True if it went (the caller then closes its own copy)."""
        return self._pass(0, sock, listener, b"")

    def pass_stream(self, sock: HasFileno | None, listener: int, data: bytes) -> bool:
        """Pass a connection whose first bytes `data` ask for an upgrade to a worker serving
        fewer streams; True if it went."""
        if len(data) > MAX_PASSED_BYTES:
            return False
        return self._pass(1, sock, listener, data)

    def _pass(self, kind: int, sock: HasFileno | None, listener: int, data: bytes) -> bool:
        """To the worker with the fewest of `kind` (those on their way to it included), if
        fewer than this one's (which does not count the connection yet): the difference then
        stays at most one."""
        if sock is None or self._me < 0:
            return False
        me = self._me
        target, fewest = -1, self._load(kind, me)
        for worker in range(self._workers):
            if worker != me:
                load = self._load(kind, worker)
                if load < fewest:
                    target, fewest = worker, load
        if target < 0:
            return False
        try:
            socket.send_fds(
                self._pairs[target][1], [bytes([listener, me, kind]) + data], [sock.fileno()]
            )
        except OSError:  # its buffer is full, or the socket is gone: serve it here
            return False
        self._sent[kind][me * self._workers + target] += 1
        return True

    def _load(self, kind: int, worker: int) -> int:
        """`worker`'s count of `kind` and what is on its way to it."""
        count = (self._connections, self._streams)[kind][worker]
        if count >= _LEAVING:
            return count
        sent, got, workers = self._sent[kind], self._got[kind], self._workers
        for other in range(workers):
            count += sent[other * workers + worker] - got[worker * workers + other]
        return count

    # -- receiving -------------------------------------------------------------------------------
    def leave(self) -> None:
        """Draining: take nothing more; what was already sent is served (and drained)."""
        if self._me < 0:
            return
        self._connections[self._me] = _LEAVING
        self._streams[self._me] = _LEAVING
        if self._loop is not None:
            self._loop.remove_reader(self._pairs[self._me][0].fileno())

    def take_waiting(self, on_socket: OnSocket) -> None:
        """Serve what was passed to this worker and not yet read (at drain)."""
        if self._me >= 0:
            self._receive(self._pairs[self._me][0], on_socket)

    def _receive(self, receiver: socket.socket, on_socket: OnSocket) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(
                    receiver, MAX_PASSED_BYTES + _HEADER_BYTES, 4
                )
            except OSError:  # BlockingIOError: nothing more waiting
                return
            for fd in fds:
                sock = socket.socket(fileno=fd)
                if len(data) < _HEADER_BYTES or data[1] >= self._workers or data[2] > 1:
                    sock.close()
                    continue
                # On its way until its connection is counted here (a stream's upgrade is
                # counted a moment later, once its request is read): then it stops counting.
                arrived = _Once(self._got[data[2]], self._me * self._workers + data[1])
                try:
                    on_socket(data[0], sock, data[_HEADER_BYTES:], arrived)
                except OSError:
                    arrived()


class _Once:
    """Adds one to a received count, the first time it is called."""

    __slots__ = ("_index", "_slots")

    def __init__(self, slots: WorkerSlots, index: int) -> None:
        self._slots: WorkerSlots | None = slots
        self._index = index

    def __call__(self) -> None:
        if self._slots is not None:
            self._slots[self._index] += 1
            self._slots = None
