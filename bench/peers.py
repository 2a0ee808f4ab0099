"""dirmq against RabbitMQ, Redis and NATS JetStream on loopback: publish, consume+ack (one ack per
message, and the batch or streaming forms each system has) and end-to-end latency at a fixed
rate, all in one run, in alternating rounds.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.peers                  # full run: 3 rounds, about 15 minutes
    .venv/bin/python -m bench.peers --quick          # smoke run: 1 round, small counts, < 1 min
    .venv/bin/python -m bench.peers --systems dirmq,rabbitmq --workloads publish,consume

It installs what it needs itself: Debian's `rabbitmq-server`, `redis-server` and `nats-server`
(apt-get) when missing, and the Python clients of the `bench` extra (aio-pika, redis, nats-py,
matplotlib; pip, into this interpreter). It starts every server itself on 127.0.0.1, at free
ports, with data directories in one temp dir on the disk (`/tmp`, or `--dir`), and stops exactly
those processes, by PID, at the end, also on Ctrl-C, SIGTERM or an error:

- dirmq: `dirmq serve --workers 2`, default durability (writethrough: file and directory
  fsynced before the 201), started by the harness (`bench.harness.servers`);
- RabbitMQ (Debian's 3.10): its own epmd on a free port, a unique node name, no plugins; a
  durable classic queue, persistent messages, publisher confirms (sent once the message store
  has fsynced), manual acks;
- Redis 7: `--appendonly yes --appendfsync always --save ''` (the reply follows the AOF fsync);
- NATS JetStream (Debian's 2.9): `-js`, file storage, a work-queue stream, a durable pull
  consumer with explicit acks. 2.9 has no `sync_interval` setting (2.10 added it): its file
  store is fsynced every 2 minutes, so a publish ack means "in the OS page cache", not "on disk";
- floor: `bench.floor_server`, dirmq's stack (uvloop + httptools, 2 processes) answering
  dirmq's GET + DELETE and GET ?max=50 + POST ack with only the bare-loop consume floor's
  syscalls behind them: what no server on this disk and stack beats (consume workloads only).

The load generator is this module run as child processes (`--child`, uvloop), the same shape for
every system: N asyncio tasks, each with one operation in flight, on the system's usual Python
client (aio-pika, redis.asyncio, nats-py); dirmq through a minimal keep-alive HTTP/1.1 client
(raw asyncio streams, as cheap as the peers' clients), and its streaming consumer through the
dirmq client library. Each workload runs every system's subjects in turn, one trial each per
round, in an order rotated every round; the table gives medians and the ratios are medians of
per-round ratios. Every trial is bounded by a message count and a time budget. Server CPU is the
sum of utime+stime over the server's process tree (/proc); load-generator CPU is the load
processes' own (getrusage). Both are given per message: client and server share the cores.

It prints a table, writes JSON (`bench/results/peers.json`) and draws a chart of each workload's
rate per system (`bench/results/peers.png`, matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import HOST, RESULTS
from bench.harness.charts import draw_chart
from bench.harness.floors import consume_floor, publish_floor
from bench.harness.install import apt_install, ensure_debian_tool, ensure_pip, ensure_redis_server
from bench.harness.load import LoadChild, Trial, split, write_result
from bench.harness.peers import RABBIT_SERVER, Peer, start_nats, start_rabbitmq, start_redis
from bench.harness.procs import Processes, cpu_seconds, process_tree, raise_fd_limit
from bench.harness.report import filesystem_of, source_revision
from bench.harness.rounds import median, percentile, ratio
from bench.harness.servers import (
    create_queue,
    http_call,
    queue_stats,
    start_dirmq,
    start_floor_server,
)
from bench.harness.wire import header_value, http_request

CHILD = ("-m", "bench.peers", "--child")  # the load generator: this module in child processes
BODY_BYTES = 1024
BODY = b"x" * BODY_BYTES
STAMP = struct.Struct("<d")  # latency bodies start with the send time (perf_counter)
SYSTEMS = ("dirmq", "floor", "rabbitmq", "redis", "nats")
SYSTEM_NAMES = {
    "dirmq": "dirmq",
    "floor": "floor",
    "rabbitmq": "RabbitMQ",
    "redis": "Redis",
    "nats": "NATS JS",
}
WORKLOADS = ("publish", "consume", "consume-batch", "latency")
CONSUMED_SHARE = 0.9  # a consume trial stops at 90% of its backlog: no consumer idles on the tail
PREFETCH = 50  # RabbitMQ prefetch, NATS fetch size, dirmq stream credit window
BATCH = 50  # messages per batch ack (dirmq native, RabbitMQ multiple=True, Redis pipeline)
SQS_BATCH = 10  # SQS caps ReceiveMessage and DeleteMessageBatch at 10
IDLE_S = 5.0  # a consumer that sees nothing this long gives up (the trial then reports it)
# (import name, pip requirement): also the `bench` extra of pyproject.toml
PIP_NEEDS = (  # (import name, distribution, requirement)
    ("aio_pika", "aio-pika", "aio-pika>=9"),
    ("redis", "redis", "redis>=5"),
    ("nats", "nats-py", "nats-py>=2.6"),
    ("matplotlib", "matplotlib", "matplotlib>=3.7"),
    ("uvloop", "uvloop", "uvloop>=0.19"),
)
FSYNC = {
    "dirmq": "writethrough (default): the group's commit-journal record fdatasynced, then its "
    "files named, before the 201 (--no-journal: each file and its directory fsynced)",
    "rabbitmq": "durable classic queue, persistent messages: the confirm follows the message "
    "store's fsync",
    "redis": "appendonly yes, appendfsync always: the reply follows the AOF write and fsync",
    "nats": "JetStream file store, fsynced every 2 min (2.9's fixed default; sync_interval "
    "appeared in 2.10): the publish ack precedes any fsync",
    "floor": "none (it only consumes): `bench.floor_server`, dirmq's stack (uvloop + "
    "httptools, 2 processes) doing the bare-loop consume floor's syscalls and nothing else",
}


@dataclass(frozen=True, slots=True)
class Subject:
    """One system's form of one workload: one bar in the chart, one row in the table."""

    workload: str
    system: str
    form: str
    label: str
    needs: str = ""  # a dirmq feature still being built: "batchack" or "stream"

    @property
    def key(self) -> str:
        return f"{self.workload}/{self.system}/{self.form}"


SUBJECTS = (
    Subject("publish", "dirmq", "post", "dirmq POST, 201 after fsync"),
    Subject("publish", "rabbitmq", "confirm", "RabbitMQ publish + confirm"),
    Subject("publish", "redis", "lpush", "Redis LPUSH (always)"),
    Subject("publish", "nats", "js", "NATS JS publish + PubAck, fsync 2 min"),
    Subject("consume", "dirmq", "getack", "dirmq GET + DELETE per message"),
    Subject("consume", "dirmq", "stream", "dirmq stream, ack each", "stream"),
    Subject("consume", "rabbitmq", "ack", "RabbitMQ prefetch 50, ack each"),
    Subject("consume", "redis", "lmove", "Redis LMOVE + LREM"),
    Subject("consume", "nats", "fetch", "NATS fetch 50, ack each, fsync 2 min"),
    Subject("consume", "floor", "getack", "floor: bare HTTP + syscalls, GET + DELETE"),
    Subject("consume-batch", "dirmq", "batchack", "dirmq GET max=50 + POST ack", "batchack"),
    Subject("consume-batch", "dirmq", "sqs", "dirmq SQS Receive 10 + DeleteBatch"),
    Subject(
        "consume-batch", "dirmq", "stream-cumulative", "dirmq stream, cumulative acks", "stream"
    ),
    Subject("consume-batch", "rabbitmq", "multiple", "RabbitMQ ack multiple every 50"),
    Subject("consume-batch", "redis", "pipeline", "Redis pipelined LMOVE/LREM x50"),
    Subject("consume-batch", "floor", "batchack", "floor: bare HTTP + syscalls, max=50 + ack"),
    Subject("latency", "dirmq", "longpoll", "dirmq long-poll GET + DELETE"),
    Subject("latency", "dirmq", "stream", "dirmq stream", "stream"),
    Subject("latency", "rabbitmq", "ack", "RabbitMQ consumer"),
    Subject("latency", "redis", "blmove", "Redis BLMOVE + LREM"),
    Subject("latency", "nats", "fetch", "NATS fetch 1, fsync 2 min"),
)


