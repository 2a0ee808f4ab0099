"""Which transport for the streaming receive: the server's CPU per message of each candidate.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python bench/stream_candidates.py                  # in-process framing, ~10 s
    .venv/bin/python bench/stream_candidates.py --e2e            # and a real server, ~1 min
    .venv/bin/python bench/stream_candidates.py --count 2000 --e2e --consumers 2   # a smoke run

What the server does per message on the wire is all that differs between the candidates (the
store work, one get and one ack_each per batch, is the same), so the first part measures just
that, in this process, for N deliveries of a `--body`-byte message and their acks coming back
`--acks-per-frame` at a time (1: each ack its own frame, as a consumer acking each message
without batching; 10: what a consumer's buffered acks usually are):

- `wsproto`: server frames through wsproto's `Connection.send`, acks parsed by wsproto;
- `wsproto+own`: acks parsed by wsproto, delivery frames built by hand (an unmasked server
  frame is a 2-10 byte header): what dirmq does (`server/websocket.py`);
- `websockets`: the `websockets` library's sans-I/O `Protocol` (C-accelerated masking);
- `sse+post`: deliveries as server-sent events (the body in base64, as the pub/sub stream
  sends it) and acks as `POST /{queue}/messages/ack` requests parsed by httptools.

Each is timed `--rounds` times; the best round is reported as microseconds of CPU per message
(process time, one core). The second part (`--e2e`) starts `dirmq serve --workers 1` on a
tmpfs root, prefills `--count` messages per run and drains them with `--consumers` processes,
once with one ack per message and once with cumulative acks (`ack_through` every
`--through` messages); it reports the rate and the server's CPU per message (from /proc).
Every process it starts is stopped by PID; the roots are deleted.
"""

from __future__ import annotations

import os
import sys

# Run as a script, this file's directory comes first on sys.path, where bench/http.py would
# shadow the standard library's `http` (which websockets imports): take it off.
sys.path.remove(os.path.dirname(os.path.abspath(__file__)))

import argparse
import base64
import json
import multiprocessing
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools
from websockets.frames import Frame, Opcode
from websockets.protocol import Protocol, Side
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, TextMessage

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from dirmq.server.websocket import BINARY, frame_header  # noqa: E402
from dirmq.store import Message  # noqa: E402
from dirmq.wire import stream as wire  # noqa: E402


def deliveries(count: int, body: bytes) -> list[Message]:
    now = time.time()
    return [
        Message(
            f"0000018c2f{i:08x}-00000000",
            body,
            {"Content-Type": "text/plain"},
            1,
            now,
            f"0000018c2f{i:08x}-00000000.1",
            now + 30,
            "leased",
        )
        for i in range(count)
    ]


def masked_frames(texts: list[str]) -> bytes:
    """What a client sends: masked text frames (wsproto's client side makes them)."""
    client = Connection(ConnectionType.CLIENT)
    return b"".join(client.send(TextMessage(data=text)) for text in texts)


def ack_texts(count: int, per_frame: int) -> list[str]:
    tags = list(range(1, count + 1))
    return [
        json.dumps({"ack": tags[i : i + per_frame]}, separators=(",", ":"))
        for i in range(0, count, per_frame)
    ]


def run_wsproto(messages: list[Message], acks: bytes, own_frames: bool) -> None:
    server = Connection(ConnectionType.SERVER)
    out = []
    for tag, message in enumerate(messages, 1):
        payload = wire.encode_delivery(tag, message)
        if own_frames:
            out.append(frame_header(BINARY, len(payload)))
            out.append(payload)
        else:
            out.append(server.send(BytesMessage(data=payload)))
    b"".join(out)
    server.receive_data(acks)
    settled = 0
    for event in server.events():
        if isinstance(event, TextMessage):
            settled += len(json.loads(event.data)["ack"])
    assert settled == len(messages), settled


def run_websockets(messages: list[Message], acks: bytes) -> None:
    server = Protocol(Side.SERVER, max_size=None)
    for tag, message in enumerate(messages, 1):
        server.send_binary(wire.encode_delivery(tag, message))
    b"".join(server.data_to_send())
    server.receive_data(acks)
    settled = 0
    for event in server.events_received():
        if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
            settled += len(json.loads(event.data)["ack"])
    assert settled == len(messages), settled


class _Requests:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._body = b""

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.bodies.append(self._body)
        self._body = b""


def sse_event(tag: int, message: Message) -> bytes:
    document = {
        "tag": tag,
        "id": message.id,
        "receipt": message.receipt,
        "receive_count": message.receive_count,
        "headers": message.headers,
        "body_base64": base64.b64encode(message.body).decode(),
    }
    return b"event: message\ndata: " + json.dumps(document).encode() + b"\n\n"


