"""The streaming receive for the synchronous client: one WebSocket (wsproto over a plain or TLS
socket) on `GET /{queue}/messages`, the server pushing messages while the credit allows, acks
flowing back (docs/http-api.md, "Streaming receive").

    with store.queue("jobs").consume(prefetch=100) as consumer:
        for message in consumer:
            handle(message)
            consumer.ack(message)

A `Consumer` belongs to one thread. Acks are buffered and sent together: before the consumer
blocks on its socket for more messages, once half the prefetch is buffered, at the first call
after `ACK_DELAY_S` (stream_core.py), by `flush()`, and on `close()`. Closing (or the process
dying) gives every message it still holds back to the queue at once.

The protocol itself (handshake, frames, tags, buffered acks) is stream_core.py's, without I/O;
this module holds the two shells over it that move its bytes: the blocking `Consumer` (a socket,
plain or TLS) and `AsyncConsumer` (asyncio streams).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from urllib.parse import urlsplit

import httpx

from dirmq import errors
from dirmq.client import tls
from dirmq.client.stream_core import StreamCore
from dirmq.store import Message

READ_BYTES = 256 * 1024
CLOSE_WAIT_S = 2.0  # for the server's answer to our close frame


class StreamTarget:
    """Where a consumer connects, and how: what a `RemoteStore` knows."""

    def __init__(
        self,
        url: str,
        headers: dict[str, str],
        verify: ssl.SSLContext | bool,
        timeout_s: float,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise errors.InvalidArgument(f"not an http(s) URL: {url!r}")
        self.url = url
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.tls else 80)
        self.base_path = parts.path.rstrip("/")
        self.headers = headers
        self.verify = verify
        self.timeout_s = timeout_s

    def ssl_context(self) -> ssl.SSLContext:
        if isinstance(self.verify, ssl.SSLContext):
            return self.verify
        return httpx.create_ssl_context()  # httpx's default trust, as the HTTP client's

    def connect(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as exc:
            raise errors.StorageIOError(0, f"cannot reach dirmq at {self.url}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.tls:
            return sock
        try:
            return self.ssl_context().wrap_socket(sock, server_hostname=self.host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise errors.StorageIOError(
                0, f"cannot reach dirmq at {self.url}: {exc}{tls.hint(str(exc))}"
            ) from exc


class Consumer:
    """A streaming consumer of one queue: an iterator of leased messages (blocking while the
    queue is empty), `ack`/`ack_through`/`nack` to settle them, a context manager."""

    def __init__(
        self,
        target: StreamTarget,
        queue: str,
        *,
        prefetch: int = 100,
        visibility_s: float | None = None,
    ) -> None:
        self.queue = queue
        self.prefetch = prefetch
        self._closed = True  # until connected
        self._core = core = StreamCore(target, queue, prefetch, visibility_s)
        self.failures = core.failures
        self._sock = target.connect()
        try:
            self._write(core.handshake())
            while not core.accepted:
                self._receive()
        except BaseException:
            self._sock.close()
            raise
        self._closed = False
        self._sock.settimeout(None)

    # -- iteration ----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.get()
        if message is None:
            raise StopIteration
        return message

    def get(self, timeout_s: float | None = None) -> Message | None:
        """The next message, waiting up to `timeout_s` (None: until one comes); None if none
        came in time or the stream ended (`closed` tells which)."""
        core = self._core
        if core.acks_due():
            self.flush()
        message = core.next_ready()
        if message is not None or core.ended is not None:
            return message
        self.flush()  # before blocking: the acks give the server the credit to send more
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not core.ready and core.ended is None:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._sock.settimeout(left)
            try:
                self._receive()
            except TimeoutError:
                return None
            finally:
                if deadline is not None:
                    self._sock.settimeout(None)
        return core.next_ready()

    @property
    def closed(self) -> bool:
        """Whether the stream has ended (closed here, by the server, or lost)."""
        return self._closed or self._core.ended is not None

    # -- settling -----------------------------------------------------------------------------
    def holds(self, receipt: str) -> bool:
        """Whether `receipt` is of a message this consumer received and has not settled."""
        return receipt in self._core.tags

    def ack(self, message: Message | str) -> None:
        """Acknowledge a message (or its receipt): buffered, sent with the next batch."""
        if self._core.ack(message):
            self.flush()

    def ack_through(self, message: Message | str) -> None:
        """Acknowledge `message` and every message received before it (one small frame, sent
        now: cheaper than acking each)."""
        self._write(self._core.ack_through(message))

    def nack(self, message: Message | str, delay_s: float = 0.0) -> None:
        """Give a message back (ready again at once, or after `delay_s`): sent now."""
        self._write(self._core.nack(message, delay_s))

    def flush(self) -> None:
        """Send the buffered acks now."""
        self._write(self._core.flush())

    # -- closing ------------------------------------------------------------------------------
    def close(self) -> None:
        """Send the buffered acks, then close: what is still held goes back to the queue."""
        if self._closed:
            return
        try:
            goodbye = self._core.close()
            if goodbye:
                self._write(goodbye)
                self._sock.settimeout(CLOSE_WAIT_S)
                while self._core.ended is None:  # the server's close frame: acks all taken
                    self._receive()
        except (OSError, errors.DirmqError):
            pass
        finally:
            self._closed = True
            self._sock.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):  # (an object whose __init__ failed has none)
            self._sock.close()

    # -- inside -------------------------------------------------------------------------------
    def _receive(self) -> None:
        """One read from the socket, its events taken."""
        try:
            data = self._sock.recv(READ_BYTES)
        except TimeoutError:
            raise
        except OSError as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream from {url} broke: {exc}") from exc
        self._write(self._core.received(data))

    def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._sock.sendall(data)
        except OSError as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream to {url} broke: {exc}") from exc


class AsyncConsumer:
    """`Consumer` for asyncio: `async for`, `await consumer.get()`, `async with`; `ack` is
    buffered as there (a plain call), the rest awaits. Made by `AsyncRemoteQueue.consume`."""

    def __init__(
        self, core: StreamCore, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ):
        self._core = core
        self._reader = reader
        self._writer = writer
        self.failures = core.failures
        self._closed = False

    @classmethod
    async def connect(
        cls,
        target: StreamTarget,
        queue: str,
        *,
        prefetch: int = 100,
        visibility_s: float | None = None,
    ) -> AsyncConsumer:
        core = StreamCore(target, queue, prefetch, visibility_s)
        context = target.ssl_context() if target.tls else None
        try:
            # `asyncio.timeout`, not `wait_for`, here and below: Python 3.11's `wait_for`
            # swallows a cancellation that lands as the awaited thing completes.
            async with asyncio.timeout(target.timeout_s):
                reader, writer = await asyncio.open_connection(
                    target.host, target.port, ssl=context, limit=READ_BYTES * 4
                )
        except (OSError, TimeoutError, ssl.SSLError) as exc:
            raise errors.StorageIOError(
                0, f"cannot reach dirmq at {target.url}: {exc}{tls.hint(str(exc))}"
            ) from exc
        consumer = cls(core, reader, writer)
        try:
            await consumer._write(core.handshake())
            while not core.accepted:
                async with asyncio.timeout(target.timeout_s):
                    await consumer._receive()
        except BaseException:
            writer.close()
            raise
        return consumer

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        message = await self.get()
        if message is None:
            raise StopAsyncIteration
        return message

    async def get(self, timeout_s: float | None = None) -> Message | None:
        """As `Consumer.get`."""
        core = self._core
        if core.acks_due():
            await self.flush()
        message = core.next_ready()
        if message is not None or core.ended is not None:
            return message
        await self.flush()
        try:
            async with asyncio.timeout(timeout_s):
                while not core.ready and core.ended is None:
                    await self._receive()
        except TimeoutError:
            return None
        return core.next_ready()

    @property
    def closed(self) -> bool:
        return self._closed or self._core.ended is not None

    def holds(self, receipt: str) -> bool:
        return receipt in self._core.tags

    async def ack(self, message: Message | str) -> None:
        if self._core.ack(message):
            await self.flush()

    async def ack_through(self, message: Message | str) -> None:
        await self._write(self._core.ack_through(message))

    async def nack(self, message: Message | str, delay_s: float = 0.0) -> None:
        await self._write(self._core.nack(message, delay_s))

    async def flush(self) -> None:
        await self._write(self._core.flush())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            goodbye = self._core.close()
            if goodbye:
                await self._write(goodbye)
                async with asyncio.timeout(CLOSE_WAIT_S):
                    while self._core.ended is None:
                        await self._receive()
        except (OSError, TimeoutError, errors.DirmqError):
            pass
        finally:
            self._writer.close()
            with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self._writer.wait_closed()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def _receive(self) -> None:
        try:
            data = await self._reader.read(READ_BYTES)
        except (OSError, ssl.SSLError) as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream from {url} broke: {exc}") from exc
        await self._write(self._core.received(data))

    async def _write(self, data: bytes) -> None:
        if not data:
            return
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (OSError, ssl.SSLError) as exc:
            url = self._core.target.url
            raise errors.StorageIOError(0, f"the stream to {url} broke: {exc}") from exc
