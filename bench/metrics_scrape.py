"""`/metrics` on a root of many queues: how long a scrape takes, how big it is, and what it
leaves in the server (inotify watches, memory).

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.metrics_scrape               # 10,000 queues, 20 warm scrapes
    .venv/bin/python -m bench.metrics_scrape --quick       # the same root, 5 warm scrapes
    .venv/bin/python -m bench.metrics_scrape --queues 50000 --max-queues 200

It builds a fresh root under /tmp (on disk): `--queues` queues laid out as `Store.create_queue`
lays them out (without its fsyncs, so building is quick), nested `tNN/qNNNN`, and publishes a
few messages to one queue in a hundred (some in flight, some delayed). It starts its own
`python -m dirmq serve` on a free port of 127.0.0.1 (one worker, `--metrics-max-queues` if
given; `--src` runs another checkout's server, to compare) and stops exactly that process, by
PID, at the end, even when a step fails.

Measured, from the client and from /proc/<server pid>:

    cold scrape     the first `/metrics` of the fresh server (the OS caches are warm: the root
                    was just written; a root cold on disk takes what its reads take)
    warm scrapes    median and worst of the next ones
    one queue       `/metrics?queue=NAME`
    bytes           the size of a full scrape
    watches         inotify watches the server holds after the scrapes (from fdinfo)
    RSS growth      the server's resident memory after the scrapes, less before the first

It prints a table and writes JSON (default `bench/results/metrics_scrape.json`). Indicative:
the box's other work shows in every time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.harness import HOST, REPO, RESULTS
from bench.harness.procs import Processes, vm_rss_kib
from bench.harness.roots import make_queues
from bench.harness.servers import start_dirmq

DEFAULT_JSON = RESULTS / "metrics_scrape.json"


def build_root(root: Path, queues: int) -> tuple[list[str], float]:
    """`queues` empty queues, then messages in one queue of a hundred; returns the names and
    the seconds it took."""
    import dirmq

    started = time.monotonic()
    names = [f"t{n // 100:03d}/q{n % 100:02d}" for n in range(queues)]
    make_queues(root, names)
    with dirmq.Store(root) as store:
        for name in names[::100]:
            queue = store.queue(name)
            queue.put_many([b"m"] * 10, durability="writeback")
            queue.put(b"later", delay_s=3600, durability="writeback")
            queue.get(2, visibility_s=3600)
    return names, time.monotonic() - started


def get(url: str) -> tuple[bytes, float]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:
        body: bytes = response.read()
    return body, time.perf_counter() - started


def inotify_watches(pid: int) -> int:
    total = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as info:
                total += info.read().count("inotify wd:")
        except OSError:
            continue
    return total


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="dirmq-bench-metrics-", dir="/tmp"))
    procs = Processes()
    try:
        names, built_s = build_root(workdir / "root", args.queues)
        extra = [] if args.max_queues is None else ["--metrics-max-queues", str(args.max_queues)]
        env = {"PYTHONPATH": args.src}
        server = start_dirmq(procs, str(workdir / "root"), 1, "metrics", extra, env=env)
        proc, url = server.proc, f"http://{HOST}:{server.port}"
        get(f"{url}/health")
        rss_before = 1024 * vm_rss_kib(proc.pid)
        watches_before = inotify_watches(proc.pid)
        body, cold_s = get(f"{url}/metrics")
        warm = [get(f"{url}/metrics")[1] for _ in range(args.scrapes)]
        try:
            one_queue = [get(f"{url}/metrics?queue={names[-1]}")[1] for _ in range(5)]
        except urllib.error.HTTPError:  # a server from before /metrics?queue=
            one_queue = []
        return {
            "queues": args.queues,
            "max_queues": args.max_queues,
            "server_src": args.src,
            "build_s": round(built_s, 2),
            "cold_scrape_s": round(cold_s, 3),
            "warm_scrape_median_s": round(statistics.median(warm), 3),
            "warm_scrape_max_s": round(max(warm), 3),
            "one_queue_scrape_median_s": (
                round(statistics.median(one_queue), 4) if one_queue else None
            ),
            "scrape_bytes": len(body),
            "series": sum(1 for line in body.splitlines() if line and not line.startswith(b"#")),
            "inotify_watches_before": watches_before,
            "inotify_watches_after": inotify_watches(proc.pid),
            "rss_growth_mib": round((1024 * vm_rss_kib(proc.pid) - rss_before) / 2**20, 1),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        }
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)


def table(result: dict[str, Any]) -> str:
    cap = "default" if result["max_queues"] is None else result["max_queues"]
    one = result["one_queue_scrape_median_s"]
    rows = [
        ("queues", f"{result['queues']:,} (--metrics-max-queues {cap})"),
        ("cold scrape", f"{result['cold_scrape_s']:.3f} s"),
        (
            "warm scrapes",
            f"{result['warm_scrape_median_s']:.3f} s median, "
            f"{result['warm_scrape_max_s']:.3f} s max",
        ),
        ("one queue", f"{one * 1000:.1f} ms" if one is not None else "-"),
        ("bytes", f"{result['scrape_bytes']:,} ({result['series']:,} samples)"),
        (
            "inotify watches",
            f"{result['inotify_watches_before']} before, {result['inotify_watches_after']} after",
        ),
        ("RSS growth", f"{result['rss_growth_mib']} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {text}" for name, text in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument(
        "--max-queues", type=int, default=None, help="--metrics-max-queues (default: the server's)"
    )
    parser.add_argument(
        "--src",
        default=str(REPO / "src"),
        help="the dirmq the server runs (another checkout's src/ to compare; default this one)",
    )
    parser.add_argument("--scrapes", type=int, default=20, help="warm scrapes")
    parser.add_argument("--quick", action="store_true", help="5 warm scrapes")
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args()
    if args.quick:
        args.scrapes = 5
    sys.path.insert(0, str(REPO / "src"))
    result = run(args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(table(result))
    print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