@dataclass(frozen=True, slots=True)
class Floor:
    """A design floor: a workload's store syscalls in a bare loop, no server (bench.harness.floors),
    measured each round; every system's rows of `workloads` get a ratio to it."""

    name: str
    workloads: tuple[str, ...]  # measured when one of these runs; their rows are read against it
    label: str
    lines: int = 1  # publish floors: groups in flight at once
    flush: str = "syncfs"  # publish floors: how a group is made durable (PUBLISH_FLUSHES)


FLOORS = (
    Floor("publish", ("publish",), "durable creates, 1 group of N at a time"),
    Floor("publish-2", ("publish",), "durable creates, 2 groups of N/2 overlap", lines=2),
    Floor("publish-syncfs2", ("publish",), "syncfs, links, syncfs (no dir fsync)", flush="syncfs2"),
    Floor(
        "publish-fsync-each",
        ("publish",),
        "fsync each file in turn, links, dir",
        flush="fsync-each",
    ),
    Floor(
        "publish-fdatasync-threads",
        ("publish",),
        "fdatasync each file at once, links, dir",
        flush="fdatasync-threads",
    ),
    Floor(
        "publish-pipelined",
        ("publish",),
        "1 syncfs a group: data + previous links",
        flush="pipelined",
    ),
    Floor(
        "publish-named-1",
        ("publish",),
        "named temps, 1 syncfs, links (format change)",
        flush="named-1",
    ),
    Floor(
        "publish-named-1-2",
        ("publish",),
        "named temps, 1 syncfs, 2 groups of N/2",
        lines=2,
        flush="named-1",
    ),
    Floor(
        "publish-append", ("publish",), "append to 1 file + fdatasync (Redis's way)", flush="append"
    ),
    Floor(
        "publish-journal",
        ("publish",),
        "journal: 1 fdatasync a group, links, no fsync",
        flush="journal",
    ),
    Floor(
        "publish-journal-2",
        ("publish",),
        "journal, 2 groups of N/2 overlap",
        lines=2,
        flush="journal",
    ),
    Floor(
        "consume",
        ("consume", "consume-batch"),
        "lease+read+ack syscalls, bare loop, 2 procs",
    ),
)
_GROUP = "groups of N = --concurrency files (one publisher's message each), one group at a time"
FLOOR_WHAT = {
    "publish": "N = --concurrency publishers, each with one message in flight: per file an "
    "O_TMPFILE open + write of the 1 KiB body, one syncfs for the group, per file a linkat into "
    "ready/, one fsync of ready/; one thread, groups one after another (one queue's publish line)",
    "publish-2": "the same in 2 threads, each committing groups of N/2: two groups' flushes "
    "overlapped, as dirmq's 2 worker processes do (each has its own line for the queue and gets "
    "about half the publishers)",
    "publish-syncfs2": f"{_GROUP}: O_TMPFILE + write each, one syncfs, linkat each, a second "
    "syncfs in place of the directory fsync",
    "publish-fsync-each": f"{_GROUP}: O_TMPFILE + write each, an fsync of each file one after "
    "another, linkat each, one fsync of ready/",
    "publish-fdatasync-threads": f"{_GROUP}: O_TMPFILE + write each, an fdatasync of each file "
    "from its own thread, all at once, linkat each, one fsync of ready/",
    "publish-pipelined": f"{_GROUP}: O_TMPFILE + write each, one syncfs that flushes this "
    "group's data and the previous group's links, linkat each (a group's answer waits for the "
    "next group's syncfs: a lower bound that ignores that latency)",
    "publish-named-1": f"{_GROUP}: a named temp each (open O_CREAT|O_EXCL + write), one syncfs "
    "(data, inodes and temp names), link each into ready/ and answer; the previous group's temps "
    "unlinked: one flush per answer, but a recovery would have to link a surviving temp",
    "publish-named-1-2": "publish-named-1 in 2 threads, each committing groups of N/2",
    "publish-append": f"{_GROUP}: the group's bodies appended to one file and one fdatasync: "
    "Redis's appendfsync always, not a design dirmq could use (a message is one file)",
    "publish-journal": f"{_GROUP}: the group's files appended to one journal file and one "
    "fdatasync, then O_TMPFILE + write + linkat each into ready/, no fsync of file or directory; "
    "a checkpoint thread syncfs-es once a second and truncates the journal (a proposed "
    "format change: a per-process commit journal)",
    "publish-journal-2": "publish-journal in 2 threads, each committing groups of N/2 to a "
    "journal of its own",
    "consume": "per message: rename into leased/, open + read + close, rename into a "
    "per-process pool directory; 2 processes; backlog files written untimed",
}


@dataclass(frozen=True, slots=True)
class Settings:
    rounds: int
    messages: int  # per publish trial
    backlog: int  # preloaded (untimed) before each consume trial
    concurrency: int  # publishers
    consumers: int
    trial_s: float  # time budget of a throughput trial
    rate: float  # latency: messages per second
    latency_s: float  # latency: how long the publisher runs
    load_procs: int


FULL = Settings(
    rounds=3,
    messages=20_000,
    backlog=60_000,
    concurrency=64,
    consumers=16,
    trial_s=60.0,
    rate=1000.0,
    latency_s=10.0,
    load_procs=2,
)
QUICK = Settings(
    rounds=1,
    messages=500,
    backlog=2000,  # more than the consumers' windows (16 x 50): below that pulls idle on the tail
    concurrency=64,
    consumers=16,
    trial_s=20.0,
    rate=200.0,
    latency_s=2.0,
    load_procs=2,
)


# == the load generator (child processes) =========================================================
class Tally:
    """What one load process did, shared by its tasks: a quota of messages and a deadline."""

    def __init__(self, quota: int, budget_s: float) -> None:
        self.quota = quota
        self.deadline = time.perf_counter() + budget_s
        self.claimed = 0  # publishes started
        self.ops = 0  # messages published (acknowledged) or consumed (acked)
        self.errors: collections.Counter[str] = collections.Counter()
        self.idle = 0  # consumers that gave up on an empty queue
        self.latencies_ms: list[float] = []
        self.finished = asyncio.Event()
        self.last_op = 0.0  # time.time() of the last message counted: where the trial ends

    def claim(self) -> bool:
        if self.claimed >= self.quota or time.perf_counter() > self.deadline:
            return False
        self.claimed += 1
        return True

    def count(self, n: int = 1) -> None:
        self.ops += n
        self.last_op = time.time()
        if self.ops >= self.quota:
            self.finished.set()

    def reached(self) -> bool:
        """`done` for other threads: reads only (the event belongs to the loop)."""
        return self.ops >= self.quota or time.perf_counter() > self.deadline

    @property
    def done(self) -> bool:
        if self.ops >= self.quota or time.perf_counter() > self.deadline:
            self.finished.set()
            return True
        return False

    def error(self, what: str) -> None:
        self.errors[what[:120]] += 1

    def stamp(self, body: bytes) -> None:
        """A latency trial: the body starts with its send time."""
        if len(body) >= STAMP.size:
            sent = STAMP.unpack_from(body)[0]
            self.latencies_ms.append((time.perf_counter() - sent) * 1000)


def stamped_body() -> bytes:
    return STAMP.pack(time.perf_counter()) + BODY[STAMP.size :]


