"""HTTP server benchmark: `dirmq serve` against Redis 7 with an append-only file, on loopback.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.http_load                   # full run, 5 to 7 minutes
    .venv/bin/python -m bench.http_load --quick           # smoke run, about a minute
    .venv/bin/python -m bench.http_load --profile DIR     # also py-spy each dirmq server under load
    .venv/bin/python -m bench.http_load --only publish,latency --json /tmp/out.json

It installs what it needs itself: Debian's `redis-server` (apt-get) when it is missing, and the
`redis` and `py-spy` packages (pip, into this interpreter). It starts its own Redis (127.0.0.1,
a free port, `--appendonly yes --appendfsync always --save ''`, in a temp dir) and its own
`dirmq serve` processes (127.0.0.1:0), and at the end stops exactly those, by PID, even when a
step fails. It prints a table and writes JSON (default `bench/results/http.json`).

The load generator is the harness's (`bench.harness.loadgen`, run as child processes): raw
uvloop sockets, HTTP/1.1 keep-alive (or RESP for Redis), one request in flight per connection.
Clients and servers share the machine's cores, so every row also says how many cores each side
used (from /proc/<pid>/stat and the clients' own process time).

The box is shared and noisy: each section runs its subjects in rounds, one trial of each per round
in a rotating order, and reports medians; the verdicts against Redis use the median of per-round
ratios. Every loop is bounded both in count and in time.

What is measured:
1. durable publish (writethrough, dirmq root on disk under /tmp), 64 connections, 100 B bodies,
   one worker and two; the batch endpoint (JSON lines, 100 per request); Redis LPUSH with
   `appendfsync always`, 50 clients; and the same syscalls in a bare loop (the floor);
1b. the same durable publish (1 worker) over TLS with a bearer token (a trustme certificate, a
   credentials file) against plain HTTP without credentials, paired per round (section
   `secure`; issue 17 asks for a ratio of at least 0.8);
2. `writeback` publish on tmpfs (/dev/shm), 2 workers and 1; Redis LPUSH with `everysec`; the
   bare-loop floor on tmpfs;
3. get+ack (GET /{q}/messages, then DELETE /{q}/messages/{receipt}) on a prefilled queue, 64
   connections; Redis LMOVE+LREM (the reliable-queue pattern: also two round trips and an ack)
   and plain RPOP, 50 clients;
4. 10,000 held long polls (GET ?wait=60s on an empty queue, root on tmpfs): the server's extra
   RSS, then 10,000 messages published and how fast every poller gets its one; Redis BLPOP alike;
5. publish-to-wake latency: a parked long poll, a publish on another connection, the time from
   sending the POST to the poller holding the message; Redis BLPOP/LPUSH alike.

They run in the order 1, 2, 5, 4, 3: get+ack unlinks the acked files its pool cannot keep, and on
ext4 without a journal every inode freed in the last minutes makes each later inode allocation
slower (the allocator re-checks them), so it goes last; the run probes one allocation's cost at
its start and at its end (keeping the probed inodes: freeing them would slow what follows).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import http.client
import json
import math
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import BODY, HOST, RESULTS, SHM
from bench.harness.floors import RawPuts, inode_alloc_us
from bench.harness.install import ensure_pip, ensure_redis_server, ensure_wrk, py_spy_path
from bench.harness.load import LoadChild, Trial, run_load, split
from bench.harness.loadgen import lpush_spec, publish_spec
from bench.harness.peers import RedisServer, start_redis
from bench.harness.procs import Processes, cpu_seconds, fd_count, raise_fd_limit, vm_rss_kib
from bench.harness.profiles import summarize_profile
from bench.harness.report import (
    Report,
    filesystem_of,
    machine_basics,
    print_summary,
)
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
from bench.harness.servers import (
    Access,
    DirmqServer,
    create_queue,
    delete_queue,
    http_call,
    queue_stats,
    start_dirmq,
    warm_up,
)
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

DEFAULT_JSON = RESULTS / "http.json"
CONNECTIONS = 64  # dirmq load: concurrent connections, one request in flight on each
REDIS_CLIENTS = 50
BATCH = 100  # messages per batch request
SECTIONS = ("publish", "secure", "writeback", "latency", "longpoll", "getack")
CONNECT_GATE = 64  # long polls: connections in the making at once, over all load processes
PARK_S = 0.01  # latency: how long a poll sits before the publish (it is parked by then)
# (import name, distribution, pip requirement)
PIP_NEEDS = (("redis", "redis", "redis"), ("py_spy", "py-spy", "py-spy"))


@dataclass(frozen=True, slots=True)
class Sizes:
    rounds: int
    trial_s: float  # each throughput trial runs this long...
    trial_ops: int  # ...or until this many messages, whichever comes first
    dirmq_prefill: int  # messages queued before each dirmq get+ack trial
    redis_prefill: int
    longpolls: int
    longpoll_procs: int
    latency_samples: int


FULL = Sizes(
    rounds=3,
    trial_s=4.0,
    trial_ops=1_000_000,
    dirmq_prefill=40_000,
    redis_prefill=250_000,
    longpolls=10_000,
    longpoll_procs=4,
    latency_samples=500,
)
QUICK = Sizes(
    rounds=1,
    trial_s=1.0,
    trial_ops=200_000,
    dirmq_prefill=5_000,
    redis_prefill=50_000,
    longpolls=1_000,
    longpoll_procs=2,
    latency_samples=50,
)


def profile_trial(
    ctx: Context,
    name: str,
    server: DirmqServer | RedisServer,
    run: Callable[[], Trial],
    prepare: Callable[[], None] | None = None,
) -> None:
    """One more trial (not in the table) with py-spy recording the server: stacks of every
    thread that is not idle, written as collapsed stacks (`--format raw`; render them with
    flamegraph.pl or speedscope) and summarized as self and inclusive shares per function."""
    if ctx.profile_dir is None:
        return
    spy = py_spy_path()
    if spy is None:
        print("  py-spy is missing: no profile", file=sys.stderr)
        return
    out = os.path.join(ctx.profile_dir, f"{name}.txt")
    args = [spy, "record", "--pid", str(server.proc.pid), "--rate", "200", "--nonblocking"]
    args += ["--format", "raw", "--output", out]
    if isinstance(server, DirmqServer) and len(server.workers) > 1:
        args.append("--subprocesses")
    if prepare is not None:
        prepare()  # not profiled
    spy_proc = ctx.procs.start(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    try:
        trial = run()
    finally:
        if spy_proc.poll() is None:
            os.kill(spy_proc.pid, signal.SIGINT)  # py-spy writes its output on SIGINT
        ctx.procs.reap(spy_proc, 60)
    if not os.path.exists(out) or os.path.getsize(out) == 0:
        print(f"  py-spy wrote no profile for {name} (exit {spy_proc.returncode})", file=sys.stderr)
        return
    summary = summarize_profile(out)
    summary |= {"profiled_trial": trial.to_json(), "raw": out}
    ctx.report.data.setdefault("profiles", {})[name] = summary
    print(f"  profile {name}: {rate_text(trial.rate)} under py-spy; top self time:", flush=True)
    for frame, pct in summary["self_pct"][:12]:
        print(f"      {pct:5.1f}%  {frame}", flush=True)


# -- the run's context -----------------------------------------------------------------------------
@dataclass
class Context:
    sizes: Sizes
    procs: Processes
    report: Report
    disk: str  # temp dir on disk (/tmp)
    shm: str  # temp dir on tmpfs
    load_procs: int
    redis_version: str
    profile_dir: str | None
    servers: dict[str, DirmqServer] = field(default_factory=dict)
    _redis: RedisServer | None = None

    @property
    def probe(self) -> str:
        """Where inode allocations are probed (and the probed inodes kept)."""
        return os.path.join(self.disk, "inode-probe")

    def dirmq(self, label: str, filesystem: str, workers: int) -> DirmqServer:
        if label not in self.servers:
            parent = self.disk if filesystem == "disk" else self.shm
            root = os.path.join(parent, label)
            server = start_dirmq(self.procs, root, workers, label)
            self.servers[label] = server
            print(f"  started dirmq {label}: port {server.port}, pids {server.pids}", flush=True)
        return self.servers[label]

    @property
    def redis(self) -> RedisServer:
        if self._redis is None:
            self._redis = start_redis(
                self.procs, os.path.join(self.disk, "redis"), self.redis_version
            )
            print(f"  started redis {self.redis_version}: port {self._redis.port}", flush=True)
        return self._redis

    def load(
        self,
        server: DirmqServer | RedisServer,
        spec: dict[str, Any],
        conns: int,
        nprocs: int | None = None,
    ) -> Trial:
        proto = "http" if isinstance(server, DirmqServer) else "resp"
        full = {"proto": proto, "port": server.port, "duration_s": self.sizes.trial_s}
        full |= {"max_ops": self.sizes.trial_ops}
        if isinstance(server, DirmqServer) and server.access is not None:
            full["cafile"] = server.access.cafile
        full |= spec
        return run_load(self.procs, full, conns, nprocs or self.load_procs, server.pids)


# -- wrk: a load generator in C --------------------------------------------------------------------
WRK_SCRIPT = f"""wrk.method = "POST"
wrk.body = string.rep("x", {len(BODY)})
wrk.headers["Content-Type"] = "text/plain"
"""


def _wrk_seconds(value: str, unit: str) -> float:
    return float(value) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[unit]


def wrk_publish(ctx: Context, server: DirmqServer, queue_name: str) -> Trial:
    """`wrk -t1` publishing `BODY` on `CONNECTIONS` keep-alive connections for one trial's
    duration (one request in flight per connection, as the Python load generator). Its CPU is
    what the kernel reports for it as our child (RUSAGE_CHILDREN around its life)."""
    script = os.path.join(ctx.shm, "wrk-publish.lua")
    Path(script).write_text(WRK_SCRIPT)
    seconds = max(1, round(ctx.sizes.trial_s))
    url = f"http://{HOST}:{server.port}/{queue_name}/messages"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = cpu_seconds(server.pids)
    proc = ctx.procs.start(
        ["wrk", "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", "-s", script, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out, _ = proc.communicate(timeout=seconds + 60)
    server_cpu = cpu_seconds(server.pids) - cpu0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)\b", out)
    if proc.returncode != 0 or done is None:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {out[-500:]!r}")
    errors: dict[str, int] = {}
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non_2xx:
        errors["non-2xx"] = int(non_2xx.group(1))
    socket_errors = re.search(r"Socket errors: (.*)", out)
    if socket_errors:
        errors["socket errors: " + socket_errors.group(1).strip()] = 1
    client_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Trial(
        ops=int(done.group(1)) - errors.get("non-2xx", 0),
        seconds=_wrk_seconds(done.group(2), done.group(3)),
        server_cpu_s=server_cpu,
        client_cpu_s=client_cpu,
        errors=errors,
    )


# -- the filesystem's floor -----------------------------------------------------------------------


# -- 1: durable publish ----------------------------------------------------------------------------
def bench_publish(ctx: Context) -> None:
    print(
        f"\n[1] durable publish: {CONNECTIONS} connections, 100 B, root on disk; "
        f"Redis LPUSH appendfsync always, {REDIS_CLIENTS} clients",
        flush=True,
    )
    w1 = ctx.dirmq("disk-w1", "disk", 1)
    w2 = ctx.dirmq("disk-w2", "disk", 2)
    redis = ctx.redis

    def dirmq_single(server: DirmqServer, prefix: str) -> Callable[[int], Trial]:
        def trial(r: int) -> Trial:
            name = f"{prefix}-{r}"
            create_queue(server.port, name)
            warm_up(server.port, name)
            return ctx.load(server, publish_spec(name), CONNECTIONS)

        return trial

    def dirmq_batch(r: int) -> Trial:
        name = f"batch-{r}"
        create_queue(w1.port, name)
        warm_up(w1.port, name)
        return ctx.load(w1, publish_spec(name, BATCH), CONNECTIONS)

    def redis_lpush(r: int) -> Trial:
        key = f"pub-{r}"
        redis.client.delete(key)
        return ctx.load(redis, lpush_spec(key), REDIS_CLIENTS)

    raw = RawPuts(os.path.join(ctx.disk, "raw-writethrough"), durable=True)
    alloc = inode_alloc_us(ctx.probe)
    print(f"  inode allocation on disk: {alloc}", flush=True)
    subjects = {
        "dirmq 1 worker": dirmq_single(w1, "pub"),
        "redis always": redis_lpush,
        "dirmq batch 1 worker": dirmq_batch,
        "dirmq 2 workers": dirmq_single(w2, "pub2"),
        "raw syscalls": lambda r: raw.trial(ctx.sizes.trial_ops, ctx.sizes.trial_s),
    }
    trials = run_rounds("publish", subjects, ctx.sizes.rounds)
    for name, ts in trials.items():
        check_clean(name, ts)
    rate = {k: median_of(v, lambda t: t.rate) for k, v in trials.items()}
    vs_redis = paired(trials, "dirmq 1 worker", "redis always")
    vs_redis_w2 = paired(trials, "dirmq 2 workers", "redis always")
    batch_vs_redis = paired(trials, "dirmq batch 1 worker", "redis always")
    best = max(rate["dirmq 1 worker"], rate["dirmq 2 workers"])
    best_ratio = max(statistics.median(vs_redis), statistics.median(vs_redis_w2))
    report = ctx.report
    report.row(
        "durable publish (writethrough)",
        f"dirmq, 1 worker, {CONNECTIONS} conns",
        rate_text(rate["dirmq 1 worker"]),
        f"{statistics.median(vs_redis):.2f}x Redis always (paired); "
        + cores_note(trials["dirmq 1 worker"]),
    )
    report.row(
        "durable publish (writethrough)",
        f"dirmq, 2 workers, {CONNECTIONS} conns",
        rate_text(rate["dirmq 2 workers"]),
        f"{statistics.median(vs_redis_w2):.2f}x Redis always (paired); "
        + cores_note(trials["dirmq 2 workers"]),
    )
    report.row(
        "durable publish (writethrough)",
        f"Redis LPUSH always, {REDIS_CLIENTS} clients",
        rate_text(rate["redis always"]),
        "AOF fsync before reply; " + cores_note(trials["redis always"]),
    )
    report.row(
        f"durable batch publish ({BATCH}/req)",
        f"dirmq, 1 worker, {CONNECTIONS} conns",
        rate_text(rate["dirmq batch 1 worker"]),
        f"JSON lines; {statistics.median(batch_vs_redis):.2f}x Redis always (paired); "
        + cores_note(trials["dirmq batch 1 worker"]),
    )
    vs_raw = paired(trials, "dirmq 1 worker", "raw syscalls")
    report.row(
        "filesystem floor, writethrough",
        f"raw syscalls, 1 thread, batches of {CONNECTIONS}",
        rate_text(rate["raw syscalls"]),
        f"no HTTP; dirmq 1 worker is {statistics.median(vs_raw):.2f}x (paired); "
        f"{median_of(trials['raw syscalls'], lambda t: t.server_cores):.2f} cores; "
        f"one inode allocation {alloc['wall_us']:.0f} us ({alloc['sys_us']:.0f} us system CPU)",
    )
    report.target(
        "durable publish msg/s (best of 1, 2 workers)",
        best,
        ">= 10,000",
        best >= 10_000,
        f"1 worker {rate['dirmq 1 worker']:,.0f}, 2 workers {rate['dirmq 2 workers']:,.0f}",
    )
    report.target(
        "durable publish vs Redis always",
        best_ratio,
        ">= 0.2 (aim >= 1)",
        best_ratio >= 0.2,
        f"median of paired ratios; 1 worker {statistics.median(vs_redis):.2f}, "
        f"2 workers {statistics.median(vs_redis_w2):.2f}",
    )
    report.data["durable_publish"] = {
        "connections": CONNECTIONS,
        "redis_clients": REDIS_CLIENTS,
        "batch": BATCH,
        "subjects": {k: series(v) for k, v in trials.items()},
        "ratios_per_round_w1_vs_redis": vs_redis,
        "ratios_per_round_w2_vs_redis": vs_redis_w2,
        "ratios_per_round_batch_vs_redis": batch_vs_redis,
        "ratios_per_round_w1_vs_raw": vs_raw,
        "inode_alloc_us_at_start": alloc,
    }
    profile_trial(ctx, "publish-writethrough-w1", w1, lambda: dirmq_single(w1, "prof")(0))
    profile_trial(ctx, "publish-batch-w1", w1, lambda: dirmq_batch(ctx.sizes.rounds))


# -- 1b: the same durable publish over TLS with a token -----------------------------------------
def secure_server_files(directory: str) -> tuple[list[str], Access]:
    """A CA and a certificate for 127.0.0.1 (trustme, as the tests make them), a credentials
    file with one principal allowed everything, and its token."""
    import hashlib
    import secrets

    import trustme

    os.makedirs(directory, exist_ok=True)
    ca = trustme.CA()
    cert = ca.issue_cert(HOST, "localhost")
    paths = {name: os.path.join(directory, name) for name in ("ca.pem", "cert.pem", "key.pem")}
    ca.cert_pem.write_to_path(paths["ca.pem"])
    cert.private_key_pem.write_to_path(paths["key.pem"])
    with open(paths["cert.pem"], "wb") as f:
        for blob in cert.cert_chain_pems:
            f.write(blob.bytes())
    token = "dmq_" + secrets.token_urlsafe(32)
    credentials = os.path.join(directory, "credentials.toml")
    with open(os.open(credentials, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(
            "[principals.bench]\n"
            f'token_sha256 = "{hashlib.sha256(token.encode()).hexdigest()}"\n'
            'read = ["*"]\nwrite = ["*"]\nadmin = ["*"]\n'
        )
    extra = ["--tls-cert", paths["cert.pem"], "--tls-key", paths["key.pem"]]
    extra += ["--credentials", credentials]
    return extra, Access(paths["ca.pem"], token)


def bench_secure(ctx: Context) -> None:
    print(
        f"\n[1b] durable publish with TLS and a bearer token vs plain HTTP without credentials: "
        f"{CONNECTIONS} connections, 100 B, root on disk, 1 worker",
        flush=True,
    )
    plain = ctx.dirmq("disk-w1", "disk", 1)
    if "disk-secure-w1" not in ctx.servers:
        extra, access = secure_server_files(os.path.join(ctx.disk, "secure-files"))
        root = os.path.join(ctx.disk, "disk-secure-w1")
        server = start_dirmq(ctx.procs, root, 1, "disk-secure-w1", extra, access)
        ctx.servers["disk-secure-w1"] = server
        print(f"  started dirmq disk-secure-w1: port {server.port}, pids {server.pids}")
    secure = ctx.servers["disk-secure-w1"]
    assert secure.access is not None
    authorization = (("Authorization", f"Bearer {secure.access.token}"),)

    def trial(server: DirmqServer, prefix: str) -> Callable[[int], Trial]:
        def run(r: int) -> Trial:
            name = f"{prefix}-{r}"
            create_queue(server.port, name, access=server.access)
            warm_up(server.port, name, access=server.access)
            headers = authorization if server.access is not None else ()
            return ctx.load(server, publish_spec(name, headers=headers), CONNECTIONS)

        return run

    subjects = {
        "dirmq plain": trial(plain, "plain"),
        "dirmq TLS + token": trial(secure, "secure"),
    }
    trials = run_rounds("secure", subjects, ctx.sizes.rounds)
    for name, ts in trials.items():
        check_clean(name, ts)
    rate = {k: median_of(v, lambda t: t.rate) for k, v in trials.items()}
    ratios = paired(trials, "dirmq TLS + token", "dirmq plain")
    ratio = statistics.median(ratios)
    for name, text in (
        ("dirmq plain", "http://, no credentials"),
        ("dirmq TLS + token", f"https:// + bearer token; {ratio:.2f}x plain (paired)"),
    ):
        ctx.report.row(
            "durable publish, TLS + token",
            f"{name}, 1 worker, {CONNECTIONS} conns",
            rate_text(rate[name]),
            f"{text}; " + cores_note(trials[name]),
        )
    ctx.report.target(
        "durable publish, TLS + token vs plain",
        ratio,
        ">= 0.8",
        ratio >= 0.8,
        f"median of paired ratios {[round(r, 2) for r in ratios]}",
    )
    ctx.report.data["secure_publish"] = {
        "connections": CONNECTIONS,
        "subjects": {k: series(v) for k, v in trials.items()},
        "ratios_per_round_secure_vs_plain": ratios,
    }
    profile_trial(ctx, "publish-secure-w1", secure, lambda: trial(secure, "prof")(0))


# -- 2: writeback on tmpfs -------------------------------------------------------------------------
def bench_writeback(ctx: Context) -> None:
    print("\n[2] writeback publish on tmpfs: 2 workers and 1; Redis LPUSH everysec", flush=True)
    w2 = ctx.dirmq("shm-w2", "shm", 2)
    w1 = ctx.dirmq("shm-w1", "shm", 1)
    redis = ctx.redis

    def dirmq_writeback(server: DirmqServer, wrk: bool = False) -> Callable[[int], Trial]:
        def trial(r: int) -> Trial:
            name = f"wb-{r}{'-wrk' if wrk else ''}"
            create_queue(server.port, name, "writeback")
            warm_up(server.port, name)
            try:
                if wrk:
                    return wrk_publish(ctx, server, name)
                return ctx.load(server, publish_spec(name), CONNECTIONS)
            finally:
                delete_queue(server.port, name)

        return trial

    def redis_everysec(r: int) -> Trial:
        key = f"wb-{r}"
        redis.client.delete(key)
        redis.client.config_set("appendfsync", "everysec")
        try:
            return ctx.load(redis, lpush_spec(key), REDIS_CLIENTS)
        finally:
            redis.client.config_set("appendfsync", "always")

    raw = RawPuts(os.path.join(ctx.shm, "raw-writeback"), durable=False)
    subjects = {
        "dirmq 2 workers": dirmq_writeback(w2),
        "redis everysec": redis_everysec,
        "dirmq 1 worker": dirmq_writeback(w1),
        "raw syscalls": lambda r: raw.trial(ctx.sizes.trial_ops, ctx.sizes.trial_s),
        "dirmq 2 workers, wrk": dirmq_writeback(w2, wrk=True),
    }
    trials = run_rounds("writeback", subjects, ctx.sizes.rounds)
    for name, ts in trials.items():
        check_clean(name, ts)
    rate = {k: median_of(v, lambda t: t.rate) for k, v in trials.items()}
    vs_redis = paired(trials, "dirmq 2 workers", "redis everysec")
    scaling = paired(trials, "dirmq 2 workers", "dirmq 1 worker")
    report = ctx.report
    report.row(
        "writeback publish, tmpfs",
        f"dirmq, 2 workers, {CONNECTIONS} conns",
        rate_text(rate["dirmq 2 workers"]),
        f"{statistics.median(vs_redis):.2f}x Redis everysec, "
        f"{statistics.median(scaling):.2f}x 1 worker (paired); "
        + cores_note(trials["dirmq 2 workers"]),
    )
    vs_python_load = paired(trials, "dirmq 2 workers, wrk", "dirmq 2 workers")
    report.row(
        "writeback publish, tmpfs",
        f"dirmq, 2 workers, {CONNECTIONS} conns, wrk load",
        rate_text(rate["dirmq 2 workers, wrk"]),
        f"{statistics.median(vs_python_load):.2f}x the same with the Python load (paired); "
        + cores_note(trials["dirmq 2 workers, wrk"]),
    )
    report.row(
        "writeback publish, tmpfs",
        f"dirmq, 1 worker, {CONNECTIONS} conns",
        rate_text(rate["dirmq 1 worker"]),
        cores_note(trials["dirmq 1 worker"]),
    )
    report.row(
        "writeback publish",
        f"Redis LPUSH everysec, {REDIS_CLIENTS} clients",
        rate_text(rate["redis everysec"]),
        "AOF on disk, fsync once a second; " + cores_note(trials["redis everysec"]),
    )
    vs_raw = paired(trials, "dirmq 1 worker", "raw syscalls")
    report.row(
        "filesystem floor, tmpfs",
        "raw syscalls, 1 thread",
        rate_text(rate["raw syscalls"]),
        f"no HTTP, no fsync; dirmq 1 worker is {statistics.median(vs_raw):.2f}x (paired)",
    )
    value = rate["dirmq 2 workers"]
    report.target(
        "writeback tmpfs msg/s, 2 workers",
        value,
        ">= 40,000",
        value >= 40_000,
        f"{statistics.median(vs_redis):.2f}x Redis everysec (paired)",
    )
    value = rate["dirmq 2 workers, wrk"]
    report.target(
        "writeback tmpfs msg/s, 2 workers, wrk load",
        value,
        ">= 40,000",
        value >= 40_000,
        "the same server driven by wrk (C) instead of the Python load generator",
    )
    report.data["writeback_publish"] = {
        "subjects": {k: series(v) for k, v in trials.items()},
        "ratios_per_round_w2_vs_redis_everysec": vs_redis,
        "ratios_per_round_w2_vs_w1": scaling,
        "ratios_per_round_w1_vs_raw": vs_raw,
        "ratios_per_round_wrk_vs_python_load": vs_python_load,
    }
    profile_trial(ctx, "publish-writeback-w2", w2, lambda: dirmq_writeback(w2)(ctx.sizes.rounds))


# -- 3: get+ack ------------------------------------------------------------------------------------
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


# -- 4: held long polls ----------------------------------------------------------------------------
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


# -- 5: publish-to-wake latency --------------------------------------------------------------------
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


# -- driver ----------------------------------------------------------------------------------------


def machine(ctx: Context, versions: dict[str, str], fd_limit: int) -> dict[str, Any]:
    return machine_basics() | {
        "redis_server": ctx.redis_version,
        "pip": versions,
        "disk_dir": ctx.disk,
        "disk_fs": filesystem_of(ctx.disk),
        "tmpfs_dir": ctx.shm,
        "tmpfs_fs": filesystem_of(ctx.shm),
        "fd_limit": fd_limit,
        "load_processes": ctx.load_procs,
        "note": "load generator and servers share the same cores",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--dir", help="where disk-backed roots live (default: a temp dir in /tmp)")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    parser.add_argument(
        "--load-procs", type=int, default=2, help="load generator processes (default 2)"
    )
    parser.add_argument("--profile", metavar="DIR", help="py-spy the servers into DIR")
    args = parser.parse_args(argv)
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-up below
    sizes = QUICK if args.quick else FULL
    redis_version = ensure_redis_server()
    wrk_version = ensure_wrk()
    versions = ensure_pip(PIP_NEEDS) | {"wrk": wrk_version}
    fd_limit = raise_fd_limit()  # the servers and load processes inherit it
    if fd_limit < sizes.longpolls + 1000 and "longpoll" in sections:
        print(f"warning: fd limit {fd_limit} is low for {sizes.longpolls} polls", file=sys.stderr)
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    disk = tempfile.mkdtemp(prefix="dirmq-http-bench-", dir=parent)
    shm = tempfile.mkdtemp(prefix="dirmq-http-bench-", dir=SHM if os.path.isdir(SHM) else parent)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    report = Report()
    ctx = Context(
        sizes=sizes,
        procs=Processes(),
        report=report,
        disk=disk,
        shm=shm,
        load_procs=args.load_procs,
        redis_version=redis_version,
        profile_dir=os.path.abspath(args.profile) if args.profile else None,
    )
    report.data["machine"] = machine(ctx, versions, fd_limit)
    report.data["mode"] = "quick" if args.quick else "full"
    print(f"dirmq HTTP benchmark ({report.data['mode']}); disk roots in {disk}, tmpfs in {shm}")
    print(f"  {report.data['machine']['disk_fs']}; redis-server {redis_version}; {versions}")
    print(
        f"  {os.cpu_count()} cores shared by servers and {args.load_procs} load processes",
        flush=True,
    )
    started = time.perf_counter()
    try:
        if "publish" in sections:
            bench_publish(ctx)
        if "secure" in sections:
            bench_secure(ctx)
        if "writeback" in sections:
            bench_writeback(ctx)
        # get+ack last: acks beyond the recycling pool unlink files, and on ext4 without a
        # journal every inode freed in the last minutes slows each later inode allocation.
        if "latency" in sections:
            bench_latency(ctx)
        if "longpoll" in sections:
            bench_longpoll(ctx)
        if "getack" in sections:
            bench_getack(ctx)
        report.data["inode_alloc_us_at_end"] = inode_alloc_us(ctx.probe)
    except BaseException:
        for server in ctx.servers.values():
            if server.log:
                print(f"last output of dirmq {server.label}:", file=sys.stderr)
                print("\n".join(server.log), file=sys.stderr)
        raise
    finally:
        ctx.procs.stop_all()
        shutil.rmtree(disk, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    report.data["machine"]["loadavg_at_end"] = os.getloadavg()
    report.data["seconds"] = round(time.perf_counter() - started, 1)
    report.data["table"] = [list(r) for r in report.rows]
    report.data["targets"] = report.targets
    print_summary(report, f"medians of {sizes.rounds} rounds; clients and servers share the cores")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.data, indent=2) + "\n")
    print(f"\nwrote {out} ({report.data['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