def post_acks(messages: list[Message], per_frame: int) -> bytes:
    requests = []
    for i in range(0, len(messages), per_frame):
        body = json.dumps({"receipts": [m.receipt for m in messages[i : i + per_frame]]}).encode()
        requests.append(
            b"POST /q/messages/ack HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
    return b"".join(requests)


def run_sse(messages: list[Message], acks: bytes) -> None:
    chunks = []
    for tag, message in enumerate(messages, 1):
        event = sse_event(tag, message)
        chunks.append(b"%x\r\n%s\r\n" % (len(event), event))  # chunked transfer coding
    b"".join(chunks)
    requests = _Requests()
    httptools.HttpRequestParser(requests).feed_data(acks)
    settled = sum(len(json.loads(body)["receipts"]) for body in requests.bodies)
    assert settled == len(messages), settled


def micro(count: int, body_bytes: int, per_frame: int, rounds: int) -> dict[str, float]:
    messages = deliveries(count, os.urandom(body_bytes))
    ws_acks = masked_frames(ack_texts(count, per_frame))
    candidates: dict[str, Callable[[], None]] = {
        "wsproto": lambda: run_wsproto(messages, ws_acks, own_frames=False),
        "wsproto+own": lambda: run_wsproto(messages, ws_acks, own_frames=True),
        "websockets": lambda: run_websockets(messages, ws_acks),
        "sse+post": lambda: run_sse(messages, post_acks(messages, per_frame)),
    }
    results = {}
    for name, run in candidates.items():
        best = float("inf")
        for _ in range(rounds):
            began = time.process_time()
            run()
            best = min(best, time.process_time() - began)
        results[name] = best / count * 1e6
    return results


# -- end to end ---------------------------------------------------------------------------------
def consumer_process(url: str, queue: str, quota: int, through: int, ready: Any, go: Any) -> None:
    """One consumer (a forked process): connects, says so, waits for the start, drains its
    share, puts how many it got."""
    from dirmq.client import RemoteStore

    with RemoteStore(url) as store, store.queue(queue).consume(prefetch=100) as consumer:
        ready.put(0)
        go.wait()
        got = 0
        last = None
        while got < quota:
            message = consumer.get(timeout_s=5)
            if message is None:
                break
            got += 1
            if through:
                last = message
                if got % through == 0:
                    consumer.ack_through(message)
                    last = None
            else:
                consumer.ack(message)
        if last is not None:
            consumer.ack_through(last)
    ready.put(got)


def server_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def e2e(count: int, consumers: int, through: int) -> list[dict[str, object]]:
    from dirmq.client import RemoteStore

    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="dirmq-stream-bench-", dir=base))
    args = [sys.executable, "-m", "dirmq", "serve", "--root", str(root), "--listen"]
    proc = subprocess.Popen(
        [*args, "127.0.0.1:0", "--workers", "1", "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    rows: list[dict[str, object]] = []
    try:
        assert proc.stdout is not None
        url = ""
        for line in proc.stdout:
            if " API listening on " in line:
                url = line.rsplit(" ", 1)[1].strip()
                break
        with RemoteStore(url) as store:
            for label, every in (("ack each", 0), (f"ack_through every {through}", through)):
                queue = f"bench-{every}"
                remote = store.create_queue(queue)
                for start in range(0, count, 1000):
                    batch = [b"x" * 100] * min(1000, count - start)
                    remote.put_many(batch, durability="memory")
                # Forked, connected and waiting before the clock starts: their start-up and
                # the prefetch filled meanwhile are not counted (the prefetch is, in the CPU).
                context = multiprocessing.get_context("fork")
                ready, go = context.Queue(), context.Event()
                cpu0 = server_cpu_s(proc.pid)
                workers = [
                    context.Process(
                        target=consumer_process,
                        args=(url, queue, -(-count // consumers), every, ready, go),
                    )
                    for _ in range(consumers)
                ]
                for worker in workers:
                    worker.start()
                for _ in workers:
                    ready.get(timeout=60)
                began = time.monotonic()
                go.set()
                got = sum(ready.get(timeout=600) for _ in workers)
                seconds = time.monotonic() - began
                for worker in workers:
                    worker.join(10)
                cpu = server_cpu_s(proc.pid) - cpu0
                rows.append(
                    {
                        "acks": label,
                        "messages": got,
                        "rate_per_s": round(got / seconds),
                        "server_cpu_us_per_message": round(cpu / max(got, 1) * 1e6, 1),
                    }
                )
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--body", type=int, default=100, help="body bytes (in-process part)")
    parser.add_argument("--acks-per-frame", type=int, nargs="+", default=[1, 10])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--e2e", action="store_true", help="also drain a real server")
    parser.add_argument("--consumers", type=int, default=16)
    parser.add_argument("--through", type=int, default=50)
    options = parser.parse_args(argv)
    for per_frame in options.acks_per_frame:
        results = micro(options.count, options.body, per_frame, options.rounds)
        print(f"framing CPU per message, {per_frame} ack(s) per frame:")
        for name, micros in sorted(results.items(), key=lambda item: item[1]):
            print(f"  {name:12} {micros:6.2f} us")
    if options.e2e:
        for row in e2e(options.count, options.consumers, options.through):
            print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
