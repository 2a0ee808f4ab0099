"""Sections 3, 4 and 5: get+ack on a prefilled queue, held long polls, and publish-to-wake
latency, against Redis."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import http.client
import math
import os
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness import BODY, HOST
from bench.harness.load import LoadChild, Trial, split
from bench.harness.loadgen import publish_spec
from bench.harness.peers import RedisServer
from bench.harness.procs import cpu_seconds, fd_count, vm_rss_kib
from bench.harness.rounds import (
    check_clean,
    cores_note,
    median_of,
    paired,
    percentile,
    rate_text,
    run_rounds,
    series,
)
from bench.harness.servers import DirmqServer, create_queue, http_call, queue_stats, warm_up
from bench.harness.wire import (
    RESP_ARRAY,
    RESP_INT,
    Reply,
    batch_body,
    header_value,
    http_request,
    parse_http,
    parse_resp,
    resp_command,
)
from bench.http_load.context import (
    BATCH,
    CONNECT_GATE,
    CONNECTIONS,
    PARK_S,
    REDIS_CLIENTS,
    Context,
    profile_trial,
)


def prefill_dirmq(ctx: Context, server: DirmqServer, name: str, count: int) -> None:
    """Fill `name` with at least `count` messages (batches, writeback: untimed), then flush."""
    create_queue(server.port, name)
    spec = publish_spec(name, BATCH, (("X-Durability", "writeback"),))
    spec |= {"max_ops": count, "duration_s": 300.0}
    trial = ctx.load(server, spec, 8, 1)
    if trial.errors or trial.ops < count:
        raise RuntimeError(f"prefill of {name}: {trial.ops} of {count}, errors {trial.errors}")
    os.sync()
    warm_up(server.port, name)


def prefill_redis(redis: RedisServer, key: str, count: int) -> None:
    redis.client.delete(key)
    pipe = redis.client.pipeline(transaction=False)
    for start in range(0, count, 1000):
        pipe.rpush(key, *([BODY] * min(1000, count - start)))
    pipe.execute()


def bench_getack(ctx: Context) -> None:
    print(
        f"\n[3] get+ack on a prefilled queue: dirmq {CONNECTIONS} conns; Redis LMOVE+LREM and "
        f"RPOP, {REDIS_CLIENTS} clients, appendfsync always",
        flush=True,
    )
    server = ctx.dirmq("disk-w1", "disk", 1)
    redis = ctx.redis
    sizes = ctx.sizes

    def dirmq_getack(r: int, prefill: bool = True, on: DirmqServer = server) -> Trial:
        name = f"getack-{r}"
        if prefill:
            prefill_dirmq(ctx, on, name, sizes.dirmq_prefill)
        spec = {"script": "getack", "queue": name, "max_ops": int(sizes.dirmq_prefill * 0.9)}
        return ctx.load(on, spec, CONNECTIONS)

    def redis_move_remove(r: int) -> Trial:
        key, processing = f"ga-{r}", f"ga-{r}-processing"
        prefill_redis(redis, key, sizes.redis_prefill)
        redis.client.delete(processing)
        spec: dict[str, Any] = {"script": "move_remove", "source": key, "processing": processing}
        spec["max_ops"] = int(sizes.redis_prefill * 0.9)
        return ctx.load(redis, spec, REDIS_CLIENTS)

    def redis_rpop(r: int) -> Trial:
        key = f"pop-{r}"
        prefill_redis(redis, key, sizes.redis_prefill)
        request = resp_command(b"RPOP", key.encode()).decode("latin-1")
        spec = {"script": "pop", "request": request, "max_ops": int(sizes.redis_prefill * 0.9)}
        return ctx.load(redis, spec, REDIS_CLIENTS)

    subjects: dict[str, Callable[[int], Trial]] = {
        "dirmq get+ack": dirmq_getack,
        "redis lmove+lrem": redis_move_remove,
        "redis rpop": redis_rpop,
    }
    trials = run_rounds("get+ack", subjects, sizes.rounds)
    for name, ts in trials.items():
        check_clean(name, ts)
    rate = {k: median_of(v, lambda t: t.rate) for k, v in trials.items()}
    vs_move = paired(trials, "dirmq get+ack", "redis lmove+lrem")
    vs_pop = paired(trials, "dirmq get+ack", "redis rpop")
    report = ctx.report
    report.row(
        "get+ack, disk",
        f"dirmq, 1 worker, {CONNECTIONS} conns",
        rate_text(rate["dirmq get+ack"]),
        f"2 requests per msg; {statistics.median(vs_move):.2f}x Redis LMOVE+LREM, "
        f"{statistics.median(vs_pop):.2f}x RPOP (paired); " + cores_note(trials["dirmq get+ack"]),
    )
    report.row(
        "get+ack",
        f"Redis LMOVE+LREM always, {REDIS_CLIENTS} cl.",
        rate_text(rate["redis lmove+lrem"]),
        "reliable queue, 2 commands per msg; " + cores_note(trials["redis lmove+lrem"]),
    )
    report.row(
        "get (no ack)",
        f"Redis RPOP always, {REDIS_CLIENTS} clients",
        rate_text(rate["redis rpop"]),
        "at-most-once, 1 command per msg; " + cores_note(trials["redis rpop"]),
    )
    report.data["get_ack"] = {
        "dirmq_prefill": sizes.dirmq_prefill,
        "redis_prefill": sizes.redis_prefill,
        "subjects": {k: series(v) for k, v in trials.items()},
        "ratios_per_round_vs_lmove_lrem": vs_move,
        "ratios_per_round_vs_rpop": vs_pop,
    }
    profile_trial(
        ctx,
        "getack-w1",
        server,
        lambda: dirmq_getack(sizes.rounds, prefill=False),
        lambda: prefill_dirmq(ctx, server, f"getack-{sizes.rounds}", sizes.dirmq_prefill),
    )
    # The configuration issue 18 measured (`serve --workers 2`): profiled only, not in the table.
    if ctx.profile_dir is not None:
        w2 = ctx.dirmq("disk-w2", "disk", 2)
        profile_trial(
            ctx,
            "getack-w2",
            w2,
            lambda: dirmq_getack(sizes.rounds + 1, prefill=False, on=w2),
            lambda: prefill_dirmq(ctx, w2, f"getack-{sizes.rounds + 1}", sizes.dirmq_prefill),
        )


def wait_idle(pids: list[int], budget_s: float, quiet_s: float = 0.6) -> float:
    """Wait until the processes use (almost) no CPU for `quiet_s`; returns the time waited."""
    start = time.monotonic()
    last, quiet_since = cpu_seconds(pids), time.monotonic()
    while time.monotonic() - start < budget_s:
        time.sleep(0.1)
        now = cpu_seconds(pids)
        if now - last > 0.02:
            last, quiet_since = now, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            break
    return time.monotonic() - start


@dataclass(frozen=True, slots=True)
class HeldPolls:
    held: int
    accepted: int  # connections the server held before the polls were sent
    connect_s: float
    rss_before_kib: int
    rss_after_kib: int
    parked_s: float  # from "go" until the server held every poll, idle
    publish_s: float
    served: int
    empty: int
    errors: dict[str, int]
    delivery_s: list[float]  # per served message: from the first publish to its arrival

    @property
    def extra_kib_per_poll(self) -> float:
        return (self.rss_after_kib - self.rss_before_kib) / self.held if self.held else 0.0

    def to_json(self) -> dict[str, Any]:
        last = max(self.delivery_s, default=math.nan)
        return {
            "held": self.held,
            "accepted_before_polling": self.accepted,
            "connect_s": round(self.connect_s, 2),
            "rss_before_mib": round(self.rss_before_kib / 1024, 1),
            "rss_after_mib": round(self.rss_after_kib / 1024, 1),
            "extra_mib": round((self.rss_after_kib - self.rss_before_kib) / 1024, 1),
            "extra_kib_per_poll": round(self.extra_kib_per_poll, 2),
            "parked_s": round(self.parked_s, 2),
            "publish_s": round(self.publish_s, 3),
            "served": self.served,
            "empty": self.empty,
            "errors": self.errors,
            "delivery_p50_s": round(percentile(self.delivery_s, 50), 3),
            "delivery_p99_s": round(percentile(self.delivery_s, 99), 3),
            "delivery_last_s": round(last, 3),
            "served_per_s": round(self.served / last, 1) if last > 0 else None,
        }


def listen_backlog(port: int) -> int | None:
    """The accept-queue limit of the socket listening on `port` (`ss`'s Send-Q), if known."""
    try:
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    fields = out.split()
    return int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None


def hold_polls(
    ctx: Context,
    server: DirmqServer | RedisServer,
    request: bytes,
    ok: int,
    publish: Callable[[int], None],
) -> HeldPolls:
    """Open `longpolls` connections, wait until the server has accepted them all, send one long
    poll on each, measure the server's RSS before and while they are held, then `publish(n)` and
    collect who got what.

    Connections are opened a few at a time (`CONNECT_GATE` in flight over all load processes)
    and the polls are sent only once the server holds every connection: a burst of thousands of
    handshakes overflows a short accept queue, and a connection whose handshake the server
    dropped looks established to the client but is accepted only after retransmissions."""
    n = ctx.sizes.longpolls
    pid = server.pids[-1]  # the one process that serves
    wait_idle([pid], 10)
    rss_before, fds_before = vm_rss_kib(pid), fd_count(pid)
    nprocs = ctx.sizes.longpoll_procs
    spec = {
        "proto": "http" if isinstance(server, DirmqServer) else "resp",
        "port": server.port,
        "script": "longpoll",
        "request": request.decode("latin-1"),
        "ok": ok,
        "duration_s": 75.0,
        "max_ops": n,
        "connect_concurrency": max(1, CONNECT_GATE // nprocs),
    }
    opened = time.monotonic()
    children = [LoadChild(ctx.procs, {**spec, "conns": share}) for share in split(n, nprocs)]
    try:
        for child in children:
            child.expect("ready", 180)
        accepted = _wait_accepted(pid, fds_before + n, budget_s=90)
        connect_s = time.monotonic() - opened
        go = time.monotonic()
        for child in children:
            child.go()
        for child in children:
            child.expect("sent", 60)
        wait_idle([pid], 30)
        parked_s = time.monotonic() - go
        rss_after = vm_rss_kib(pid)
        published_at = time.time()
        publish(n)
        publish_s = time.time() - published_at
        results = [c.result(150) for c in children]
    finally:
        for child in children:
            if child.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    child.proc.stdin.close()
            ctx.procs.reap(child.proc, 15)
    errors: collections.Counter[str] = collections.Counter()
    for r in results:
        errors.update(r["errors"])
        if r["unfinished"]:
            errors["unfinished connections"] += r["unfinished"]
    return HeldPolls(
        held=n,
        accepted=accepted - fds_before,
        connect_s=connect_s,
        rss_before_kib=rss_before,
        rss_after_kib=rss_after,
        parked_s=parked_s,
        publish_s=publish_s,
        served=sum(r["ops"] for r in results),
        empty=sum(r["dry"] for r in results),
        errors=dict(errors),
        delivery_s=sorted(t - published_at for r in results for t in r["times"]),
    )


def _wait_accepted(pid: int, wanted_fds: int, budget_s: float) -> int:
    """Wait until `pid` has `wanted_fds` open, or its count stops growing for 15 s."""
    deadline = time.monotonic() + budget_s
    count, grew_at = fd_count(pid), time.monotonic()
    while count < wanted_fds and time.monotonic() < deadline:
        time.sleep(0.1)
        now = fd_count(pid)
        if now > count:
            count, grew_at = now, time.monotonic()
        elif time.monotonic() - grew_at > 15:
            break
    return count


def bench_longpoll(ctx: Context) -> None:
    n = ctx.sizes.longpolls
    print(f"\n[4] {n:,} held long polls (wait=60s), then {n:,} messages published", flush=True)
    # On tmpfs: section 1 measures the disk; this one the wake-up path and memory.
    server = ctx.dirmq("longpoll", "shm", 1)
    redis = ctx.redis
    name = "lp"
    create_queue(server.port, name)
    warm_up(server.port, name)
    status, _, _ = http_call(server.port, "GET", f"/{name}/messages?wait=0.2s")
    if status != 204:
        raise RuntimeError(f"warm-up long poll: {status}")

    def publish_dirmq(count: int) -> None:
        conn = http.client.HTTPConnection(HOST, server.port, timeout=60)
        body = batch_body(BATCH)
        try:
            for start in range(0, count, BATCH):
                size = min(BATCH, count - start)
                conn.request(
                    "POST",
                    f"/{name}/messages",
                    body=body if size == BATCH else batch_body(size),
                    headers={"Content-Type": "application/x-ndjson"},
                )
                response = conn.getresponse()
                response.read()
                if response.status != 201:
                    raise RuntimeError(f"publish to {name}: {response.status}")
        finally:
            conn.close()

    def publish_redis(count: int) -> None:
        for start in range(0, count, BATCH):
            redis.client.lpush("lp", *([BODY] * min(BATCH, count - start)))

    # A long lease, so the queue's stats afterwards still show who got a message.
    request = http_request("GET", f"/{name}/messages?wait=60s&visibility=600s")
    backlog = {"dirmq": listen_backlog(server.port), "redis": listen_backlog(redis.port)}
    print(f"  accept-queue limits of the listening sockets: {backlog}", flush=True)
    dirmq_polls = hold_polls(ctx, server, request, 200, publish_dirmq)
    stats = queue_stats(server.port, name)
    redis.client.delete("lp")
    redis_polls = hold_polls(
        ctx, redis, resp_command(b"BLPOP", b"lp", b"60"), RESP_ARRAY, publish_redis
    )
    report = ctx.report
    for label, polls in (("dirmq, 1 worker", dirmq_polls), ("Redis BLPOP", redis_polls)):
        info = polls.to_json()
        report.row(
            f"{n:,} held long polls: RSS",
            label,
            f"+{info['extra_mib']:,.1f} MiB",
            f"{info['extra_kib_per_poll']:.1f} KiB per poll "
            f"({info['rss_before_mib']} -> {info['rss_after_mib']} MiB); "
            f"{info['accepted_before_polling']:,} connections accepted in "
            f"{info['connect_s']:.1f} s, polls parked {info['parked_s']:.1f} s after sending",
        )
        report.row(
            f"{n:,} held long polls: wake",
            label,
            f"{info['served']:,} served",
            f"last after {info['delivery_last_s']:.2f} s (p50 {info['delivery_p50_s']:.2f} s), "
            f"{info['served_per_s'] or 0:,.0f}/s; publishing took {info['publish_s']:.2f} s"
            + (f"; errors {polls.errors}" if polls.errors else ""),
        )
    extra_mib = (dirmq_polls.rss_after_kib - dirmq_polls.rss_before_kib) / 1024
    report.target(
        f"extra RSS for {n:,} held long polls (MiB)",
        extra_mib,
        f"<= {100 * n / 10_000:.0f} MB",
        extra_mib * 1.048576 <= 100 * n / 10_000,
        f"{dirmq_polls.extra_kib_per_poll:.1f} KiB per poll; "
        f"Redis {redis_polls.extra_kib_per_poll:.1f} KiB",
    )
    report.target(
        "held long polls that got a message",
        dirmq_polls.served,
        f"= {n:,}",
        dirmq_polls.served == n,
        f"last one {max(dirmq_polls.delivery_s, default=math.nan):.2f} s after the first "
        f"publish; queue afterwards: {stats}",
    )
    report.data["held_long_polls"] = {
        "listen_backlog": backlog,
        "dirmq": dirmq_polls.to_json() | {"queue_stats_after": stats},
        "redis": redis_polls.to_json(),
    }


class Rpc(asyncio.Protocol):
    """A connection for request/response in turn; replies carry their arrival time."""

    def __init__(self, parse: Callable[[bytearray], Reply | None]) -> None:
        self.parse = parse
        self.buf = bytearray()
        self.waiting: collections.deque[asyncio.Future[tuple[float, Reply]]] = collections.deque()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def send(self, data: bytes) -> asyncio.Future[tuple[float, Reply]]:
        future: asyncio.Future[tuple[float, Reply]] = asyncio.get_running_loop().create_future()
        self.waiting.append(future)
        assert self.transport is not None
        self.transport.write(data)
        return future

    def data_received(self, data: bytes) -> None:
        arrived = time.perf_counter()
        self.buf += data
        while self.waiting:
            reply = self.parse(self.buf)
            if reply is None:
                return
            del self.buf[: reply[0]]
            future = self.waiting.popleft()
            if not future.done():
                future.set_result((arrived, reply))

    def connection_lost(self, exc: Exception | None) -> None:
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(ConnectionResetError("connection lost"))


@dataclass
class WakeSubject:
    name: str
    port: int
    parse: Callable[[bytearray], Reply | None]
    poll: bytes
    publish: bytes
    poll_ok: int
    publish_ok: int
    ack: Callable[[Reply], bytes | None]  # untimed clean-up after each sample
    wake_s: list[float] = field(default_factory=list)
    publish_s: list[float] = field(default_factory=list)
    early: int = 0
    errors: collections.Counter[str] = field(default_factory=collections.Counter)


async def _measure_wake(subjects: list[WakeSubject], samples: int, budget_s: float) -> None:
    loop = asyncio.get_running_loop()
    conns: dict[str, tuple[Rpc, Rpc]] = {}
    for s in subjects:
        pair: list[Rpc] = []
        for _ in range(2):
            _, rpc = await loop.create_connection(functools.partial(Rpc, s.parse), HOST, s.port)
            pair.append(rpc)
        conns[s.name] = (pair[0], pair[1])
    deadline = time.monotonic() + budget_s
    for _ in range(samples):
        if time.monotonic() > deadline:
            break
        for s in subjects:
            poller, publisher = conns[s.name]
            polled = poller.send(s.poll)
            await asyncio.sleep(PARK_S)
            if polled.done():  # answered before anything was published: not a wake-up
                s.early += 1
                await polled
                continue
            sent = time.perf_counter()
            published = publisher.send(s.publish)
            try:
                woke, reply = await asyncio.wait_for(polled, 10)
                acked, pub_reply = await asyncio.wait_for(published, 10)
            except (TimeoutError, ConnectionError) as exc:
                s.errors[type(exc).__name__] += 1
                return
            if reply[1] != s.poll_ok or pub_reply[1] != s.publish_ok:
                s.errors[f"poll {reply[1]}, publish {pub_reply[1]}"] += 1
                continue
            s.wake_s.append(woke - sent)
            s.publish_s.append(acked - sent)
            clean_up = s.ack(reply)
            if clean_up is not None:
                await asyncio.wait_for(publisher.send(clean_up), 10)
    for poller, publisher in conns.values():
        for rpc in (poller, publisher):
            if rpc.transport is not None:
                rpc.transport.close()


def bench_latency(ctx: Context) -> None:
    print(
        f"\n[5] publish-to-wake latency, one server process, {ctx.sizes.latency_samples} samples",
        flush=True,
    )
    import uvloop

    server = ctx.dirmq("disk-w1", "disk", 1)
    redis = ctx.redis
    create_queue(server.port, "wake")
    create_queue(server.port, "wake-wb", "writeback")
    for name in ("wake", "wake-wb"):
        warm_up(server.port, name)
    redis.client.delete("wake")

    def dirmq_ack(name: str) -> Callable[[Reply], bytes | None]:
        def ack(reply: Reply) -> bytes | None:
            receipt = header_value(reply[2], b"X-Receipt")
            if receipt is None:
                return None
            return http_request("DELETE", f"/{name}/messages/{receipt.decode()}")

        return ack

    def dirmq_subject(label: str, name: str) -> WakeSubject:
        return WakeSubject(
            label,
            server.port,
            parse_http,
            http_request("GET", f"/{name}/messages?wait=10s"),
            http_request("POST", f"/{name}/messages", BODY),
            200,
            201,
            dirmq_ack(name),
        )

    subjects = [
        dirmq_subject("dirmq writethrough", "wake"),
        dirmq_subject("dirmq writeback", "wake-wb"),
        WakeSubject(
            "redis always",
            redis.port,
            parse_resp,
            resp_command(b"BLPOP", b"wake", b"10"),
            resp_command(b"LPUSH", b"wake", BODY),
            RESP_ARRAY,
            RESP_INT,
            lambda reply: None,
        ),
    ]
    samples = ctx.sizes.latency_samples
    uvloop.run(_measure_wake(subjects, samples, budget_s=max(60.0, samples * 0.2)))
    report = ctx.report
    data: dict[str, Any] = {"park_s": PARK_S, "samples": samples}
    for s in subjects:
        wake_ms = [x * 1000 for x in s.wake_s]
        pub_ms = [x * 1000 for x in s.publish_s]
        summary = {
            "n": len(wake_ms),
            "wake_p50_ms": round(percentile(wake_ms, 50), 3),
            "wake_p99_ms": round(percentile(wake_ms, 99), 3),
            "wake_max_ms": round(max(wake_ms, default=math.nan), 3),
            "publish_p50_ms": round(percentile(pub_ms, 50), 3),
            "publish_p99_ms": round(percentile(pub_ms, 99), 3),
            "early": s.early,
            "errors": dict(s.errors),
        }
        data[s.name] = summary
        report.row(
            "publish-to-wake latency",
            s.name,
            f"p99 {summary['wake_p99_ms']:.2f} ms",
            f"p50 {summary['wake_p50_ms']:.2f} ms, max {summary['wake_max_ms']:.1f} ms; "
            f"publish reply p50 {summary['publish_p50_ms']:.2f} / p99 "
            f"{summary['publish_p99_ms']:.2f} ms; n={summary['n']}"
            + (f"; errors {dict(s.errors)}" if s.errors else ""),
        )
    default = data["dirmq writethrough"]
    report.target(
        "publish-to-wake p99 (ms), writethrough",
        default["wake_p99_ms"],
        "<= 5",
        default["wake_p99_ms"] <= 5 and default["n"] >= samples * 0.9,
        f"p50 {default['wake_p50_ms']:.2f} ms; writeback p99 "
        f"{data['dirmq writeback']['wake_p99_ms']:.2f} ms; Redis always p99 "
        f"{data['redis always']['wake_p99_ms']:.2f} ms",
    )
    report.data["wake_latency"] = data
