"""Sections 1, 1b and 2: durable publish on disk (also over TLS with a token) and writeback
publish on tmpfs, against Redis and the bare-syscall floor."""

from __future__ import annotations

import os
import re
import resource
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from bench.harness import BODY, HOST
from bench.harness.floors import RawPuts, inode_alloc_us
from bench.harness.load import Trial
from bench.harness.loadgen import lpush_spec, publish_spec
from bench.harness.procs import cpu_seconds
from bench.harness.rounds import (
    check_clean,
    cores_note,
    median_of,
    paired,
    rate_text,
    run_rounds,
    series,
)
from bench.harness.servers import (
    Access,
    DirmqServer,
    create_queue,
    delete_queue,
    start_dirmq,
    warm_up,
)
from bench.http_load.context import BATCH, CONNECTIONS, REDIS_CLIENTS, Context, profile_trial

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