class HttpConnection:
    """One keep-alive HTTP/1.1 connection, one request in flight; reads Content-Length bodies."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> HttpConnection:
        reader, writer = await asyncio.open_connection(HOST, port)
        return cls(reader, writer)

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: Iterable[tuple[str, str]] = ()
    ) -> tuple[int, bytes, bytes]:
        self.writer.write(http_request(method, path, body, headers))
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = header_value(head[:-2], b"Content-Length")
        if length is None:
            length = header_value(head[:-2].lower(), b"content-length")
        payload = await self.reader.readexactly(int(length)) if length else b""
        return status, head, payload

    def close(self) -> None:
        self.writer.close()


RECEIPT_LINE = re.compile(rb"\r\nX-Receipt: ([^\r\n]+)")


class DirmqLoad:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.port = int(spec["port"])
        self.queue = spec["queue"]
        self.path = f"/{self.queue}/messages"

    async def publish_task(self, tally: Tally, body: Callable[[], Awaitable[bytes]]) -> None:
        conn = await HttpConnection.open(self.port)
        try:
            while tally.claim():
                status, _, payload = await conn.request("POST", self.path, await body())
                if status == 201:
                    tally.count()
                else:
                    tally.error(f"publish {status} {payload[:60]!r}")
        finally:
            conn.close()

    async def consume_task(self, tally: Tally, form: str, latency: bool) -> None:
        conn = await HttpConnection.open(self.port)
        try:
            if form in ("getack", "longpoll"):
                await self._get_delete(conn, tally, latency)
            elif form == "batchack":
                await self._batch_ack(conn, tally)
            elif form == "sqs":
                await self._sqs_batch(conn, tally)
            else:
                raise ValueError(f"unknown dirmq form {form!r}")
        finally:
            conn.close()

    async def _get_delete(self, conn: HttpConnection, tally: Tally, latency: bool) -> None:
        get = f"{self.path}?wait=1s" if latency else self.path
        while not tally.done:
            status, head, payload = await conn.request("GET", get)
            if status == 204:
                if latency:
                    continue
                tally.idle += 1
                return
            receipt = header_value(head[:-2], b"X-Receipt")
            if status != 200 or receipt is None:
                tally.error(f"get {status} {payload[:60]!r}")
                return
            if latency:
                tally.stamp(payload)
            status, _, payload = await conn.request("DELETE", f"{self.path}/{receipt.decode()}")
            if status == 204:
                tally.count()
            else:
                tally.error(f"ack {status} {payload[:60]!r}")

    async def _batch_ack(self, conn: HttpConnection, tally: Tally) -> None:
        """Contract 2: GET ?max=N (multipart/mixed), then one POST /{q}/messages/ack."""
        while not tally.done:
            status, _, payload = await conn.request("GET", f"{self.path}?max={BATCH}")
            if status == 204:
                tally.idle += 1
                return
            receipts = [r.decode() for r in RECEIPT_LINE.findall(payload)]
            if status != 200 or not receipts:
                tally.error(f"get max {status} {payload[:60]!r}")
                return
            body = json.dumps({"receipts": receipts}).encode()
            headers = (("Content-Type", "application/json"),)
            status, _, payload = await conn.request("POST", f"{self.path}/ack", body, headers)
            if status != 200:
                tally.error(f"batch ack {status} {payload[:60]!r}")
                return
            answer = json.loads(payload)
            tally.count(int(answer["settled"]))
            for failure in answer.get("failed", []):
                tally.error(f"batch ack failed: {failure.get('error')}")

    async def _sqs_batch(self, conn: HttpConnection, tally: Tally) -> None:
        """SQS JSON protocol, unsigned (dirmq without credentials takes any signature or none)."""
        url = f"http://{HOST}:{self.port}/000000000000/{self.queue}"

        def call(action: str, params: dict[str, Any]) -> tuple[bytes, tuple[tuple[str, str], ...]]:
            headers = (
                ("X-Amz-Target", f"AmazonSQS.{action}"),
                ("Content-Type", "application/x-amz-json-1.0"),
            )
            return json.dumps({"QueueUrl": url, **params}).encode(), headers

        receive = call("ReceiveMessage", {"MaxNumberOfMessages": SQS_BATCH})
        while not tally.done:
            status, _, payload = await conn.request("POST", "/", *receive)
            messages = json.loads(payload).get("Messages", []) if status == 200 else None
            if messages is None:
                tally.error(f"ReceiveMessage {status} {payload[:60]!r}")
                return
            if not messages:
                tally.idle += 1
                return
            entries = [
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ]
            status, _, payload = await conn.request(
                "POST", "/", *call("DeleteMessageBatch", {"Entries": entries})
            )
            if status != 200:
                tally.error(f"DeleteMessageBatch {status} {payload[:60]!r}")
                return
            answer = json.loads(payload)
            tally.count(len(answer.get("Successful", [])))
            for failure in answer.get("Failed", []):
                tally.error(f"DeleteMessageBatch failed: {failure.get('Code')}")

    async def stream_task(self, tally: Tally, cumulative: bool, latency: bool) -> None:
        prefetch = int(self.spec.get("prefetch", PREFETCH))
        await DirmqStream(self.port, self.queue, prefetch).consume(tally, cumulative, latency)


class DirmqStream:
    """The streaming consumer of contract 3 (WebSocket on GET /{queue}/messages: a credit window,
    messages pushed, acks per message or cumulative), through the dirmq client library.

    The stream branch's client is synchronous: `RemoteQueue.consume(prefetch=N)` gives a
    `Consumer` (a context manager; `get(timeout_s)` -> Message or None; `ack(receipt)`, buffered
    and sent in frames; `ack_through(receipt)`, cumulative), so each consumer runs it on a thread
    of its own. An async `AsyncRemoteQueue.consume`, if one appears, is used instead (its
    consumer iterated with `async for`, acks awaited when they are coroutines).
    `stream_api_problem` says what is missing when neither exists, and the stream subjects are
    then skipped with that reason.
    """

    def __init__(self, port: int, queue: str, prefetch: int) -> None:
        self.url = f"http://{HOST}:{port}"
        self.queue = queue
        self.prefetch = prefetch

    @staticmethod
    def _ack(consumer: Any, receipt: str, cumulative: bool) -> Any:
        if cumulative:
            if hasattr(consumer, "ack_through"):
                return consumer.ack_through(receipt)
            return consumer.ack(receipt, cumulative=True)
        return consumer.ack(receipt)

    async def consume(self, tally: Tally, cumulative: bool, latency: bool) -> None:
        from dirmq.client import aio

        if hasattr(aio.AsyncRemoteQueue, "consume"):
            async with aio.AsyncRemoteStore(self.url) as store:
                queue = await store.queue(self.queue)
                await self._consume_async(queue, tally, cumulative, latency)
            return
        # The sync client on a thread of its own (not the default executor: it has too few
        # threads for 8 consumers on 2 cores, and the extra ones would wait for the first).
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def run() -> None:
            try:
                self._consume_sync(loop, tally, cumulative, latency)
            except BaseException as exc:
                loop.call_soon_threadsafe(finished.set_exception, exc)
            else:
                loop.call_soon_threadsafe(finished.set_result, None)

        threading.Thread(target=run, daemon=True).start()
        await finished

    async def _consume_async(
        self, queue: Any, tally: Tally, cumulative: bool, latency: bool
    ) -> None:
        consumer = queue.consume(prefetch=self.prefetch)
        if hasattr(consumer, "__aenter__"):
            consumer = await consumer.__aenter__()
        try:
            since_ack = 0
            last = ""
            # `get(timeout_s)` arms a timer only when it has to wait: not a task and a timer a
            # message, as `wait_for` on the iterator would (as the peers' consumers, which are
            # called back, pay none).
            iterator = None if hasattr(consumer, "get") else consumer.__aiter__()
            while not tally.done:
                try:
                    if iterator is None:
                        message = await consumer.get(timeout_s=IDLE_S)
                    else:
                        message = await asyncio.wait_for(iterator.__anext__(), IDLE_S)
                except (TimeoutError, StopAsyncIteration):
                    message = None
                if message is None:
                    tally.idle += 1
                    break
                if latency:
                    tally.stamp(message.body)
                last, since_ack = message.receipt, since_ack + 1
                if not cumulative or since_ack >= BATCH:
                    result = self._ack(consumer, last, cumulative)
                    if asyncio.iscoroutine(result):
                        await result
                    tally.count(since_ack)
                    since_ack = 0
            if since_ack:
                result = self._ack(consumer, last, cumulative)
                if asyncio.iscoroutine(result):
                    await result
                tally.count(since_ack)
        finally:
            if hasattr(consumer, "__aexit__"):
                await consumer.__aexit__(None, None, None)

    def _consume_sync(
        self, loop: asyncio.AbstractEventLoop, tally: Tally, cumulative: bool, latency: bool
    ) -> None:
        """On a thread: the tally is the event loop's, so counts go through the loop."""
        from dirmq.client.remote import RemoteStore

        def count(n: int) -> None:
            loop.call_soon_threadsafe(tally.count, n)

        def gave_up() -> None:
            tally.idle += 1

        with RemoteStore(self.url) as store:
            consumer = store.queue(self.queue).consume(prefetch=self.prefetch)
            with consumer:
                since_ack, last, quiet_since = 0, "", time.perf_counter()
                while not tally.reached():
                    message = consumer.get(timeout_s=0.25)
                    if message is None:
                        if since_ack:  # nothing more for now: settle what is held
                            self._ack(consumer, last, cumulative)
                            count(since_ack)
                            since_ack = 0
                        if not latency and time.perf_counter() - quiet_since > IDLE_S:
                            loop.call_soon_threadsafe(gave_up)
                            break
                        continue
                    quiet_since = time.perf_counter()
                    if latency:
                        tally.stamp(message.body)
                    last, since_ack = message.receipt, since_ack + 1
                    if not cumulative or since_ack >= BATCH:
                        self._ack(consumer, last, cumulative)
                        count(since_ack)
                        since_ack = 0
                if since_ack:
                    self._ack(consumer, last, cumulative)
                    count(since_ack)


