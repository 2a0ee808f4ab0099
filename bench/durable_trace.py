"""Where a durable publish batch spends its time inside `dirmq serve`: a tracing benchmark.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.durable_trace                      # 2 workers, /tmp, ~15 s
    .venv/bin/python -m bench.durable_trace --workers 1 --seconds 8 --dir /srv/q

It starts `dirmq serve` (127.0.0.1, a free port, a fresh root under `--dir`) in a child process
whose store calls are wrapped with timers before the workers fork, creates a `writethrough`
queue, and drives it with wrk (Debian's, installed with apt-get if missing; one thread, 64
keep-alive connections, 100-byte POSTs, one request in flight per connection). After a
one-second warm-up, each worker times every batch its publish line stores: writing the files,
the data `syncfs`, the `linkat`s, the shared directory fsync, and the gap before its next batch.
It prints a table per worker and writes JSON (default `bench/results/durable_trace.json`).

The timers cost a little CPU on the traced path, so the rate here is not the benchmark's rate
(`bench.http_load` measures that); the shares of a batch's time are what this is for. Every
process it starts is stopped by PID at the end; wrk stops by itself after `--seconds`. The root
is deleted at the end: on ext4 without a journal that slows inode allocation for a few minutes,
so do not run it just before `bench.http_load`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import REPO, RESULTS
from bench.harness.install import ensure_wrk
from bench.harness.procs import Processes, child_pids, free_port
from bench.harness.servers import wait_http

DEFAULT_JSON = RESULTS / "durable_trace.json"
WRK_SCRIPT = 'wrk.method = "POST"\nwrk.body = string.rep("x", 100)\n'
WARM_UP_S = 1.0


# -- in the traced server ------------------------------------------------------------------------
def _install_timers(out_path: str) -> None:
    """Wrap the durable path's steps; SIGUSR2 starts recording, SIGUSR1 appends a worker's
    batches to `out_path` as one JSON line."""
    from dirmq.server import publish_line
    from dirmq.store import fsio

    phases = threading.local()
    batches: list[list[float]] = []  # start, end, messages, commit, syncfs, dir fsync
    recording = threading.Event()
    syncfs, sync_dirs = fsio.syncfs, fsio.GroupCommit._sync_dirs
    commit, store = fsio.GroupCommit.commit, publish_line.PublishLine._store

    def timed_syncfs(fd: int) -> None:
        started = time.perf_counter()
        syncfs(fd)
        phases.syncfs = time.perf_counter() - started

    def timed_sync_dirs(self: fsio.GroupCommit, dirs: set[str]) -> None:
        started = time.perf_counter()
        sync_dirs(self, dirs)
        phases.dirs = time.perf_counter() - started

    def timed_commit(self: fsio.GroupCommit, files: list[fsio.PendingFile]) -> None:
        phases.syncfs = phases.dirs = 0.0
        started = time.perf_counter()
        commit(self, files)
        phases.commit = time.perf_counter() - started

    def timed_store(self: Any, batch: list[Any]) -> Any:
        phases.commit = phases.syncfs = phases.dirs = 0.0
        started = time.perf_counter()
        outcome = store(self, batch)
        if recording.is_set():
            count = float(sum(len(p.messages) for p in batch))
            ended = time.perf_counter()
            batches.append([started, ended, count, phases.commit, phases.syncfs, phases.dirs])
        return outcome

    def dump(*_: object) -> None:
        with open(out_path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "batches": batches}) + "\n")

    def start(*_: object) -> None:
        batches.clear()
        recording.set()

    fsio.syncfs = timed_syncfs
    fsio.GroupCommit._sync_dirs = timed_sync_dirs  # type: ignore[method-assign]
    fsio.GroupCommit.commit = timed_commit  # type: ignore[method-assign]
    publish_line.PublishLine._store = timed_store  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, start)


def child_serve(root: str, port: int, workers: int, out_path: str) -> int:
    sys.path.insert(0, str(REPO / "src"))
    _install_timers(out_path)
    from dirmq.cli import main as dirmq_main

    listen = f"127.0.0.1:{port}"
    return dirmq_main(["serve", "--root", root, "--listen", listen, "--workers", str(workers)])


# -- the driver ----------------------------------------------------------------------------------


def wrk(port: int, seconds: float, connections: int, script: str) -> float:
    url = f"http://127.0.0.1:{port}/q/messages"
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "-s", script, url]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=seconds + 60)
    for line in out.stdout.splitlines():
        if line.startswith("Requests/sec:"):
            return float(line.split()[1])
    raise RuntimeError(f"no rate in wrk's output: {out.stdout[-300:]!r}")


def summarize(batches: list[list[float]]) -> dict[str, float]:
    def ms(values: list[float]) -> float:
        return round(statistics.median(values) * 1000, 3) if values else 0.0

    span = batches[-1][1] - batches[0][0]
    busy = sum(b[1] - b[0] for b in batches)
    return {
        "batches": len(batches),
        "messages": int(sum(b[2] for b in batches)),
        "median_batch": statistics.median(b[2] for b in batches),
        "store_ms": ms([b[1] - b[0] for b in batches]),
        "write_ms": ms([b[1] - b[0] - b[3] for b in batches]),
        "syncfs_ms": ms([b[4] for b in batches]),
        "link_ms": ms([b[3] - b[4] - b[5] for b in batches]),
        "dir_fsync_ms": ms([b[5] for b in batches]),
        "gap_ms": ms([b[0] - a[1] for a, b in itertools.pairwise(batches)]),
        "busy_share": round(busy / span, 3) if span > 0 else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="filesystem under test")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument("--child-serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_serve:
        root, port, workers, out_path = args.child_serve
        return child_serve(root, int(port), int(workers), out_path)
    ensure_wrk()
    base = tempfile.mkdtemp(prefix="dirmq-durable-trace-", dir=args.dir)
    out_path = os.path.join(base, "batches.jsonl")
    script = os.path.join(base, "publish.lua")
    Path(script).write_text(WRK_SCRIPT)
    port = free_port()
    child_args = [os.path.join(base, "root"), str(port), str(args.workers), out_path]
    procs = Processes()
    server = procs.start(
        [sys.executable, "-m", "bench.durable_trace", "--child-serve", *child_args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        wait_http(port, budget_s=20.0)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/q", data=b'{"durability": "writethrough"}', method="PUT"
        )
        urllib.request.urlopen(request, timeout=10).read()
        workers = child_pids(server.pid) or [server.pid]
        wrk(port, WARM_UP_S, args.connections, script)
        for pid in workers:
            os.kill(pid, signal.SIGUSR2)
        rate = wrk(port, args.seconds, args.connections, script)
        for pid in workers:
            os.kill(pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            lines = Path(out_path).read_text().splitlines() if os.path.exists(out_path) else []
            if len(lines) >= len(workers):
                break
            time.sleep(0.1)
        traces = [json.loads(line) for line in lines]
    finally:
        procs.stop_all()
        shutil.rmtree(base, ignore_errors=True)
    summaries = {str(t["pid"]): summarize(t["batches"]) for t in traces if len(t["batches"]) > 1}
    print(f"\nwrk: {rate:,.0f} msg/s, {args.workers} workers, {args.connections} connections")
    columns = list(next(iter(summaries.values())).keys()) if summaries else []
    print("worker  " + "  ".join(f"{c:>12}" for c in columns))
    for pid, summary in summaries.items():
        print(f"{pid:7} " + "  ".join(f"{summary[c]:>12}" for c in columns))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"dir": args.dir, "workers": args.workers, "connections": args.connections}
    out.write_text(json.dumps(result | {"wrk_msgs_per_s": rate, "workers_trace": summaries}))
    print(f"JSON written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
