"""What message priorities cost a receive (issue 36): 10 levels against 1, and a deep backlog
spread over the levels.

Run by hand from the project root (never collected by pytest; the machine to itself, for the
full form):

    .venv/bin/python -m bench.priority            # 100k per queue; a backlog of 1,000,000
    .venv/bin/python -m bench.priority --quick    # 20k per queue; a backlog of 100,000
    .venv/bin/python -m bench.priority --per-queue 2000 --deep 5000 --json /tmp/p.json

It builds its roots under a fresh temp dir (`--dir`, default /tmp: the disk) and removes it at
the end, also on an error or Ctrl-C; every process it starts is stopped by PID.

- levels: two queues of 100 B messages in one root, `flat` (priority_levels 1) and `ten`
  (priority_levels 10, the messages spread evenly over the levels, published in turn), written
  straight into the layout a put makes (docs/FORMAT.md, "Priorities": each level's head in
  `@ready/`, the rest in its own backlog tree), without fsyncs. A fresh library process drains
  each (get 100, ack_many), its CPU seconds (utime+stime) the measure; the two alternate, three
  rounds, best of each. Target: receive rate of `ten` >= 0.8 x `flat`'s (same run).
- deep: one queue of 10 levels holding the deep count, spread over the levels. A fresh
  process's open and first get+ack (wall, CPU, peak RSS), then the CPU per message of 10,000
  gets+acks, against the same on a queue of 10 levels holding 10,000 (same run): the deep
  ratio. Target: <= 2x.

It prints the rows and the targets, and writes JSON (default `bench/results/priority.json`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import REPO, RESULTS
from bench.harness.report import Report, filesystem_of, machine_basics, write_results
from bench.harness.roots import fill_ready

DEFAULT_JSON = RESULTS / "priority.json"
BODY = b"x" * 100
FULL = {"per_queue": 100_000, "deep": 1_000_000}
QUICK = {"per_queue": 20_000, "deep": 100_000}
SHALLOW = 10_000
DRAIN_AT_DEPTH = 10_000
ROUNDS = 3

# A fresh process: open the queue, first get+ack, then drain `count` (get 100, ack_many).
CONSUMER = """
import json, resource, sys, time
started_wall = time.monotonic()
started_cpu = time.process_time()
import dirmq
root, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with dirmq.Store(root) as store:
    q = store.queue(name)
    first = q.get(1)
    assert first, "the queue is empty"
    q.ack(first[0].receipt)
    first_wall = time.monotonic() - started_wall
    first_cpu = time.process_time() - started_cpu
    levels = [first[0].priority]
    cpu0 = time.process_time()
    taken = 1
    while taken < count:
        batch = q.get(min(100, count - taken))
        if not batch:
            break
        levels.append(batch[0].priority)
        q.ack_many([m.receipt for m in batch])
        taken += len(batch)
    cpu = time.process_time() - cpu0
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
descending = levels == sorted(levels, reverse=True)
print(json.dumps({"first_wall": first_wall, "first_cpu": first_cpu, "taken": taken,
                  "cpu": cpu, "rss_mib": rss, "descending": descending}))
"""


def make(root: Path, name: str, levels: int, count: int) -> None:
    import dirmq

    with dirmq.Store(str(root)) as store:
        store.create_queue(name, dirmq.QueueConfig(priority_levels=levels))
    fill_ready(root / name, count, BODY, levels)


def consume(root: Path, name: str, count: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", CONSUMER, str(root), name, str(count)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=3600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"the consumer of {name} failed ({proc.returncode})")
    result: dict[str, Any] = json.loads(out)
    return result


def levels_part(workdir: Path, per_queue: int, report: Report) -> dict[str, Any]:
    """`flat` against `ten`, alternating, each round on fresh queues."""
    rates: dict[str, list[float]] = {"flat": [], "ten": []}
    for round_no in range(ROUNDS):
        root = workdir / f"levels-{round_no}"
        make(root, "flat", 1, per_queue)
        make(root, "ten", 10, per_queue)
        order = ("flat", "ten") if round_no % 2 == 0 else ("ten", "flat")
        for name in order:
            got = consume(root, name, per_queue)
            if got["taken"] != per_queue or not got["descending"]:
                raise RuntimeError(f"{name}: {got}")
            rates[name].append((got["taken"] - 1) / got["cpu"])
        shutil.rmtree(root, ignore_errors=True)
    best = {name: max(values) for name, values in rates.items()}
    ratio = best["ten"] / best["flat"]
    for name in ("flat", "ten"):
        report.row("levels: receive", name, f"{best[name]:,.0f} msg/CPU-s", f"{per_queue:,}")
    report.target("10 levels / 1 level", ratio, ">= 0.8", ratio >= 0.8, f"{per_queue:,} each")
    return {"per_queue": per_queue, "rates": rates, "best": best, "ratio": ratio}


def deep_part(workdir: Path, deep: int, report: Report) -> dict[str, Any]:
    root = workdir / "deep"
    built = time.monotonic()
    shallow = min(SHALLOW, deep)
    make(root, "shallow", 10, shallow)
    make(root, "deep", 10, deep)
    build_s = time.monotonic() - built
    drain = min(DRAIN_AT_DEPTH, shallow)
    results = {name: consume(root, name, drain) for name in ("shallow", "deep")}
    per = {name: r["cpu"] / (r["taken"] - 1) * 1e6 for name, r in results.items()}
    ratio = per["deep"] / per["shallow"]
    for name, count in (("shallow", shallow), ("deep", deep)):
        r = results[name]
        report.row(
            "deep: 10 levels",
            f"{count:,}",
            f"first get+ack {r['first_wall']:.2f} s wall, {r['first_cpu']:.2f} s CPU; "
            f"{per[name]:.0f} µs CPU/msg; {r['rss_mib']:.0f} MiB",
        )
    report.target(
        "deep / shallow CPU per receive", ratio, "<= 2x", ratio <= 2.0, f"{deep:,} vs {shallow:,}"
    )
    return {"build_s": build_s, "results": results, "us_per_msg": per, "ratio": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.priority", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="20k per queue, 100,000 deep")
    parser.add_argument("--dir", default="/tmp", help="where the roots go (default /tmp)")
    parser.add_argument("--per-queue", type=int, help="messages per queue of the levels part")
    parser.add_argument("--deep", type=int, help="messages of the deep queue")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="results file")
    args = parser.parse_args(argv)
    sizes = dict(QUICK if args.quick else FULL)
    if args.per_queue:
        sizes["per_queue"] = args.per_queue
    if args.deep:
        sizes["deep"] = args.deep
    report = Report()
    out: dict[str, Any] = {"machine": machine_basics(), "quick": args.quick, "dir": args.dir}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    workdir = Path(tempfile.mkdtemp(prefix="dirmq-bench-priority-", dir=args.dir))
    started = time.monotonic()
    try:
        out["machine"]["disk_fs"] = filesystem_of(str(workdir))
        print("\n-- levels --", flush=True)
        out["levels"] = levels_part(workdir, sizes["per_queue"], report)
        print("\n-- deep --", flush=True)
        out["deep"] = deep_part(workdir, sizes["deep"], report)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - started, 1)
    write_results(report, out, args.json, "CPU seconds of a fresh consumer process; one run")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