def stream_api_problem() -> str | None:
    """Why the dirmq client cannot drive a streaming consumer here (None: it can)."""
    from dirmq.client import aio, remote

    if hasattr(aio.AsyncRemoteQueue, "consume") or hasattr(remote.RemoteQueue, "consume"):
        return None
    return "the dirmq client has no RemoteQueue.consume / AsyncRemoteQueue.consume yet"


class RabbitLoad:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.url = f"amqp://guest:guest@{HOST}:{spec['port']}/"
        self.queue = spec["queue"]
        self.connection: Any = None

    async def open(self) -> None:
        import aio_pika

        self.connection = await aio_pika.connect(self.url)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()

    async def publish_tasks(
        self, tally: Tally, tasks: int, body: Callable[[], Awaitable[bytes]]
    ) -> None:
        import aio_pika

        channel = await self.connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange

        async def publisher() -> None:
            while tally.claim():
                message = aio_pika.Message(
                    await body(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                )
                try:
                    await exchange.publish(message, routing_key=self.queue)
                    tally.count()
                except Exception as exc:
                    tally.error(f"publish {exc!r}")

        await asyncio.gather(*(publisher() for _ in range(tasks)))
        await channel.close()

    async def consume_task(self, tally: Tally, form: str, latency: bool) -> None:
        multiple = form == "multiple"
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=2 * BATCH if multiple else PREFETCH)
        queue = await channel.get_queue(self.queue, ensure=False)
        pending: list[Any] = []
        last_seen = [time.perf_counter()]

        async def on_message(message: Any) -> None:
            last_seen[0] = time.perf_counter()
            if tally.finished.is_set():
                return  # left unacked: given back when the channel closes
            if latency:
                tally.stamp(message.body)
            if not multiple:
                await message.ack()
                tally.count()
                return
            pending.append(message)
            if len(pending) >= BATCH:
                count = len(pending)
                pending.clear()
                await message.ack(multiple=True)
                tally.count(count)

        tag = await queue.consume(on_message, no_ack=False)
        try:
            while not tally.done:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(tally.finished.wait(), 0.05)
                quiet_s = time.perf_counter() - last_seen[0]
                if pending and quiet_s > 0.05:  # nothing new for a while: ack what is held
                    count = len(pending)
                    await pending[-1].ack(multiple=True)
                    pending.clear()
                    tally.count(count)
                if not latency and quiet_s > IDLE_S:
                    tally.idle += 1
                    break
            await queue.cancel(tag)
            if pending:
                count = len(pending)
                await pending[-1].ack(multiple=True)
                tally.count(count)
        finally:
            await channel.close()


class RedisLoad:
    def __init__(self, spec: dict[str, Any]) -> None:
        import redis.asyncio

        self.key = spec["queue"]
        self.client = redis.asyncio.Redis(host=HOST, port=int(spec["port"]), max_connections=None)

    async def close(self) -> None:
        await self.client.aclose()

    async def publish_task(self, tally: Tally, body: Callable[[], Awaitable[bytes]]) -> None:
        async with self.client.client() as conn:  # one connection per task, as the others
            while tally.claim():
                try:
                    await conn.lpush(self.key, await body())
                    tally.count()
                except Exception as exc:
                    tally.error(f"lpush {exc!r}")

    async def consume_task(self, tally: Tally, form: str, latency: bool, index: int) -> None:
        processing = f"{self.key}:processing:{os.getpid()}:{index}"  # the reliable-queue pattern
        async with self.client.client() as conn:
            if form == "pipeline":
                await self._pipelined(conn, tally, processing)
                return
            while not tally.done:
                if latency:
                    value = await conn.blmove(self.key, processing, 1, "RIGHT", "LEFT")
                    if value is None:
                        continue
                    tally.stamp(value)
                else:
                    value = await conn.lmove(self.key, processing, "RIGHT", "LEFT")
                    if value is None:
                        tally.idle += 1
                        return
                if await conn.lrem(processing, 1, value) == 1:
                    tally.count()
                else:
                    tally.error("lrem found nothing")

    async def _pipelined(self, conn: Any, tally: Tally, processing: str) -> None:
        while not tally.done:
            pipe = conn.pipeline(transaction=False)
            for _ in range(BATCH):
                pipe.lmove(self.key, processing, "RIGHT", "LEFT")
            values = [v for v in await pipe.execute() if v is not None]
            if not values:
                tally.idle += 1
                return
            pipe = conn.pipeline(transaction=False)
            for value in values:
                pipe.lrem(processing, 1, value)
            removed = await pipe.execute()
            tally.count(sum(1 for r in removed if r == 1))


class NatsLoad:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.url = f"nats://{HOST}:{spec['port']}"
        self.subject = spec["queue"]
        self.stream = spec["stream"]
        self.durable = spec["durable"]
        self.nc: Any = None
        self.js: Any = None

    async def open(self) -> None:
        import nats

        self.nc = await nats.connect(self.url, max_reconnect_attempts=0)
        self.js = self.nc.jetstream()

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

    async def publish_task(self, tally: Tally, body: Callable[[], Awaitable[bytes]]) -> None:
        while tally.claim():
            try:
                await self.js.publish(self.subject, await body(), stream=self.stream)
                tally.count()
            except Exception as exc:
                tally.error(f"publish {exc!r}")

    async def consume_task(self, tally: Tally, latency: bool) -> None:
        import nats.errors

        sub = await self.js.pull_subscribe_bind(self.durable, self.stream)
        batch = 1 if latency else PREFETCH
        last_seen = time.perf_counter()
        try:
            while not tally.done:
                try:
                    # Short: a 2.9 server holds a pull that asks for more than there is until it
                    # expires (no_wait is ignored with expires), so a long one idles on the tail.
                    messages = await sub.fetch(batch, timeout=0.25)
                except (nats.errors.TimeoutError, TimeoutError):  # nats-py raises either
                    if not latency and time.perf_counter() - last_seen > IDLE_S:
                        tally.idle += 1
                        return
                    continue
                last_seen = time.perf_counter()
                for message in messages:
                    if tally.done:  # over this process's share: give it back at once
                        await message.nak()
                        continue
                    if latency:
                        tally.stamp(message.data)
                    await message.ack()  # like AMQP's basic.ack: sent, not confirmed
                    tally.count()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


async def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One load process: connect, say "ready", wait for "go", run, report."""
    system, form, workload = spec["system"], spec["form"], spec["workload"]
    latency = workload == "latency"
    tasks = int(spec["tasks"])
    loop = asyncio.get_running_loop()
    load: Any
    if system in ("dirmq", "floor"):  # the floor speaks dirmq's wire
        load = DirmqLoad(spec)
        if system == "dirmq" and form.startswith(
            "stream"
        ):  # the client library's imports are not the trial's
            importlib.import_module("dirmq.client.remote")
            importlib.import_module("dirmq.client.aio")
    elif system == "rabbitmq":
        load = RabbitLoad(spec)
        await load.open()
    elif system == "redis":
        load = RedisLoad(spec)
    elif system == "nats":
        load = NatsLoad(spec)
        await load.open()
    else:
        raise ValueError(f"unknown system {system!r}")
    print("ready", flush=True)
    if (await loop.run_in_executor(None, sys.stdin.readline)).strip() != "go":
        return {"error": "aborted before go"}
    tally = Tally(int(spec["quota"]), float(spec["budget_s"]))
    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    start = time.time()

    def consumers() -> list[Awaitable[None]]:
        if system == "dirmq" and form.startswith("stream"):
            return [
                load.stream_task(tally, form == "stream-cumulative", latency) for _ in range(tasks)
            ]
        if system == "redis":
            return [load.consume_task(tally, form, latency, i) for i in range(tasks)]
        if system == "nats":
            return [load.consume_task(tally, latency) for _ in range(tasks)]
        return [load.consume_task(tally, form, latency) for _ in range(tasks)]

    def publishers(count: int, body: Callable[[], Awaitable[bytes]]) -> list[Awaitable[None]]:
        if system == "rabbitmq":
            return [load.publish_tasks(tally_pub, count, body)]
        return [load.publish_task(tally_pub, body) for _ in range(count)]

    tally_pub = tally
    sent_rate = 0.0
    if workload == "publish":

        async def plain() -> bytes:
            return BODY

        await asyncio.gather(*publishers(tasks, plain))
    elif workload in ("consume", "consume-batch"):
        await asyncio.gather(*consumers())
    else:  # latency: a paced publisher in this process, its consumers alongside
        count = int(spec["quota"])
        tally_pub = Tally(count, float(spec["budget_s"]))
        paced = Pacer(tally_pub, float(spec["rate"]))
        consuming = [asyncio.ensure_future(c) for c in consumers()]
        await asyncio.gather(*publishers(int(spec["publishers"]), paced.body))
        sent_rate = tally_pub.ops / max(1e-9, time.perf_counter() - paced.started)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                tally.finished.wait(), max(1.0, tally.deadline - time.perf_counter())
            )
        tally.deadline = 0.0  # stop the consumers
        await asyncio.gather(*consuming, return_exceptions=True)
        tally.errors.update(tally_pub.errors)
    # The window ends at the last message counted: a process whose consumers then wait out an
    # empty queue (IDLE_S), or leases that went to another process, does not stretch the rate.
    end = tally.last_op if tally.ops and workload != "latency" else time.time()
    usage1 = resource.getrusage(resource.RUSAGE_SELF)
    close = getattr(load, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
    return {
        "ops": tally.ops,
        "start": start,
        "end": end,
        "cpu_s": (usage1.ru_utime + usage1.ru_stime) - (usage0.ru_utime + usage0.ru_stime),
        "errors": dict(tally.errors),
        "idle": tally.idle,
        "latencies_ms": tally.latencies_ms,
        "sent_per_s": sent_rate,
    }


class Pacer:
    """Hands out stamped bodies at a fixed rate to however many publisher tasks ask: each
    `body()` waits for its message's due time, and the stamp is taken when it is sent (the
    publishers' number bounds how many are in flight, so one slow ack does not stop the clock)."""

    def __init__(self, tally: Tally, rate: float) -> None:
        self.tally = tally
        self.interval = 1.0 / rate
        self.started = time.perf_counter()
        self.issued = 0

    async def body(self) -> bytes:
        due = self.started + self.issued * self.interval
        self.issued += 1
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        return stamped_body()


