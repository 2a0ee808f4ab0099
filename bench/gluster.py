"""GlusterFS benchmark (issue 19): put and get+ack on a GlusterFS mount against the local disk,
in the same run, through the library and through one `dirmq serve` per root.

Run by hand, as root, from the project root (never collected by pytest):

    PYTHONPATH=src .venv/bin/python -m bench.gluster            # full run, about 3 minutes
    PYTHONPATH=src .venv/bin/python -m bench.gluster --quick    # smoke run, under a minute
    PYTHONPATH=src .venv/bin/python -m bench.gluster --json /tmp/out.json

It sets up its own volume with tests/support/gluster.py's `running_volume()` (2 bricks on 127.0.0.2,
one mount; waits for any other volume run on the machine to end first) and removes it after;
the local root is a temp dir on the disk (/tmp). Servers are `dirmq serve --workers 1`, started
and stopped by PID by the harness (`bench.harness`), which also drives the HTTP load (raw uvloop
connections in child processes, one request in flight per connection). It prints a table and
writes JSON (default `bench/results/gluster.json`).

What is measured, on each filesystem (`gluster` and `disk`):
- floor: the syscalls of a durable put in a bare loop (create + write 100 B + fsync + rename),
  on 1 thread and on 16 (what overlapping can reach), with the temp in another directory (as
  `@tmp/`) and, on 16 threads, beside its final name (as the shared mode's puts write it);
- library put: one producer thread, `Queue.put` one message at a time (the issue's 16 puts/s
  per producer on GlusterFS was this, with 7 other processes on the volume);
- library put_many: batches of 64 (writethrough: durable when it returns);
- library get+ack: one consumer thread, `get()` then `ack()` one message at a time;
- server publish: POST /{q}/messages, one 100 B message per request, CONNECTIONS connections;
- server get+ack: GET then DELETE by receipt, CONNECTIONS connections, on a prefilled queue.

Each trial is bounded in count and time; the machine is shared, so take ratios between rows of
one run over absolute values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tests.support import gluster

import dirmq
from bench.harness import BODY, RESULTS
from bench.harness.load import run_load
from bench.harness.loadgen import publish_spec
from bench.harness.procs import Processes, cpu_seconds
from bench.harness.servers import create_queue, start_dirmq, warm_up

DEFAULT_JSON = str(RESULTS / "gluster.json")
CONNECTIONS = 32
BATCH = 64
FLOOR_THREADS = 16


@dataclass(frozen=True, slots=True)
class Sizes:
    ops: int  # per library trial
    trial_s: float  # per trial, at most
    prefill: int  # server get+ack


FULL = Sizes(ops=1000, trial_s=10.0, prefill=2000)
QUICK = Sizes(ops=100, trial_s=3.0, prefill=200)


@dataclass(slots=True)
class Row:
    filesystem: str
    what: str
    ops: int
    seconds: float
    note: str = ""

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "filesystem": self.filesystem,
            "what": self.what,
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "per_s": round(self.rate, 1),
            "note": self.note,
        }


GLUSTER_PIDS: list[int] = []  # the volume's client (the mount) and brick processes


def gluster_cpu_s() -> float:
    return float(cpu_seconds(GLUSTER_PIDS)) if GLUSTER_PIDS else 0.0


def gluster_note(cpu_before: float, seconds: float) -> str:
    """How many cores GlusterFS's own processes used meanwhile (on the mount only)."""
    if not GLUSTER_PIDS or seconds <= 0:
        return ""
    return f"gluster processes {(gluster_cpu_s() - cpu_before) / seconds:.2f} cores"


def timed(ops: int, budget_s: float, step: Callable[[int], int]) -> tuple[int, float, str]:
    """Call `step(i)` (it returns how many ops it did) until `ops` are done or `budget_s` ends:
    the ops, the seconds, and GlusterFS's cores."""
    done = 0
    cpu0 = gluster_cpu_s()
    start = time.perf_counter()
    deadline = start + budget_s
    while done < ops and time.perf_counter() < deadline:
        done += step(done)
    seconds = time.perf_counter() - start
    return done, seconds, gluster_note(cpu0, seconds)


