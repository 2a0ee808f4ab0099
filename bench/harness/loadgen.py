"""The load generator, run as child processes by `load.LoadChild`: raw uvloop sockets, HTTP/1.1
keep-alive (or RESP for Redis), exactly one request in flight per connection (no pipelining),
request bytes built once, and only the status line, Content-Length and X-Receipt parsed.

    python -m bench.harness.loadgen SPEC_JSON

It says `ready` once every connection is open, starts on `go` (stdin), says `sent` when its
window closes, then prints its result as one JSON line."""

from __future__ import annotations

import asyncio
import collections
import json
import math
import socket
import ssl
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import BODY, HOST
from bench.harness.load import write_result
from bench.harness.procs import raise_fd_limit
from bench.harness.wire import (
    RESP_ARRAY,
    RESP_BULK,
    RESP_INT,
    Reply,
    batch_body,
    header_value,
    http_request,
    parse_http,
    parse_resp,
    resp_command,
)


class Tally:
    """What one load process did; shared by its connections."""

    def __init__(self, max_ops: int) -> None:
        self.max_ops = max_ops
        self.deadline = math.inf  # perf_counter() time; set at "go"
        self.ops = 0
        self.requests = 0
        self.dry = 0  # connections that found the queue empty
        self.errors: collections.Counter[str] = collections.Counter()
        self.times: list[float] = []  # long polls: wall-clock time each message arrived

    def more(self) -> bool:
        return self.ops < self.max_ops and time.perf_counter() < self.deadline

    def error(self, code: int, payload: bytes | None) -> None:
        detail = (payload or b"")[:80].decode("latin-1")
        self.errors[f"{code}: {detail}" if code < 100 else str(code)] += 1