def child_main(spec_json: str) -> int:
    import uvloop

    result = uvloop.run(run_child(json.loads(spec_json)))
    write_result(result)
    return 0


def redis_peer(procs: Processes, directory: str, version: str) -> Peer:
    redis = start_redis(procs, directory, version)
    return Peer("redis", redis.port, version, lambda: [redis.proc.pid], handle=redis)


def floor_peer(procs: Processes, directory: str) -> Peer:
    """`bench.floor_server` with 2 worker processes, its queues under `directory`."""
    floor = start_floor_server(procs, directory, 2)
    return Peer(
        "floor",
        floor.port,
        "-",
        lambda: process_tree(floor.proc.pid),
        handle=directory,
        detail="2 workers",
    )


def dirmq_peer(procs: Processes, directory: str) -> Peer:
    server = start_dirmq(procs, directory, 2, "dirmq-peers")
    return Peer("dirmq", server.port, source_revision(), lambda: list(server.pids), handle=server)


# == setting up each trial (parent process) =====================================================
class Admin:
    """Creates, preloads and deletes each trial's queue, untimed, from the parent process."""

    def __init__(self, servers: dict[str, Peer]) -> None:
        self.servers = servers
        self.loop = asyncio.new_event_loop()
        self.rabbit: Any = None
        self.rabbit_channel: Any = None
        self.nats: Any = None
        self.js: Any = None

    def run(self, coroutine: Awaitable[Any]) -> Any:
        return self.loop.run_until_complete(coroutine)

    def connect(self) -> None:
        if "rabbitmq" in self.servers:
            self.run(self._connect_rabbit(self.servers["rabbitmq"].port))
        if "nats" in self.servers:
            self.run(self._connect_nats(self.servers["nats"].port))

    async def _connect_rabbit(self, port: int) -> None:
        import aio_pika

        deadline = time.monotonic() + 120
        while True:  # the port opens a little before the broker takes logins
            try:
                self.rabbit = await aio_pika.connect(f"amqp://guest:guest@{HOST}:{port}/")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
        self.rabbit_channel = await self.rabbit.channel(publisher_confirms=True)

    async def _connect_nats(self, port: int) -> None:
        import nats

        self.nats = await nats.connect(f"nats://{HOST}:{port}", max_reconnect_attempts=0)
        self.js = self.nats.jetstream()
        await self.js.account_info()  # JetStream is enabled

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.rabbit is not None:
                self.run(self.rabbit.close())
            if self.nats is not None:
                self.run(self.nats.close())
        self.loop.close()

    # -- per trial ------------------------------------------------------------------------------
    def create(self, system: str, name: str, consumers: int) -> dict[str, Any]:
        """A fresh queue (stream) `name`; returns what the load processes need to find it."""
        server = self.servers[system]
        spec: dict[str, Any] = {"port": server.port, "queue": name}
        if system == "dirmq":
            create_queue(server.port, name)
        elif system == "floor":
            for sub in ("ready", "leased"):
                os.makedirs(os.path.join(server.handle, name, sub))
        elif system == "rabbitmq":
            self.run(self.rabbit_channel.declare_queue(name, durable=True))
        elif system == "redis":
            server.handle.client.delete(name)
        elif system == "nats":
            spec |= {"stream": stream_name(name), "durable": "workers"}
            self.run(self._create_stream(stream_name(name), name, consumers))
        return spec

    async def _create_stream(self, stream: str, subject: str, consumers: int) -> None:
        from nats.js.api import (
            AckPolicy,
            ConsumerConfig,
            RetentionPolicy,
            StorageType,
            StreamConfig,
        )

        config = StreamConfig(
            name=stream,
            subjects=[subject],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
        )
        await self.js.add_stream(config)
        await self.js.add_consumer(
            stream,
            ConsumerConfig(
                durable_name="workers",
                ack_policy=AckPolicy.EXPLICIT,
                max_ack_pending=max(1000, 4 * consumers * PREFETCH),
            ),
        )

    def preload(self, system: str, name: str, count: int) -> None:
        server = self.servers[system]
        if system == "dirmq":
            chunk = 200
            line = b'{"body":"' + BODY + b'"}\n'
            headers = {"Content-Type": "application/x-ndjson"}
            for size in chunks(count, chunk):
                status, _, body = http_call(
                    server.port, "POST", f"/{name}/messages", line * size, headers
                )
                if status != 201:
                    raise RuntimeError(f"dirmq preload: {status} {body[:200]!r}")
        elif system == "floor":  # the names and count floor_server.py expects
            directory = os.path.join(server.handle, name)
            for i in range(count):
                with open(os.path.join(directory, "ready", f"{i:012d}"), "wb") as f:
                    f.write(BODY)
            Path(directory, "count").write_text(str(count))
        elif system == "rabbitmq":
            self.run(self._preload_rabbit(name, count))
        elif system == "redis":
            for size in chunks(count, 1000):
                server.handle.client.lpush(name, *([BODY] * size))
        elif system == "nats":
            self.run(self._preload_nats(name, count))

    async def _preload_rabbit(self, name: str, count: int) -> None:
        import aio_pika

        exchange = self.rabbit_channel.default_exchange
        for size in chunks(count, 1000):
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(BODY, delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        routing_key=name,
                    )
                    for _ in range(size)
                )
            )

    async def _preload_nats(self, name: str, count: int) -> None:
        for size in chunks(count, 500):
            await asyncio.gather(*(self.js.publish(name, BODY) for _ in range(size)))

    def depth(self, system: str, name: str) -> int:
        """Messages still in the queue (ready, or leased and not acked) after a trial."""
        server = self.servers[system]
        if system == "dirmq":
            stats = queue_stats(server.port, name)
            return int(stats["ready"]) + int(stats["in_flight"])
        if system == "floor":
            directory = os.path.join(server.handle, name)
            return sum(len(os.listdir(os.path.join(directory, d))) for d in ("ready", "leased"))
        if system == "rabbitmq":
            queue = self.run(self.rabbit_channel.declare_queue(name, durable=True, passive=True))
            return int(queue.declaration_result.message_count)
        if system == "redis":
            return int(server.handle.client.llen(name))
        info = self.run(self.js.stream_info(stream_name(name)))
        return int(info.state.messages)

    def delete(self, system: str, name: str) -> None:
        """Delete a trial's queue. dirmq's and the floor's are left for the run's end (the data
        directory goes then): on this disk (ext4 with `discard`, no journal) unlinking a
        trial's 20,000-60,000 files makes every file created in the next minute slow (a
        create measured 22 µs of kernel time before such a deletion, 450-690 µs after), so the
        next trial would pay for this one's cleanup. The other systems keep a queue in a few
        files."""
        if system in ("dirmq", "floor"):
            return
        server = self.servers[system]
        try:
            if system == "rabbitmq":
                self.run(self.rabbit_channel.queue_delete(name))
            elif system == "redis":
                client = server.handle.client
                keys = [name, *client.scan_iter(match=f"{name}:processing:*", count=1000)]
                client.delete(*keys)
            elif system == "nats":
                self.run(self.js.delete_stream(stream_name(name)))
        except Exception as exc:
            print(f"  warning: could not delete {system} {name}: {exc!r}", file=sys.stderr)


