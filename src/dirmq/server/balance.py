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
receiver serves it as if it had accepted it. A connection moves at most once.

Each worker's counts live in memory shared by the run (`shared_slots`), written only by their
own worker and read by the others as a hint. TLS listeners pass nothing on: the handshake runs
before the server sees the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from typing import Protocol

from dirmq.server.budget import WorkerSlots, shared_slots

# A draining worker's counts: nobody passes it anything more.
_LEAVING = 1 << 40
# The most bytes passed with a connection (one datagram): an upgrade request's head.
MAX_PASSED_BYTES = 32 * 1024


class HasFileno(Protocol):
    def fileno(self) -> int: ...


OnSocket = Callable[[int, socket.socket, bytes], None]  # (listener index, socket, bytes read)


class ConnectionBalance:
    """Created by the parent before forking; each worker then `attach`es as its number."""

    def __init__(self, workers: int) -> None:
        self._connections: WorkerSlots = shared_slots(workers)
        self._streams: WorkerSlots = shared_slots(workers)
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
        self._loop = loop
        receiver = self._pairs[worker][0]
        loop.add_reader(receiver.fileno(), self._receive, receiver, on_socket)

    # -- this worker's counts --------------------------------------------------------------------
    def opened(self) -> None:
        if self._connections[self._me] < _LEAVING:
            self._connections[self._me] += 1

    def closed(self) -> None:
        if self._connections[self._me] < _LEAVING:
            self._connections[self._me] -= 1

    def stream_opened(self) -> None:
        if self._streams[self._me] < _LEAVING:
            self._streams[self._me] += 1

    def stream_closed(self) -> None:
        if self._streams[self._me] < _LEAVING:
            self._streams[self._me] -= 1

    # -- passing on ------------------------------------------------------------------------------
    def pass_connection(self, sock: HasFileno | None, listener: int) -> bool:
        """Pass the just-accepted `sock` to a worker holding fewer connections than this one;
        True if it went (the caller then closes its own copy)."""
        return self._pass(self._connections, sock, listener, b"")

    def pass_stream(self, sock: HasFileno | None, listener: int, data: bytes) -> bool:
        """Pass a connection whose first bytes `data` ask for an upgrade to a worker serving
        fewer streams; True if it went."""
        if len(data) > MAX_PASSED_BYTES:
            return False
        return self._pass(self._streams, sock, listener, data)

    def _pass(
        self, counts: WorkerSlots, sock: HasFileno | None, listener: int, data: bytes
    ) -> bool:
        """To the worker with the fewest `counts`, if fewer than this one's (which does not
        count the connection yet): the difference then stays at most one."""
        if sock is None or self._me < 0:
            return False
        target, fewest = -1, counts[self._me]
        for worker in range(self._workers):
            count = counts[worker]
            if worker != self._me and count < fewest:
                target, fewest = worker, count
        if target < 0:
            return False
        try:
            socket.send_fds(self._pairs[target][1], [bytes([listener]) + data], [sock.fileno()])
        except OSError:  # its buffer is full, or the socket is gone: serve it here
            return False
        return True

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

    @staticmethod
    def _receive(receiver: socket.socket, on_socket: OnSocket) -> None:
        while True:
            try:
                data, fds, _flags, _addr = socket.recv_fds(receiver, MAX_PASSED_BYTES + 1, 4)
            except OSError:  # BlockingIOError: nothing more waiting
                return
            for fd in fds:
                sock = socket.socket(fileno=fd)
                if not data:
                    sock.close()
                    continue
                with contextlib.suppress(OSError):
                    on_socket(data[0], sock, data[1:])
