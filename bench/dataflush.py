"""A writethrough batch's data flush: the store's choice (`store/dataflush.py`: one `syncfs` or
each file's fsync, whichever has cost less lately) against `syncfs` alone, paired slice by slice
on one disk, with or without a neighbour writing to the same filesystem.

    .venv/bin/python -m bench.dataflush                  # 20 slices of 1.5 s, no neighbour
    .venv/bin/python -m bench.dataflush --neighbour      # a process rewriting a 256 MiB file
    .venv/bin/python -m bench.dataflush --quick          # 2 slices of 0.3 s: a smoke run

Each slice runs `put_many(--batch)` of 1 KiB messages on 2 threads into one Store's queue for
`--slice-seconds`; the two Stores (roots side by side under `--dir`) take turns, in an order
that alternates slice by slice, so a busy moment of the machine hits both. It prints each way's
rate, the median of the per-slice ratios and the chooser's running costs; JSON to
`bench/results/dataflush.json`. The neighbour writes 4 MiB every 10 ms without flushing (dirty
pages every `syncfs` must write too: what docs/operations.md warns of).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

import dirmq
from bench.harness import RESULTS
from bench.harness.load import Trial
from bench.harness.rounds import median, paired, run_rounds, series
from dirmq.store import fsio
from dirmq.store.dataflush import DataFlush

BODY = b"x" * 1024


def neighbour(path: str, stop: Any) -> None:
    """Rewrite a 256 MiB file 4 MiB at a time, never flushing, until `stop` is set."""
    chunk = os.urandom(4 << 20)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    offset = 0
    try:
        while not stop.is_set():
            os.pwrite(fd, chunk, offset)
            offset = (offset + len(chunk)) % (256 << 20)
            time.sleep(0.01)
    finally:
        os.close(fd)
        os.unlink(path)


def slice_of(queue: dirmq.Queue, batch: int, seconds: float) -> Trial:
    """`put_many(batch)` on 2 threads for `seconds`: one Trial (CPU: this process's)."""
    counts = [0, 0]
    end = time.monotonic() + seconds

    def work(n: int) -> None:
        while time.monotonic() < end:
            queue.put_many([BODY] * batch)
            counts[n] += batch

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    cpu0, began = time.process_time(), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Trial(sum(counts), time.perf_counter() - began, time.process_time() - cpu0, 0.0, {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=20)
    parser.add_argument("--slice-seconds", type=float, default=1.5)
    parser.add_argument("--batch", type=int, default=32, help="messages a put_many (32)")
    parser.add_argument("--neighbour", action="store_true", help="a process writing beside")
    parser.add_argument("--quick", action="store_true", help="2 slices of 0.3 s: a smoke run")
    parser.add_argument("--dir", default="/tmp", help="where the two roots live (the disk)")
    parser.add_argument("--json", default=str(RESULTS / "dataflush.json"))
    args = parser.parse_args()
    if args.quick:
        args.slices, args.slice_seconds = 2, 0.3
    parent = tempfile.mkdtemp(prefix="dataflush-", dir=args.dir)
    stop = multiprocessing.Event()
    writer = None
    if args.neighbour:
        writer = multiprocessing.Process(target=neighbour, args=(f"{parent}/neighbour", stop))
        writer.start()
    chooser = DataFlush()
    try:
        with dirmq.Store(f"{parent}/chosen") as chosen, dirmq.Store(f"{parent}/syncfs") as plain:
            chosen.group_commit.flush_data = chooser.flush
            plain.group_commit.flush_data = fsio.GroupCommit().flush_data  # syncfs alone
            queues = {"chosen": chosen.create_queue("q"), "syncfs": plain.create_queue("q")}
            trials = run_rounds(
                "data flush",
                {
                    name: (lambda _r, q=q: slice_of(q, args.batch, args.slice_seconds))
                    for name, q in queues.items()
                },
                args.slices,
            )
    finally:
        stop.set()
        if writer is not None:
            writer.join()
        shutil.rmtree(parent, ignore_errors=True)
    ratios = paired(trials, "chosen", "syncfs")
    costs = {
        f"{2 ** (c - 1)}+ files, {way}": round(s * 1e3, 2)
        for (c, way), s in chooser.costs().items()
    }
    print(f"\nchosen: {median(t.rate for t in trials['chosen']):,.0f} msg/s")
    print(f"syncfs: {median(t.rate for t in trials['syncfs']):,.0f} msg/s")
    print(f"chosen / syncfs, median of {len(ratios)} slices: {median(ratios):.2f}x  {ratios}")
    print(f"the chooser's running costs (ms a batch): {costs}")
    out: dict[str, Any] = {
        "settings": vars(args),
        "chosen": series(trials["chosen"]),
        "syncfs": series(trials["syncfs"]),
        "ratios": ratios,
        "median_ratio": median(ratios),
        "costs_ms": costs,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