def stream_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name).upper()


def chunks(total: int, size: int) -> list[int]:
    return [min(size, total - start) for start in range(0, total, size)]


# == what the dirmq server supports yet =========================================================
def probe_batch_ack(port: int) -> str | None:
    """Contract 2's `POST /{queue}/messages/ack`: None when it settles a real lease."""
    name = "peers-probe-batchack"
    create_queue(port, name)
    try:
        status, _, _ = http_call(port, "POST", f"/{name}/messages", BODY)
        status, headers, _ = http_call(port, "GET", f"/{name}/messages")
        if status != 200:
            return f"probe: GET answered {status}"
        body = json.dumps({"receipts": [headers["x-receipt"]]}).encode()
        status, _, answer = http_call(
            port, "POST", f"/{name}/messages/ack", body, {"Content-Type": "application/json"}
        )
        if status != 200:
            return f"the server answers POST /{{queue}}/messages/ack with {status} (not built yet)"
        settled = json.loads(answer).get("settled")
        return None if settled == 1 else f"POST /{{queue}}/messages/ack settled {settled!r}, not 1"
    finally:
        http_call(port, "DELETE", f"/{name}")


def probe_stream(port: int) -> str | None:
    """Contract 3's WebSocket upgrade on an empty queue (a plain GET would answer 204)."""
    name = "peers-probe-stream"
    create_queue(port, name)
    try:
        headers = {
            "Connection": "Upgrade",
            "Upgrade": "websocket",
            "Sec-WebSocket-Version": "13",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        }
        try:
            status, _, _ = http_call(port, "GET", f"/{name}/messages", b"", headers, 5)
        except OSError as exc:
            return f"the WebSocket upgrade failed: {exc!r}"
        if status != 101:
            return f"the server answers a WebSocket upgrade with {status}, not 101 (not built yet)"
        return stream_api_problem()
    finally:
        http_call(port, "DELETE", f"/{name}")


# == running trials (parent process) ============================================================
@dataclass
class Outcome:
    trial: Any  # Trial
    latency: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.trial.to_json()
        ops = max(1, self.trial.ops)
        data["server_cpu_us_per_msg"] = round(self.trial.server_cpu_s / ops * 1e6, 1)
        data["load_cpu_us_per_msg"] = round(self.trial.client_cpu_s / ops * 1e6, 1)
        if self.latency is not None:
            data["latency"] = self.latency
        return data


def run_children(
    procs: Processes, specs: list[dict[str, Any]], server: Peer, budget_s: float
) -> tuple[Any, list[dict[str, Any]]]:
    children = [LoadChild(procs, spec, CHILD) for spec in specs]
    try:
        for child in children:
            if (said := child.line(120)) != "ready":
                raise RuntimeError(f"load process said {said[:300]!r}, not 'ready'")
        pids = server.pids()
        cpu0 = cpu_seconds(pids)
        for child in children:
            child.go()
        results = [json.loads(c.line(budget_s + 120)) for c in children]
        server_cpu = cpu_seconds(pids) - cpu0
    finally:
        for child in children:
            if child.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    child.proc.stdin.close()
            procs.reap(child.proc, 30)
    errors: collections.Counter[str] = collections.Counter()
    for result in results:
        errors.update(result["errors"])
    trial = Trial(
        ops=sum(r["ops"] for r in results),
        seconds=max(r["end"] for r in results) - min(r["start"] for r in results),
        server_cpu_s=server_cpu,
        client_cpu_s=sum(r["cpu_s"] for r in results),
        errors=dict(errors),
        dry=sum(r["idle"] for r in results),
    )
    return trial, results


def consumers_of(subject: Subject, count: int) -> dict[str, Any]:
    """`count` consumers of one load process. dirmq's streaming client is synchronous, one thread
    per consumer, and 8 such threads in one process fight over the GIL (a smoke run with a
    10,000 backlog: 70-85 µs of load CPU per message, against ~27 µs with one thread, at the
    same rate): so a load process runs one stream whose credit window is the sum of its share of
    the consumers' windows, the same total credit as 16 consumers of 50."""
    if subject.system == "dirmq" and subject.form.startswith("stream"):
        return {"tasks": 1, "prefetch": PREFETCH * count}
    return {"tasks": count}


def run_trial(ctx: Run, subject: Subject, round_no: int) -> Outcome:
    s = ctx.settings
    server = ctx.servers[subject.system]
    name = f"peers-{subject.workload}-{subject.form}-r{round_no + 1}-{ctx.trials_run}"
    ctx.trials_run += 1
    base = ctx.admin.create(subject.system, name, s.consumers)
    base |= {"system": subject.system, "form": subject.form, "workload": subject.workload}
    try:
        if subject.workload == "publish":
            procs = min(s.load_procs, s.concurrency)
            specs = [
                base | {"quota": q, "tasks": t, "budget_s": s.trial_s}
                for q, t in zip(split(s.messages, procs), split(s.concurrency, procs), strict=True)
            ]
            os.sync()  # (see below)
            trial, _ = run_children(ctx.procs, specs, server, s.trial_s)
            return Outcome(trial)
        if subject.workload in ("consume", "consume-batch"):
            ctx.admin.preload(subject.system, name, s.backlog)
            # Every trial starts with no dirty page cache: the previous trial's writes (NATS
            # flushes every 2 minutes, a preload is not flushed) belong to no system under test,
            # and a `syncfs` (dirmq's group commit) or a journal commit would write them too.
            os.sync()
            procs = min(s.load_procs, s.consumers)
            target = max(1, int(s.backlog * CONSUMED_SHARE))
            specs = [
                base | {"quota": q, "budget_s": s.trial_s} | consumers_of(subject, t)
                for q, t in zip(split(target, procs), split(s.consumers, procs), strict=True)
            ]
            trial, _ = run_children(ctx.procs, specs, server, s.trial_s)
            if trial.ops < target and not trial.errors:
                left = ctx.admin.depth(subject.system, name)
                print(f"    note: {subject.label} consumed {trial.ops} of {target} ({left} left)")
            return Outcome(trial)
        count = max(1, int(s.rate * s.latency_s))
        os.sync()
        spec = (
            base
            | consumers_of(subject, s.consumers)
            | {
                "quota": count,
                "publishers": 16,
                "rate": s.rate,
                "budget_s": s.latency_s + 15,
            }
        )
        trial, results = run_children(ctx.procs, [spec], server, s.latency_s + 15)
        samples = results[0]["latencies_ms"]
        latency = {
            "received": len(samples),
            "sent": count,
            "sent_per_s": round(results[0]["sent_per_s"], 1),
            "p50_ms": round(percentile(samples, 50), 3),
            "p99_ms": round(percentile(samples, 99), 3),
            "max_ms": round(max(samples), 3) if samples else math.nan,
        }
        return Outcome(trial, latency)
    finally:
        ctx.admin.delete(subject.system, name)


@dataclass
class Run:
    settings: Settings
    procs: Processes  # Processes
    servers: dict[str, Peer]
    admin: Admin
    subjects: list[Subject]
    skipped: dict[str, str]  # subject key -> why
    outcomes: dict[str, list[Outcome]] = field(default_factory=dict)
    failures: dict[str, list[str]] = field(default_factory=dict)  # subject key -> what failed
    trials_run: int = 0
    data_dir: str = ""  # where the servers' data lives (and the consume floor runs)
    # floor name -> its rate in each round (msg/s): FLOORS' bare loops on the servers' disk
    floors: dict[str, list[float]] = field(default_factory=dict)


def run_floors(ctx: Run, workloads: list[str], round_no: int) -> None:
    """This round's design floors of the workloads run (FLOORS), on the servers' filesystem, in
    an order rotated from round to round as the subjects' (the first after a trial of another
    kind, e.g. the disk still writing back, is not always the same one)."""
    s = ctx.settings
    floors = [f for f in FLOORS if set(f.workloads) & set(workloads)]
    shift = round_no % max(1, len(floors))
    for floor in floors[shift:] + floors[:shift]:
        if floor.name == "consume":
            rate, seconds = consume_floor(ctx.data_dir, s.backlog)
        else:
            rate, seconds = publish_floor(
                ctx.data_dir, s.messages, s.concurrency, floor.lines, flush=floor.flush
            )
        ctx.floors.setdefault(floor.name, []).append(round(rate, 1))
        print(f"  {'floor':<13} {floor.label:<38} {rate:9,.0f} msg/s ({seconds:.1f} s)", flush=True)