class Script:
    """What one connection sends: the first request, then the next one from each reply
    (None: this connection is done)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    def first(self) -> bytes:
        raise NotImplementedError

    def next(self, code: int, head: bytes, payload: bytes | None) -> bytes | None:
        raise NotImplementedError


class Repeat(Script):
    """The same request again and again; each reply with code `ok` counts `per_ok` messages."""

    def __init__(self, tally: Tally, request: bytes, ok: int, per_ok: int) -> None:
        super().__init__(tally)
        self.request, self.ok, self.per_ok = request, ok, per_ok

    def first(self) -> bytes:
        return self.request

    def next(self, code: int, head: bytes, payload: bytes | None) -> bytes | None:
        tally = self.tally
        tally.requests += 1
        if code == self.ok:
            tally.ops += self.per_ok
        else:
            tally.error(code, payload)
        return self.request if tally.more() else None


class Pop(Script):
    """Redis RPOP until the list is empty (a nil reply ends this connection)."""

    def __init__(self, tally: Tally, request: bytes) -> None:
        super().__init__(tally)
        self.request = request

    def first(self) -> bytes:
        return self.request

    def next(self, code: int, head: bytes, payload: bytes | None) -> bytes | None:
        tally = self.tally
        tally.requests += 1
        if code != RESP_BULK:
            tally.error(code, payload)
            return None
        if payload is None:
            tally.dry += 1
            return None
        tally.ops += 1
        return self.request if tally.more() else None


class GetAck(Script):
    """dirmq: GET a message (leasing it), then DELETE it by its receipt; one op per ack."""

    def __init__(self, tally: Tally, queue_name: str) -> None:
        super().__init__(tally)
        self.get = http_request("GET", f"/{queue_name}/messages")
        self.ack_prefix = f"DELETE /{queue_name}/messages/".encode()
        self.ack_suffix = f" HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()
        self.acking = False

    def first(self) -> bytes:
        return self.get

    def next(self, code: int, head: bytes, payload: bytes | None) -> bytes | None:
        tally = self.tally
        tally.requests += 1
        if self.acking:
            self.acking = False
            if code == 204:
                tally.ops += 1
            else:
                tally.error(code, payload)
            return self.get if tally.more() else None
        if code == 204:
            tally.dry += 1
            return None
        receipt = header_value(head, b"X-Receipt") if code == 200 else None
        if receipt is None:
            tally.error(code, payload)
            return None
        self.acking = True
        return self.ack_prefix + receipt + self.ack_suffix


class MoveRemove(Script):
    """Redis reliable queue: LMOVE src -> processing, then LREM it from processing (the ack)."""

    def __init__(self, tally: Tally, source: str, processing: str) -> None:
        super().__init__(tally)
        self.move = resp_command(b"LMOVE", source.encode(), processing.encode(), b"RIGHT", b"LEFT")
        self.processing = processing.encode()
        self.acking = False

    def first(self) -> bytes:
        return self.move

    def next(self, code: int, head: bytes, payload: bytes | None) -> bytes | None:
        tally = self.tally
        tally.requests += 1
        if self.acking:
            self.acking = False
            if code == RESP_INT:
                tally.ops += 1
            else:
                tally.error(code, payload)
            return self.move if tally.more() else None
        if code != RESP_BULK:
            tally.error(code, payload)
            return None
        if payload is None:
            tally.dry += 1
            return None
        self.acking = True
        return resp_command(b"LREM", self.processing, b"1", payload)


class LongPoll(Script):
    """One long poll; counts the message (or the empty answer) and ends."""

    def __init__(self, tally: Tally, request: bytes, ok: int) -> None:
        super().__init__(tally)
        self.request, self.ok = request, ok

    def first(self) -> bytes:
        return self.request

    def next(self, code: int, head: bytes, payload: bytes | None) -> bytes | None:
        tally = self.tally
        tally.requests += 1
        if code == self.ok and payload is not None:
            tally.ops += 1
            tally.times.append(time.time())
        elif code in (204, RESP_ARRAY):  # waited it out with nothing
            tally.dry += 1
        else:
            tally.error(code, payload)
        return None


def make_script(spec: dict[str, Any], tally: Tally) -> Script:
    kind = spec["script"]
    request = spec.get("request", "").encode("latin-1")
    if kind == "repeat":
        return Repeat(tally, request, spec["ok"], spec["per_ok"])
    if kind == "pop":
        return Pop(tally, request)
    if kind == "getack":
        return GetAck(tally, spec["queue"])
    if kind == "move_remove":
        return MoveRemove(tally, spec["source"], spec["processing"])
    if kind == "longpoll":
        return LongPoll(tally, request, spec["ok"])
    raise ValueError(f"unknown script {kind!r}")


class LoadConnection(asyncio.Protocol):
    """One client connection driven by a Script, one request in flight."""

    def __init__(self, parse: Callable[[bytearray], Reply | None], script: Script) -> None:
        self.parse = parse
        self.script = script
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def start(self) -> None:
        assert self.transport is not None
        self.transport.write(self.script.first())

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.done.done():
            reply = self.parse(self.buf)
            if reply is None:
                return
            used, code, head, payload = reply
            del self.buf[:used]
            request = self.script.next(code, head, payload)
            if request is None:
                self.done.set_result(True)
                return
            assert self.transport is not None
            self.transport.write(request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.script.tally.errors["connection closed"] += 1
            self.done.set_result(False)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def _load(spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    tally = Tally(int(spec["max_ops"]))
    parse = parse_http if spec["proto"] == "http" else parse_resp
    # Connections in the making at once: the server's accept queue is finite (see hold_polls).
    gate = asyncio.Semaphore(int(spec.get("connect_concurrency", 100)))

    cafile = spec.get("cafile")
    tls = ssl.create_default_context(cafile=cafile) if cafile else None

    async def connect() -> LoadConnection:
        async with gate:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: LoadConnection(parse, make_script(spec, tally)),
                    HOST,
                    spec["port"],
                    ssl=tls,
                ),
                30,
            )
            return conn

    conns = await asyncio.gather(*(connect() for _ in range(int(spec["conns"]))))
    print("ready", flush=True)
    line = await loop.run_in_executor(None, sys.stdin.readline)
    if line.strip() != "go":
        for conn in conns:
            conn.close()
        return {"error": "aborted before go"}
    cpu0, start = time.process_time(), time.time()
    tally.deadline = time.perf_counter() + float(spec["duration_s"])
    for conn in conns:
        conn.start()
    print("sent", flush=True)
    grace_s = 30.0
    _, pending = await asyncio.wait(
        [c.done for c in conns], timeout=float(spec["duration_s"]) + grace_s
    )
    end = time.time()
    for conn in conns:
        conn.close()
    return {
        "ops": tally.ops,
        "requests": tally.requests,
        "dry": tally.dry,
        "unfinished": len(pending),
        "errors": dict(tally.errors),
        "start": start,
        "end": end,
        "cpu_s": time.process_time() - cpu0,
        "times": tally.times,
    }


def child_main(spec_json: str) -> int:
    import uvloop

    raise_fd_limit()
    result = uvloop.run(_load(json.loads(spec_json)))
    write_result(result)
    return 0


def publish_spec(
    queue_name: str, batch: int = 1, headers: tuple[tuple[str, str], ...] = ()
) -> dict[str, Any]:
    if batch == 1:
        request = http_request("POST", f"/{queue_name}/messages", BODY, headers)
    else:
        batch_headers = (("Content-Type", "application/x-ndjson"), *headers)
        request = http_request("POST", f"/{queue_name}/messages", batch_body(batch), batch_headers)
    return {"script": "repeat", "request": request.decode("latin-1"), "ok": 201, "per_ok": batch}


def lpush_spec(key: str) -> dict[str, Any]:
    request = resp_command(b"LPUSH", key.encode(), BODY)
    return {"script": "repeat", "request": request.decode("latin-1"), "ok": RESP_INT, "per_ok": 1}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1]))
