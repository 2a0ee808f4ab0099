"""Sending a response body from its file (`contract.BodyFile`) without holding it in memory.

On a plain TCP connection whose write buffer is empty, the response's head and then the body go
straight to the socket from a thread of `_SENDERS`: `send` for the head, `os.sendfile` for the
body (the kernel copies page cache to socket, nothing passes through Python), `poll` for room
while the client reads slowly. The event loop cannot do it: uvloop has no `loop.sendfile` (its
transports are libuv's), and polling the transport's socket for writing on the loop would
compete with the transport's own handle. The thread has a duplicate of the socket's descriptor,
so a connection the loop closes meanwhile never hands its number to another connection under
our feet; `stop` ends the thread's sending at its next step.

Under TLS (or behind bytes still in the transport's buffer) the body is copied through the
transport in bounded pieces read off the loop, waiting for the buffer to drain between pieces:
memory stays at a piece plus the transport's high-water mark.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import socket
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from dirmq.server.contract import BodyFile

log = logging.getLogger("dirmq.server")
SENDFILE_STEP_BYTES = 4 * 1024 * 1024  # per sendfile call: a stop is seen between calls
COPY_PIECE_BYTES = 256 * 1024  # what the TLS path reads and writes at a time
POLL_SLICE_S = 0.5  # a thread waiting for room looks for a stop this often
SENDER_THREADS = 8

_senders: ThreadPoolExecutor | None = None


def _reset_senders() -> None:
    global _senders
    _senders = None


os.register_at_fork(after_in_child=_reset_senders)


def _executor() -> ThreadPoolExecutor:
    global _senders
    if _senders is None:
        _senders = ThreadPoolExecutor(SENDER_THREADS, thread_name_prefix="dirmq-sendfile")
    return _senders


async def send(
    transport: asyncio.Transport,
    head: bytes,
    file: BodyFile,
    timeout_s: float,
    writable: Callable[[], Awaitable[None]],
) -> None:
    """Send a response's `head`, then its body from `file` (closed once done with), the best
    way the transport allows. ConnectionError if the client left, stalled for `timeout_s`,
    or the sending failed (then the connection is aborted: part of the answer may be out, and
    a short body is the only honest signal left, never a hang)."""
    socket_fd = plain_socket(transport)
    try:
        if socket_fd is not None:
            try:
                sender = SocketSender(socket_fd, file, timeout_s)
            except BaseException:
                file.close()
                raise
            await sender.send(head)
        else:
            transport.write(head)
            await copy_file(transport, file, writable)
    except ConnectionError:
        raise
    except OSError as exc:
        log.error("sending a body from its file failed: %s", exc)
        transport.abort()
        raise ConnectionResetError("sending failed") from exc


def plain_socket(transport: asyncio.Transport) -> int | None:
    """The descriptor of the transport's TCP socket if the body may go to it directly: no TLS,
    nothing in the transport's buffer; else None."""
    if transport.get_extra_info("sslcontext") is not None:
        return None
    if transport.get_extra_info("ssl_object") is not None:
        return None
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6, socket.AF_UNIX):
        return None
    if transport.get_write_buffer_size():
        return None
    fileno: int = sock.fileno()
    return fileno if fileno >= 0 else None


class SocketSender:
    """Sends a head and a file's body to a socket from a thread (see the module docstring),
    and closes the file once the thread is done with it (never while it may read it: its
    descriptor's number could be another file's by then)."""

    def __init__(self, socket_fd: int, file: BodyFile, timeout_s: float) -> None:
        self._fd = os.dup(socket_fd)
        self._file = file
        self._timeout_s = timeout_s  # no progress for this long: the client is gone
        self._stopped = False
        self._sent_all = False  # set by the thread once the body's last byte is in the socket

    def stop(self) -> None:
        self._stopped = True

    async def send(self, head: bytes) -> None:
        """Send everything; ConnectionError if the client left (or stopped reading)."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(_executor(), self._send, head)
        except asyncio.CancelledError:
            # The thread may have sent it all before the loop learnt so, and the client read it
            # all and left (the cancel's usual cause): then the answer is out, and its follow-up
            # (yaq's ack) must run, or the message the client has would be delivered again.
            if self._sent_all:
                return
            self.stop()
            raise

    def _send(self, head: bytes) -> None:
        try:
            view = memoryview(head)
            while view:
                self._check()
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:
                    self._wait()
            file = self._file
            offset, end = file.offset, file.offset + file.size
            while offset < end:
                self._check()
                try:
                    sent = os.sendfile(
                        self._fd, file.fd, offset, min(SENDFILE_STEP_BYTES, end - offset)
                    )
                except BlockingIOError:
                    self._wait()
                    continue
                if sent == 0:
                    raise ConnectionResetError("the message file ended before its body did")
                offset += sent
            self._sent_all = True
        finally:
            os.close(self._fd)
            self._file.close()

    def _check(self) -> None:
        if self._stopped:
            raise ConnectionResetError("the connection closed")

    def _wait(self) -> None:
        """Until the socket takes more (ConnectionError once the client is gone or stalled)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        waited = 0.0
        while not self._stopped:
            events = poller.poll(POLL_SLICE_S * 1000)
            if events:
                if events[0][1] & (select.POLLERR | select.POLLHUP | select.POLLNVAL):
                    raise ConnectionResetError("the client went away")
                return
            waited += POLL_SLICE_S
            if waited >= self._timeout_s:
                raise ConnectionResetError(f"the client read nothing for {self._timeout_s:g} s")
        self._check()


async def copy_file(
    transport: asyncio.Transport, file: BodyFile, writable: Callable[[], Awaitable[None]]
) -> None:
    """Write the file's body through `transport` (TLS) a piece at a time, read off the loop;
    `writable()` returns once the transport's buffer is under its high-water mark. Closes the
    file when done (after a cancel: once the read in flight is over)."""
    loop = asyncio.get_running_loop()
    offset, end = file.offset, file.offset + file.size
    try:
        while offset < end:
            reading = loop.run_in_executor(
                _executor(), os.pread, file.fd, min(COPY_PIECE_BYTES, end - offset), offset
            )
            try:
                piece = await asyncio.shield(reading)
            except asyncio.CancelledError:
                reading.add_done_callback(lambda _done: file.close())
                raise
            if not piece:
                raise ConnectionResetError("the message file ended before its body did")
            if transport.is_closing():
                raise ConnectionResetError("client went away")
            transport.write(piece)
            offset += len(piece)
            await writable()
    except asyncio.CancelledError:
        raise
    except BaseException:
        file.close()
        raise
    file.close()