def run_rounds(ctx: Run, workloads: list[str]) -> None:
    """Round-major: each round runs every workload, and in it every subject once, the subjects'
    order rotated from round to round. Each round first measures the design floors of the
    workloads run (`run_floors`) on the same filesystem."""
    for r in range(ctx.settings.rounds):
        print(f"\n== round {r + 1} of {ctx.settings.rounds} ==", flush=True)
        run_floors(ctx, workloads, r)
        for workload in workloads:
            subjects = [s for s in ctx.subjects if s.workload == workload]
            if not subjects:
                continue
            shift = r % len(subjects)
            for subject in subjects[shift:] + subjects[:shift]:
                try:
                    outcome = run_trial(ctx, subject, r)
                except Exception as exc:  # one broken trial does not void the others
                    ctx.failures.setdefault(subject.key, []).append(f"round {r + 1}: {exc!r}")
                    print(
                        f"  {subject.workload:<13} {subject.label:<38} FAILED: {exc!r}", flush=True
                    )
                    continue
                ctx.outcomes.setdefault(subject.key, []).append(outcome)
                print("  " + describe(subject, outcome), flush=True)


def describe(subject: Subject, outcome: Outcome) -> str:
    t = outcome.trial
    ops = max(1, t.ops)
    text = (
        f"{subject.workload:<13} {subject.label:<38} {t.rate:>9,.0f} msg/s  "
        f"server {t.server_cpu_s / ops * 1e6:5.0f} us/msg ({t.server_cores:.2f} cores), "
        f"load {t.client_cpu_s / ops * 1e6:5.0f} us/msg"
    )
    if outcome.latency is not None:
        lat = outcome.latency
        text += (
            f"; p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms "
            f"({lat['received']}/{lat['sent']} at {lat['sent_per_s']:.0f}/s)"
        )
    if t.errors:
        text += f"; ERRORS {t.errors}"
    return text


def summarize(ctx: Run) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for subject in ctx.subjects:
        outcomes = ctx.outcomes.get(subject.key, [])
        if not outcomes:
            continue
        row: dict[str, Any] = {
            "workload": subject.workload,
            "system": subject.system,
            "form": subject.form,
            "label": subject.label,
            "median_per_s": round(median(o.trial.rate for o in outcomes), 1),
            "median_server_cpu_us_per_msg": round(
                median(o.trial.server_cpu_s / max(1, o.trial.ops) * 1e6 for o in outcomes), 1
            ),
            "median_load_cpu_us_per_msg": round(
                median(o.trial.client_cpu_s / max(1, o.trial.ops) * 1e6 for o in outcomes), 1
            ),
            "median_server_cores": round(median(o.trial.server_cores for o in outcomes), 2),
            "median_load_cores": round(median(o.trial.client_cores for o in outcomes), 2),
            "trials": [o.to_json() for o in outcomes],
        }
        if subject.workload == "latency":
            row["median_p50_ms"] = round(
                median(o.latency["p50_ms"] for o in outcomes if o.latency), 3
            )
            row["median_p99_ms"] = round(
                median(o.latency["p99_ms"] for o in outcomes if o.latency), 3
            )
        rows[subject.key] = row
    return rows


def per_round(ctx: Run, top: str, bottom: str) -> list[float]:
    a, b = ctx.outcomes.get(top, []), ctx.outcomes.get(bottom, [])
    return [round(ratio(x.trial.rate, y.trial.rate), 3) for x, y in zip(a, b, strict=False)]


def ratios(ctx: Run) -> list[dict[str, Any]]:
    """Each dirmq subject against each peer's subject of the same workload, per round."""
    found = []
    for workload in WORKLOADS:
        if workload == "latency":
            continue
        mine = [s for s in ctx.subjects if s.workload == workload and s.system == "dirmq"]
        peers = [s for s in ctx.subjects if s.workload == workload and s.system != "dirmq"]
        for a in mine:
            for b in peers:
                rounds = per_round(ctx, a.key, b.key)
                if rounds:
                    found.append(
                        {
                            "top": a.label,
                            "bottom": b.label,
                            "per_round": rounds,
                            "median": median(rounds),
                        }
                    )
    return found


def targets(ctx: Run) -> list[dict[str, Any]]:
    """The ratios issue 18 asks for (no thresholds given: reported, not judged)."""

    def best_per_round(keys: list[str]) -> list[float]:
        series = [ctx.outcomes.get(k, []) for k in keys]
        series = [s for s in series if s]
        if not series:
            return []
        return [max(o.trial.rate for o in group) for group in zip(*series, strict=False)]

    def entry(name: str, tops: list[str], bottoms: list[str]) -> dict[str, Any]:
        top, bottom = best_per_round(tops), best_per_round(bottoms)
        rounds = [round(ratio(a, b), 3) for a, b in zip(top, bottom, strict=False)]
        missing = [k for k in tops + bottoms if k in ctx.skipped]
        why = "; ".join(f"{k}: {ctx.skipped[k]}" for k in missing)
        return {
            "name": name,
            "median": median(rounds) if rounds else None,
            "per_round": rounds,
            "skipped": (why or "not run") if not rounds else "",
        }

    rabbit_each = ["consume/rabbitmq/ack"]
    return [
        entry(
            "dirmq streaming consume vs best of RabbitMQ/Redis consume",
            ["consume/dirmq/stream", "consume-batch/dirmq/stream-cumulative"],
            ["consume/rabbitmq/ack", "consume/redis/lmove"],
        ),
        entry(
            "dirmq streaming consume vs dirmq publish",
            ["consume/dirmq/stream", "consume-batch/dirmq/stream-cumulative"],
            ["publish/dirmq/post"],
        ),
        entry("dirmq GET + DELETE vs RabbitMQ ack each", ["consume/dirmq/getack"], rabbit_each),
        entry(
            "dirmq GET + DELETE vs its floor (bare HTTP + syscalls)",
            ["consume/dirmq/getack"],
            ["consume/floor/getack"],
        ),
        entry(
            "dirmq native batch vs its floor (bare HTTP + syscalls)",
            ["consume-batch/dirmq/batchack"],
            ["consume-batch/floor/batchack"],
        ),
        entry(
            "dirmq native batch ack vs RabbitMQ ack each",
            ["consume-batch/dirmq/batchack"],
            rabbit_each,
        ),
        entry(
            "dirmq SQS DeleteMessageBatch vs RabbitMQ ack each",
            ["consume-batch/dirmq/sqs"],
            rabbit_each,
        ),
        entry(
            "dirmq stream cumulative acks vs RabbitMQ ack each",
            ["consume-batch/dirmq/stream-cumulative"],
            rabbit_each,
        ),
        entry(
            "dirmq publish vs RabbitMQ publish",
            ["publish/dirmq/post"],
            ["publish/rabbitmq/confirm"],
        ),
    ]


def floor_ratios(ctx: Run) -> list[dict[str, Any]]:
    """Every system's row against each design floor of its workload: the median of per-round
    ratios (each trial against the floor measured in the same round)."""
    found = []
    for floor in FLOORS:
        rates = ctx.floors.get(floor.name, [])
        if not rates:
            continue
        for subject in ctx.subjects:
            if subject.workload not in floor.workloads:
                continue
            outcomes = ctx.outcomes.get(subject.key, [])
            rounds = [
                round(ratio(o.trial.rate, f), 3) for o, f in zip(outcomes, rates, strict=False)
            ]
            if rounds:
                found.append(
                    {
                        "floor": floor.name,
                        "subject": subject.key,
                        "label": subject.label,
                        "per_round": rounds,
                        "median": median(rounds),
                    }
                )
    return found