# -- the floor: a durable put's syscalls in a bare loop -------------------------------------------
def floor(
    directory: str, threads: int, sizes: Sizes, beside: bool = False
) -> tuple[int, float, str]:
    """`beside`: the temp is `.<name>.<suffix>` in the final directory, as the shared mode's
    puts write it (FORMAT.md "Temps beside their final name"), else a name in another
    directory, as `@tmp/` is."""
    ready = os.path.join(directory, "ready")
    tmp = ready if beside else os.path.join(directory, "tmp")
    os.makedirs(tmp, exist_ok=True)
    os.makedirs(ready, exist_ok=True)
    counter = iter(range(10**9))
    lock = threading.Lock()

    def one() -> int:
        with lock:
            n = next(counter)
        name = f"{threads}-{n}"
        path = os.path.join(tmp, f".{name}.{os.getpid()}" if beside else name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, BODY)
            os.fsync(fd)
            os.rename(path, os.path.join(ready, name))
        finally:
            os.close(fd)
        return 1

    if threads == 1:
        return timed(sizes.ops, sizes.trial_s, lambda _i: one())
    total = sizes.ops * 2
    cpu0 = gluster_cpu_s()
    start = time.perf_counter()
    deadline = start + sizes.trial_s
    done = 0
    with ThreadPoolExecutor(threads) as pool:
        while done < total and time.perf_counter() < deadline:
            list(pool.map(lambda _i: one(), range(threads * 4)))
            done += threads * 4
    seconds = time.perf_counter() - start
    return done, seconds, gluster_note(cpu0, seconds)


