"""The run: what it installs, the temp roots, the sections in order, the summary and JSON."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import SHM
from bench.harness.floors import inode_alloc_us
from bench.harness.install import ensure_pip, ensure_redis_server, ensure_wrk
from bench.harness.procs import Processes, raise_fd_limit
from bench.harness.report import (
    Report,
    filesystem_of,
    machine_basics,
    print_summary,
)
from bench.http_load.consume import bench_getack, bench_latency, bench_longpoll
from bench.http_load.context import DEFAULT_JSON, FULL, PIP_NEEDS, QUICK, SECTIONS, Context
from bench.http_load.publish import bench_publish, bench_secure, bench_writeback


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
    parser = argparse.ArgumentParser(
        prog="python -m bench.http_load",
        description="HTTP server benchmark: dirmq serve against Redis 7 (AOF), on loopback.",
    )
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