def print_table(
    rows: dict[str, Any],
    found: list[dict[str, Any]],
    goals: list[dict[str, Any]],
    skipped: dict[str, str],
    rounds: int,
    floors: dict[str, list[float]] | None = None,
    vs_floors: list[dict[str, Any]] | None = None,
) -> None:
    print(
        f"\n== results: medians of {rounds} round(s); 1 KiB bodies; "
        "servers and load share the cores =="
    )
    print(
        f"{'workload':<13} {'subject':<38} {'msg/s':>9} {'server us/msg':>13} "
        f"{'load us/msg':>11}  latency"
    )
    for row in rows.values():
        lat = ""
        if row["workload"] == "latency":
            lat = f"p50 {row['median_p50_ms']:.2f} ms, p99 {row['median_p99_ms']:.2f} ms"
        print(
            f"{row['workload']:<13} {row['label']:<38} {row['median_per_s']:>9,.0f} "
            f"{row['median_server_cpu_us_per_msg']:>13,.0f} "
            f"{row['median_load_cpu_us_per_msg']:>11,.0f}  {lat}"
        )
    for key, why in skipped.items():
        print(f"{key:<52} skipped: {why}")
    for floor in FLOORS:
        rates = (floors or {}).get(floor.name)
        if not rates:
            continue
        print(f"\n== floor: {floor.label}: {median(rates):,.0f} msg/s {rates} ==")
        for r in vs_floors or []:
            if r["floor"] == floor.name:
                print(f"  {r['label']:<38} {r['median']:6.2f}x the floor  {r['per_round']}")
                if r["subject"] == "publish/redis/lpush":  # the floor against Redis always
                    back = [round(1 / x, 3) for x in r["per_round"] if x]
                    if back:
                        print(f"  {'the floor / Redis LPUSH (always)':<38} {median(back):6.2f}x")
    print("\n== dirmq / peer, median of per-round ratios ==")
    for r in found:
        print(f"  {r['top']:<38} / {r['bottom']:<38} {r['median']:6.2f}x  {r['per_round']}")
    print("\n== issue 18 ratios ==")
    for g in goals:
        value = f"{g['median']:.2f}x" if g["median"] is not None else "skipped"
        detail = g["skipped"] or str(g["per_round"])
        print(f"  {g['name']:<58} {value:>8}  {detail}")
    print("\nfsync per system:")
    for system, text in FSYNC.items():
        print(f"  {SYSTEM_NAMES[system]:<9} {text}")


COLORS = {
    "dirmq": "#1f77b4",
    "floor": "#7f7f7f",
    "rabbitmq": "#ff7f0e",
    "redis": "#d62728",
    "nats": "#2ca02c",
}


# == main ==========================================================================================
def ensure_installed(systems: list[str]) -> dict[str, str]:
    """Debian packages and pip packages, each only when missing; returns versions."""
    versions: dict[str, str] = {}
    if "redis" in systems:
        versions["redis-server"] = ensure_redis_server()
    if "nats" in systems:
        ensure_debian_tool("nats-server", "nats-server")
    if "rabbitmq" in systems and not os.path.exists(RABBIT_SERVER):
        print("installing rabbitmq-server (apt-get) ...", file=sys.stderr, flush=True)
        apt_install("rabbitmq-server")
    pip = ensure_pip(PIP_NEEDS)
    missing = [r for _, dist, r in PIP_NEEDS if pip[dist] == "missing"]
    if missing:
        raise SystemExit(f"missing and could not be installed: pip install {' '.join(missing)}")
    return versions | pip
    return versions


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts, 1 round: a smoke run")
    parser.add_argument("--messages", type=int, help="messages per publish trial (20,000)")
    parser.add_argument("--backlog", type=int, help="backlog preloaded per consume trial (60,000)")
    parser.add_argument("--rounds", type=int, help="rounds (3)")
    parser.add_argument("--consumers", type=int, help="concurrent consumers (16)")
    parser.add_argument("--concurrency", type=int, help="concurrent publishers (64)")
    parser.add_argument("--rate", type=float, help="latency: messages per second (1,000)")
    parser.add_argument("--latency-seconds", type=float, help="latency: publishing time (10)")
    parser.add_argument("--trial-seconds", type=float, help="time budget of a trial (60)")
    parser.add_argument("--load-procs", type=int, help="load generator processes (2)")
    parser.add_argument(
        "--systems", default=",".join(SYSTEMS), help=f"subset of {','.join(SYSTEMS)}"
    )
    parser.add_argument(
        "--workloads", default=",".join(WORKLOADS), help=f"subset of {','.join(WORKLOADS)}"
    )
    parser.add_argument("--dir", help="where the servers' data lives (default: a temp dir in /tmp)")
    parser.add_argument("--json", default=str(RESULTS / "peers.json"), help="results file")
    parser.add_argument("--chart", default=str(RESULTS / "peers.png"), help="chart file (PNG)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace) -> Settings:
    base = QUICK if args.quick else FULL
    changes = {
        "messages": args.messages,
        "backlog": args.backlog,
        "rounds": args.rounds,
        "consumers": args.consumers,
        "concurrency": args.concurrency,
        "rate": args.rate,
        "latency_s": args.latency_seconds,
        "trial_s": args.trial_seconds,
        "load_procs": args.load_procs,
    }
    values = {k: v for k, v in changes.items() if v is not None}
    for key, value in values.items():
        if value <= 0:
            raise SystemExit(
                f"--{key.replace('_s', '-seconds').replace('_', '-')} must be positive"
            )
    return dataclasses.replace(base, **values) if values else base


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child)
    settings = settings_of(args)
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if bad := set(systems) - set(SYSTEMS):
        raise SystemExit(f"unknown systems {sorted(bad)}: choose from {', '.join(SYSTEMS)}")
    if bad := set(workloads) - set(WORKLOADS):
        raise SystemExit(f"unknown workloads {sorted(bad)}: choose from {', '.join(WORKLOADS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    versions = ensure_installed(systems)
    raise_fd_limit()
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix="dirmq-peers-bench-", dir=parent)
    procs = Processes()
    servers: dict[str, Peer] = {}
    admin: Admin | None = None
    started = time.perf_counter()
    print(f"dirmq vs peers ({'quick' if args.quick else 'full'}): {settings}")
    print(f"  data in {data_dir} ({filesystem_of(data_dir)})", flush=True)
    try:
        for system in systems:
            where = os.path.join(data_dir, system)
            if system == "dirmq":
                servers[system] = dirmq_peer(procs, where)
            elif system == "floor":
                servers[system] = floor_peer(procs, where)
            elif system == "rabbitmq":
                servers[system] = start_rabbitmq(procs, where)
            elif system == "redis":
                servers[system] = redis_peer(procs, where, versions["redis-server"])
            else:
                servers[system] = start_nats(procs, where)
            server = servers[system]
            print(
                f"  started {system} {server.version} on port {server.port} {server.detail}",
                flush=True,
            )
        admin = Admin(servers)
        admin.connect()
        skipped: dict[str, str] = {}
        if "dirmq" in servers:
            reasons = {
                "batchack": probe_batch_ack(servers["dirmq"].port),
                "stream": probe_stream(servers["dirmq"].port),
            }
            for subject in SUBJECTS:
                if subject.needs and reasons[subject.needs]:
                    skipped[subject.key] = str(reasons[subject.needs])
            for key, why in skipped.items():
                print(f"  skipping {key}: {why}", flush=True)
        subjects = [
            s
            for s in SUBJECTS
            if s.system in servers and s.workload in workloads and s.key not in skipped
        ]
        run = Run(settings, procs, servers, admin, subjects, skipped, data_dir=data_dir)
        run_rounds(run, workloads)
    finally:
        if admin is not None:
            admin.close()
        procs.stop_all()
        shutil.rmtree(data_dir, ignore_errors=True)
    rows = summarize(run)
    found = ratios(run)
    goals = targets(run)
    seconds = round(time.perf_counter() - started, 1)
    vs_floors = floor_ratios(run)
    print_table(rows, found, goals, skipped, settings.rounds, run.floors, vs_floors)
    report = {
        "mode": "quick" if args.quick else "full",
        "settings": dataclasses.asdict(settings),
        "seconds": seconds,
        "machine": {
            "source": source_revision(),
            "when": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_end": os.getloadavg(),
            "data_fs": filesystem_of(parent),
            "note": "load generator and servers share the same cores",
        },
        "servers": {
            s: {"version": v.version, "port": v.port, "fsync": FSYNC[s]} for s, v in servers.items()
        },
        "pip": versions,
        "body_bytes": BODY_BYTES,
        "skipped": skipped,
        "failures": run.failures,
        "floors": {
            floor.name: {
                "what": FLOOR_WHAT[floor.name],
                "per_round_per_s": run.floors[floor.name],
                "median_per_s": median(run.floors[floor.name]),
                "vs_floor": {
                    r["subject"]: {"median": r["median"], "per_round": r["per_round"]}
                    for r in vs_floors
                    if r["floor"] == floor.name
                },
            }
            for floor in FLOORS
            if run.floors.get(floor.name)
        },
        "results": rows,
        "ratios": found,
        "targets": goals,
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    chart = Path(args.chart)
    title = (
        f"dirmq vs peers, loopback, {os.cpu_count()} cores shared with the load, 1 KiB bodies, "
        f"medians of {settings.rounds} round(s){' (quick: not a result)' if args.quick else ''}"
    )
    draw_chart(rows, chart, title, WORKLOADS, COLORS)
    print(f"\nwrote {out} and {chart} ({seconds} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
