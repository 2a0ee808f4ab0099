"""The request-per-operation floor: the least a Python server on dirmq's stack (uvloop + httptools,
one process per core) can do to answer dirmq's consume requests, and nothing more.

`bench.peers` runs it beside dirmq, with the same load generator and the same wire forms, so
"dirmq GET + DELETE" and "dirmq GET max=50 + POST ack" each get a ratio to what no server on this
disk, this interpreter and these libraries beats. Per consumed message it makes the syscalls of
peers.py's bare-loop consume floor (a rename into `leased/`, an open + read + close, a rename
into a per-process pool directory) and answers over HTTP/1.1 keep-alive. What it leaves out is
what a queue needs: no index (it knows its file names: `Admin` writes `000000000000`,
`000000000001`, ... and their count in `count`), no lease deadlines or receive counts, no lock,
no inotify, no metrics, no logs, no routing, no authentication, no checksums, no headers beyond
what the client reads.

    python -m bench.floor_server --root DIR [--workers 2]    # prints "listening on PORT"

The wire, as dirmq's (what `bench.peers`'s `DirmqLoad` reads):
- `GET /{q}/messages`: 200 with the body and `X-Receipt`, or 204 when the queue is drained;
- `GET /{q}/messages?max=N`: 200 multipart/mixed, a part per message with its `X-Receipt`;
- `DELETE /{q}/messages/{receipt}`: 204;
- `POST /{q}/messages/ack` with `{"receipts": [...]}`: 200 `{"settled": n, "failed": []}`;
- `GET /health`: 200, nothing looked at (`bench.scale`'s floor of a connection and a request).

Worker n of W takes the messages n, n+W, n+2W, ... first, then the others' from the end, so
the workers race for a name only near the end of a drain (a lost race is one ENOENT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any

BOUNDARY = "floorboundary"
MULTIPART = f'multipart/mixed; boundary="{BOUNDARY}"'.encode()


def names_for(worker: int, workers: int, count: int) -> Iterator[str]:
    """The order in which worker `worker` tries the message files: its own share, then the rest
    from the end (others' shares, which their owners take from the front)."""
    yield from (f"{i:012d}" for i in range(worker, count, workers))
    yield from (f"{i:012d}" for i in range(count - 1, -1, -1) if i % workers != worker)


class Floor:
    """One worker's state: each queue's name order, and its pool directory."""

    def __init__(self, root: str, worker: int, workers: int) -> None:
        self.root = root
        self.worker = worker
        self.workers = workers
        self.orders: dict[str, Iterator[str]] = {}

    def _order(self, queue: str) -> Iterator[str]:
        order = self.orders.get(queue)
        if order is None:
            with open(os.path.join(self.root, queue, "count")) as f:
                count = int(f.read())
            os.makedirs(os.path.join(self.root, queue, f"pool{self.worker}"), exist_ok=True)
            order = self.orders[queue] = names_for(self.worker, self.workers, count)
        return order

    def lease(self, queue: str, wanted: int) -> list[tuple[str, bytes]]:
        """Up to `wanted` messages renamed into leased/ and read: (receipt, body) each."""
        base = os.path.join(self.root, queue)
        ready, leased = f"{base}/ready/", f"{base}/leased/"
        got: list[tuple[str, bytes]] = []
        for name in self._order(queue):
            try:
                os.rename(ready + name, leased + name)
            except FileNotFoundError:
                continue  # the other worker's, taken at the end of a drain
            fd = os.open(leased + name, os.O_RDONLY)
            try:
                got.append((name, os.read(fd, 65536)))
            finally:
                os.close(fd)
            if len(got) == wanted:
                break
        return got

    def ack(self, queue: str, receipts: list[str]) -> int:
        base = os.path.join(self.root, queue)
        leased, pool = f"{base}/leased/", f"{base}/pool{self.worker}/"
        settled = 0
        for receipt in receipts:
            if "/" in receipt:
                continue
            try:
                os.rename(leased + receipt, pool + receipt)
            except FileNotFoundError:
                continue
            settled += 1
        return settled


class FloorProtocol(asyncio.Protocol):
    """One keep-alive connection: httptools parses, each request is answered as it completes."""

    def __init__(self, floor: Floor) -> None:
        import httptools

        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None  # uvloop's TCPTransport (not an asyncio.Transport subclass)
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # a bad request: say so and hang up
            self._answer(400, str(exc).encode())
            self.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method, url, body = self.parser.get_method(), self.url, b"".join(self.body)
        self.url, self.body = b"", []
        path, _, query = url.decode().partition("?")
        parts = path.strip("/").split("/")
        if method == b"GET" and parts == ["health"]:  # a connection's floor (bench.scale)
            self._answer(200, b"ok\n")
        elif len(parts) < 2 or parts[1] != "messages":
            self._answer(404, b"not a floor route")
        elif method == b"GET" and len(parts) == 2:
            wanted = int(query[4:]) if query.startswith("max=") else 0
            self._get(parts[0], wanted)
        elif method == b"DELETE" and len(parts) == 3:
            self.floor.ack(parts[0], [parts[2]])
            self._answer(204, b"")
        elif method == b"POST" and parts[2:] == ["ack"]:
            settled = self.floor.ack(parts[0], json.loads(body)["receipts"])
            self._answer(200, json.dumps({"settled": settled, "failed": []}).encode())
        else:
            self._answer(405, b"not a floor method")

    def _get(self, queue: str, wanted: int) -> None:
        got = self.floor.lease(queue, wanted or 1)
        if not got:
            self._answer(204, b"")
        elif not wanted:
            receipt, body = got[0]
            self._answer(200, body, b"X-Receipt: " + receipt.encode() + b"\r\n")
        else:
            chunks = []
            for receipt, body in got:
                chunks.append(
                    b"--%s\r\nX-Receipt: %s\r\nContent-Length: %d\r\n\r\n%s\r\n"
                    % (BOUNDARY.encode(), receipt.encode(), len(body), body)
                )
            chunks.append(b"--%s--\r\n" % BOUNDARY.encode())
            self._answer(200, b"".join(chunks), b"Content-Type: " + MULTIPART + b"\r\n")

    def _answer(self, status: int, body: bytes, headers: bytes = b"") -> None:
        self.transport.write(
            b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n%s\r\n%s" % (status, len(body), headers, body)
        )


def serve_worker(sock: socket.socket, root: str, worker: int, workers: int) -> None:
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        floor = Floor(root, worker, workers)
        server = await loop.create_server(lambda: FloorProtocol(floor), sock=sock)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        server.close()

    uvloop.run(main())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--root", required=True, help="where the queues' directories are")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    sock.setblocking(False)
    children = []
    for worker in range(args.workers):
        pid = os.fork()
        if pid == 0:
            try:
                serve_worker(sock, args.root, worker, args.workers)
            finally:
                os._exit(0)
        children.append(pid)
    print(f"listening on {sock.getsockname()[1]}", flush=True)

    def stop(_signum: int, _frame: object) -> None:
        for pid in children:
            os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for pid in children:
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