# -- the library ----------------------------------------------------------------------------------
def notes(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def library_rows(fs: str, root: str, sizes: Sizes) -> list[Row]:
    rows: list[Row] = []
    with dirmq.Store(root) as store:
        mode = "shared" if store.context.shared else "local"
        q = store.create_queue("lib-put")
        ops, secs, note = timed(sizes.ops, sizes.trial_s, lambda _i: (q.put(BODY), 1)[1])
        rows.append(Row(fs, "library put, 1 producer", ops, secs, notes(f"{mode} mode", note)))
        q2 = store.create_queue("lib-batch")
        ops, secs, note = timed(
            sizes.ops * 2, sizes.trial_s, lambda _i: len(q2.put_many([BODY] * BATCH))
        )
        rows.append(Row(fs, f"library put_many of {BATCH}", ops, secs, notes(f"{mode} mode", note)))

        def get_ack(_i: int) -> int:
            got = q.get()
            if not got:
                return sizes.ops  # drained: stop
            q.ack(got[0].receipt or "")
            return 1

        available = q.stats().ready
        ops, secs, note = timed(min(sizes.ops, available), sizes.trial_s, get_ack)
        rows.append(Row(fs, "library get+ack, 1 consumer", ops, secs, notes(f"{mode} mode", note)))
    return rows


# -- the server -----------------------------------------------------------------------------------
def load(
    procs: Processes, server: Any, spec: dict[str, Any], sizes: Sizes, max_ops: int
) -> tuple[Any, str]:
    """A load trial and its note (cores of the server and of GlusterFS, errors)."""
    full = {"proto": "http", "port": server.port, "duration_s": sizes.trial_s, "max_ops": max_ops}
    cpu0 = gluster_cpu_s()
    trial = run_load(procs, full | spec, CONNECTIONS, 2, server.pids)
    notes = [f"{CONNECTIONS} conns", f"server {trial.server_cores:.2f} cores"]
    notes += [gluster_note(cpu0, trial.seconds)] if GLUSTER_PIDS else []
    notes += [f"errors {trial.errors}"] if trial.errors else []
    return trial, "; ".join(notes)


def server_rows(fs: str, root: str, sizes: Sizes, procs: Processes) -> list[Row]:
    with dirmq.Store(root) as store:  # prefilled by the library: untimed
        prefill = store.create_queue("srv-getack")
        for start in range(0, sizes.prefill, 256):
            prefill.put_many([BODY] * min(256, sizes.prefill - start), durability="writeback")
    server = start_dirmq(procs, root, 1, f"{fs}-server")
    rows: list[Row] = []
    try:
        create_queue(server.port, "srv-put")
        warm_up(server.port, "srv-put")
        trial, note = load(procs, server, publish_spec("srv-put"), sizes, sizes.ops * 4)
        rows.append(Row(fs, "server publish", trial.ops, trial.seconds, note))
        warm_up(server.port, "srv-getack")
        spec = {"script": "getack", "queue": "srv-getack"}
        trial, note = load(procs, server, spec, sizes, int(sizes.prefill * 0.9))
        rows.append(Row(fs, "server get+ack", trial.ops, trial.seconds, note))
    finally:
        procs.stop(server.proc)
    return rows


def measure(fs: str, base: str, sizes: Sizes, procs: Processes) -> list[Row]:
    print(f"== {fs}: {base}", flush=True)
    rows: list[Row] = []
    for threads, beside in ((1, False), (FLOOR_THREADS, False), (FLOOR_THREADS, True)):
        where = f"floor-{threads}{'-beside' if beside else ''}"
        ops, secs, note = floor(os.path.join(base, where), threads, sizes, beside)
        label = "floor: create+write+fsync+rename" + (f", {threads} threads" if threads > 1 else "")
        label += ", temp beside its final name" if beside else ""
        rows.append(Row(fs, label, ops, secs, note))
        print(f"  {rows[-1].what}: {rows[-1].rate:.0f}/s ({note})", flush=True)
    for row in library_rows(fs, os.path.join(base, "lib-root"), sizes):
        rows.append(row)
        print(f"  {row.what}: {row.rate:.0f}/s ({row.note})", flush=True)
    for row in server_rows(fs, os.path.join(base, "srv-root"), sizes, procs):
        rows.append(row)
        print(f"  {row.what}: {row.rate:.0f}/s ({row.note})", flush=True)
    return rows


def table(rows: list[Row]) -> str:
    by_what: dict[str, dict[str, Row]] = {}
    for row in rows:
        by_what.setdefault(row.what, {})[row.filesystem] = row
    lines = [
        "| what | GlusterFS /s | local disk /s | disk / GlusterFS | on GlusterFS |",
        "|---|---:|---:|---:|---|",
    ]
    for what, pair in by_what.items():
        g, d = pair.get("gluster"), pair.get("disk")
        ratio = f"{d.rate / g.rate:.0f}x" if g and d and g.rate > 0 else ""
        cells = [f"{r.rate:,.0f}" if r else "" for r in (g, d)]
        lines.append(f"| {what} | {cells[0]} | {cells[1]} | {ratio} | {g.note if g else ''} |")
    return "\n".join(lines)


ISSUE_PER_PRODUCER = 16.0  # issue 19: puts/s per producer on the mount before the shared mode


def targets(rows: list[Row]) -> str:
    """Issue 19's publish target (at least 10x its per-producer rate) and the floors of the run."""
    on = {r.what: r.rate for r in rows if r.filesystem == "gluster"}
    publish = on.get("server publish")
    if not publish:
        return ""
    lines = [
        f"\nserver publish on GlusterFS: {publish:.0f}/s = "
        f"{publish / ISSUE_PER_PRODUCER:.1f}x issue 19's {ISSUE_PER_PRODUCER:.0f} puts/s per "
        "producer (target 10x)"
    ]
    for what, rate in on.items():
        if what.startswith("floor") and "threads" in what and rate > 0:
            lines.append(f"  {publish / rate:.2f}x the {what}")
    return "\n".join(lines)


@contextlib.contextmanager
def disk_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="dirmq-bench-gluster-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run")
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    procs = Processes()
    rows: list[Row] = []
    started = time.time()
    try:
        with gluster.running_volume(mounts=1) as volume:  # waits for another run's volume
            GLUSTER_PIDS[:] = gluster._pids_mentioning(volume.base)
            rows += measure("gluster", os.path.join(volume.mounts[0], "bench"), sizes, procs)
            with disk_dir() as local:
                GLUSTER_PIDS.clear()
                rows += measure("disk", local, sizes, procs)
            procs.stop_all()
    finally:
        procs.stop_all()
    print()
    print(table(rows))
    print(targets(rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(
            {
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
                "sizes": {"ops": sizes.ops, "trial_s": sizes.trial_s, "prefill": sizes.prefill},
                "connections": CONNECTIONS,
                "load_average": os.getloadavg(),
                "rows": [r.to_json() for r in rows],
            },
            f,
            indent=2,
        )
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
