"""What one of the console's samples costs (`dirmq.console.samples`): CPU, time and bytes written
per sample, on a root of many queues, with or without one deep queue.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.console_samples                      # 1,000 queues, 10 samples
    .venv/bin/python -m bench.console_samples --deep 1000000       # and one of 1,000,000 ready

It builds a fresh root under /tmp (on disk): `--queues` queues laid out as `Store.create_queue`
lays them out (without its fsyncs), `--deep` ready message files of 100 bytes in the first one
(names as the store writes them), and a run directory in /dev/shm with two workers' counts files
(every queue counted). Then it takes `--samples` samples in this process, as the sampler thread
of a server would (`Sampler.sample`), and measures each:

    cpu         the sampling thread's CPU time (user + system)
    wall        the sample's time
    read        bytes this process read meanwhile (/proc/self/io rchar: the deep queue's
                bodies would show here; listings do not)
    written     bytes of the rings, latest.json and previous.json after the samples

It prints a table and writes JSON (default `bench/results/console_samples.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.harness import RESULTS
from bench.harness.roots import make_queues
from dirmq.console.samples import Sampler
from dirmq.console.samples_files import RECORD, slots
from dirmq.server.queuecounts import KINDS, QueueCounts
from dirmq.store import layout
from dirmq.store.census import Census
from dirmq.store.filemodes import root_access


def build_root(root: Path, queues: int, deep: int) -> list[str]:
    names = [f"t{n // 100:02d}/q{n % 100:02d}" for n in range(queues)]
    make_queues(root, names)
    ready = root / names[0] / layout.READY
    body = b"x" * 100
    base = 1_700_000_000_000_000
    for n in range(deep):
        fd = os.open(ready / f"{base + n:016d}-{n:012x}", os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, body)
        os.close(fd)
    return names


def rchar() -> int:
    with open("/proc/self/io", encoding="ascii") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def directory_bytes(path: str) -> int:
    """Bytes allocated (a ring is sparse until every slot was written once)."""
    return sum(
        os.stat(os.path.join(top, name)).st_blocks * 512
        for top, _, files in os.walk(path)
        for name in files
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--deep", type=int, default=0)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--output", default=str(RESULTS / "console_samples.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dirmq-bench-samples-", dir="/tmp"))
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    run_dir = tempfile.mkdtemp(prefix="dirmq-bench-run-", dir=shm)
    try:
        began = time.monotonic()
        names = build_root(work / "root", args.queues, args.deep)
        built_s = time.monotonic() - began
        counts = QueueCounts()
        access = root_access(str(work / "root"))
        sampler = Sampler(Census(str(work / "root")), access, counts, run_dir, interval_s=10)
        for worker in (1, 2):  # two workers' counts files, every queue counted
            rows = {name: [worker * (i + 1)] * len(KINDS) for i, name in enumerate(names)}
            sampler.files.write_counts(worker, rows)
        rows_taken = []
        t = int(time.time()) // 10 * 10
        for n in range(args.samples):
            read_before, wall_before = rchar(), time.monotonic()
            latest = sampler.sample(t + 10 * n)
            rows_taken.append(
                {
                    "cpu_s": latest["sample_cpu_s"],
                    "wall_s": time.monotonic() - wall_before,
                    "read_bytes": rchar() - read_before,
                }
            )
        result = {
            "queues": args.queues,
            "deep": args.deep,
            "build_s": round(built_s, 2),
            "cpu_s_median": statistics.median(r["cpu_s"] for r in rows_taken),
            "wall_s_median": statistics.median(r["wall_s"] for r in rows_taken),
            "read_bytes_median": statistics.median(r["read_bytes"] for r in rows_taken),
            "latest_json_bytes": os.path.getsize(sampler.files.latest_path),
            "run_dir_bytes": directory_bytes(run_dir),
            "samples": rows_taken,
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    print(f"{'queues':>8} {'deep':>9} {'cpu s':>7} {'wall s':>7} {'read B':>9} {'latest B':>9}")
    print(
        f"{result['queues']:>8} {result['deep']:>9} {result['cpu_s_median']:>7.3f} "
        f"{result['wall_s_median']:>7.3f} {result['read_bytes_median']:>9.0f} "
        f"{result['latest_json_bytes']:>9}"
    )
    print(f"run directory after {args.samples} samples: {result['run_dir_bytes']:,} bytes")
    print(f"an hour of samples: {args.queues + 1} rings of {slots(10) * RECORD.size:,} bytes")
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
