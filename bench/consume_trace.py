"""Where a get+ack spends its time inside `dirmq serve`: a tracing benchmark of consuming.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.consume_trace                     # /tmp and /dev/shm, ~1 min
    .venv/bin/python -m bench.consume_trace --dirs /srv/q --prefill 40000 --no-strace
    .venv/bin/python -m bench.consume_trace --layers /tmp/prof/getack-w1.txt  # py-spy by layer

For each filesystem (`--dirs`, default a disk under /tmp and tmpfs under /dev/shm) it starts
`dirmq serve --workers 1` in a child process whose store calls (`Queue.get`, `Queue.ack_each`)
are wrapped with timers before it serves, fills a queue with `--prefill` 100-byte messages
(batches, writeback, untimed), and drains it with `bench.http_load`'s load generator: 64
connections, each a loop of GET /q/messages then DELETE /q/messages/{receipt}. It reports:

- the rate, and the server's CPU per message (user and system, from /proc);
- the store calls the broker made: how many messages each get / ack_each call carried (the
  broker merges concurrent requests), wall and thread-CPU time per message inside them;
- with strace (Debian's, installed with apt-get if missing; `--no-strace` skips it): a second
  drain under `strace -c -f` (syscalls per message, and the kernel time of each kind per call,
  as strace measures it), and the trace of one GET + DELETE on an otherwise idle queue
  (`strace -f -T`): every syscall the server makes for it, in order, with its duration.

The timers cost a little, and strace a lot (the rate under strace is not the benchmark's);
the counts per message and the shares are what this is for. Every process it starts is stopped
by PID at the end; the roots are deleted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
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
from bench.harness.install import ensure_pip, py_spy_path
from bench.harness.load import run_load
from bench.harness.loadgen import publish_spec
from bench.harness.procs import Processes, free_port, raise_fd_limit
from bench.harness.profiles import summarize_profile
from bench.harness.report import filesystem_of
from bench.harness.servers import create_queue, wait_http, warm_up

DEFAULT_JSON = RESULTS / "consume_trace.json"
PIP_NEEDS = (("py_spy", "py-spy", "py-spy"),)  # (import name, distribution, requirement)
BATCH = 100  # messages per prefill request
CONNECTIONS = 64  # the drain's connections, as bench.http_load's get+ack
QUEUE = "q"
# Syscalls of the event loop and thread hand-offs, as opposed to the store's file work.
LOOP_CALLS = {"epoll_wait", "epoll_pwait", "epoll_ctl", "futex", "getpid", "clock_gettime"}
# py-spy self time by layer, from the innermost frame's file as py-spy prints it (relative to
# sys.path: "dirmq/store/pool.py"; the server's modules and the standard library's by base name).
HTTP_PARTS = ("", "_listener", "_connection", "_intake", "_answers", "_refusals", "_wire")
LAYERS = {
    **{f"http{part}.py": "HTTP parsing and responses (server/http.py)" for part in HTTP_PARTS},
    "broker.py": "broker (server/broker.py)",
    "runners.py": "event loop (uvloop's C: sockets, epoll, callbacks)",
}
GLUE = {"thread.py", "tasks.py", "futures.py", "events.py", "base_events.py", "threading.py"}
GLUE |= {"queue.py", "_base.py", "functools.py"}


# -- in the traced server ------------------------------------------------------------------------
def _install_timers(out_path: str) -> None:
    """Wrap `Queue.get` and `Queue.ack_each`; SIGUSR2 starts recording, SIGUSR1 appends the
    calls (kind, messages, wall s, thread CPU s) to `out_path` as one JSON line."""
    from dirmq.store.queue import Queue

    calls: list[tuple[str, int, float, float]] = []
    recording = threading.Event()
    get, ack_each = Queue.get, Queue.ack_each

    def timed_get(self: Queue, *args: Any, **kwargs: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        got = get(self, *args, **kwargs)
        if recording.is_set():
            calls.append(("get", len(got), time.perf_counter() - wall, time.thread_time() - cpu))
        return got

    def timed_ack_each(self: Queue, receipts: Any) -> Any:
        receipts = list(receipts)
        wall, cpu = time.perf_counter(), time.thread_time()
        failures = ack_each(self, receipts)
        if recording.is_set():
            spent = (time.perf_counter() - wall, time.thread_time() - cpu)
            calls.append(("ack", len(receipts) - len(failures), *spent))
        return failures

    def dump(*_: object) -> None:
        with open(out_path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "calls": calls}) + "\n")

    def start(*_: object) -> None:
        calls.clear()
        recording.set()

    Queue.get = timed_get  # type: ignore[method-assign]
    Queue.ack_each = timed_ack_each  # type: ignore[method-assign]
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, start)


def child_serve(root: str, port: int, out_path: str) -> int:
    sys.path.insert(0, str(REPO / "src"))
    _install_timers(out_path)
    from dirmq.cli import main as dirmq_main

    listen = f"127.0.0.1:{port}"
    return dirmq_main(["serve", "--root", root, "--listen", listen, "--workers", "1"])


# -- the driver ----------------------------------------------------------------------------------
def ensure_strace() -> str | None:
    if shutil.which("strace") is None:
        print("installing strace (apt-get) ...", file=sys.stderr, flush=True)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-qq"], check=False, env=env, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-qq", "strace"], check=False, env=env)
    return shutil.which("strace")


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of process `pid` (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


class Traced:
    """One traced `dirmq serve` with a root under `parent`."""

    def __init__(self, parent: str) -> None:
        self.base = tempfile.mkdtemp(prefix="dirmq-consume-trace-", dir=parent)
        self.out_path = os.path.join(self.base, "calls.jsonl")
        self.port = free_port()
        args = [os.path.join(self.base, "root"), str(self.port), self.out_path]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.consume_trace", "--child-serve", *args],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.procs = Processes()
        wait_http(self.port, budget_s=20.0)
        create_queue(self.port, QUEUE)

    def load(self, spec: dict[str, Any], conns: int, nprocs: int) -> Any:
        full = {"proto": "http", "port": self.port, "duration_s": 300.0} | spec
        return run_load(self.procs, full, conns, nprocs, [self.proc.pid])

    def prefill(self, count: int) -> None:
        spec = publish_spec(QUEUE, BATCH, (("X-Durability", "writeback"),))
        trial = self.load(spec | {"max_ops": count}, 8, 1)
        if trial.errors or trial.ops < count:
            raise RuntimeError(f"prefill: {trial.ops} of {count}, errors {trial.errors}")
        os.sync()
        warm_up(self.port, QUEUE)

    def drain(self, count: int) -> Any:
        spec = {"script": "getack", "queue": QUEUE, "max_ops": count}
        return self.load(spec, CONNECTIONS, 2)

    def calls(self) -> list[list[Any]]:
        before = len(self._lines())
        os.kill(self.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(self._lines()) <= before:
            time.sleep(0.05)
        lines = self._lines()
        return list(json.loads(lines[-1])["calls"]) if len(lines) > before else []

    def _lines(self) -> list[str]:
        path = Path(self.out_path)
        return path.read_text().splitlines() if path.exists() else []

    def close(self) -> None:
        self.procs.stop_all()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)


def summarize_calls(calls: list[list[Any]], messages: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("get", "ack"):
        mine = [c for c in calls if c[0] == kind]
        if not mine:
            continue
        carried = sum(c[1] for c in mine)
        out[kind] = {
            "calls": len(mine),
            "messages": carried,
            "mean_messages_per_call": round(carried / len(mine), 2),
            "median_messages_per_call": statistics.median(c[1] for c in mine),
            "wall_us_per_message": round(1e6 * sum(c[2] for c in mine) / max(1, carried), 1),
            "thread_cpu_us_per_message": round(1e6 * sum(c[3] for c in mine) / max(1, carried), 1),
        }
    out["messages_drained"] = messages
    return out


_SUMMARY_ROW = re.compile(r"^\s*([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(?:(\d+)\s+)?(\w+)\s*$")


def parse_strace_summary(text: str, messages: int) -> list[dict[str, Any]]:
    """`strace -c` table -> rows (syscall, calls per message, µs per call, µs per message)."""
    rows = []
    for line in text.splitlines():
        match = _SUMMARY_ROW.match(line)
        if match is None or match.group(6) == "total":
            continue
        seconds, usecs_call, calls = float(match.group(2)), int(match.group(3)), int(match.group(4))
        rows.append(
            {
                "syscall": match.group(6),
                "calls": calls,
                "per_message": round(calls / messages, 3),
                "us_per_call": usecs_call,
                "us_per_message": round(1e6 * seconds / messages, 2),
                "errors": int(match.group(5) or 0),
            }
        )
    return sorted(rows, key=lambda r: -float(r["us_per_message"]))


def strace_drain(strace: str, server: Traced, count: int) -> dict[str, Any]:
    """Drain `count` messages with `strace -c -f` attached to the server (every thread)."""
    out = os.path.join(server.base, "strace-c.txt")
    spy = subprocess.Popen([strace, "-c", "-f", "-o", out, "-p", str(server.proc.pid)])
    time.sleep(1.0)  # strace attaches
    try:
        trial = server.drain(count)
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=30)
    rows = parse_strace_summary(Path(out).read_text(), trial.ops)
    return {"messages": trial.ops, "rate_under_strace": round(trial.rate, 1), "syscalls": rows}


_TRACE_LINE = re.compile(r"^(\d+)\s+(\w+)\((.*)\)\s+=\s+(.*?)\s+<([\d.]+)>$")


def strace_one(strace: str, server: Traced) -> list[dict[str, Any]]:
    """Every syscall the server makes for one GET and one DELETE (a queue holding 1 message)."""
    create_queue(server.port, "one")
    urllib.request.urlopen(
        urllib.request.Request(f"http://127.0.0.1:{server.port}/one/messages", data=b"x" * 100),
        timeout=10,
    ).read()
    time.sleep(0.5)
    out = os.path.join(server.base, "strace-one.txt")
    args = [strace, "-f", "-T", "-s", "80", "-o", out, "-p", str(server.proc.pid)]
    spy = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    try:
        got = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/one/messages", timeout=10)
        receipt = got.headers["X-Receipt"]
        got.read()
        delete = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/one/messages/{receipt}", method="DELETE"
        )
        urllib.request.urlopen(delete, timeout=10).read()
        time.sleep(0.3)
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=30)
    trace = []
    for line in Path(out).read_text().splitlines():
        match = _TRACE_LINE.match(line.strip())
        if match is None:
            continue
        tid, call, arguments, result, seconds = match.groups()
        trace.append(
            {
                "tid": int(tid),
                "syscall": call,
                "args": arguments[:120],
                "result": result[:40],
                "us": round(float(seconds) * 1e6, 1),
            }
        )
    return trace


def layer_shares(raw_path: str) -> dict[str, float]:
    """Self-time shares (%) by layer from py-spy's collapsed stacks (`--format raw`). Without
    `--native`, time in C (syscalls included) counts for the Python function that called it."""
    by_layer: collections.Counter[str] = collections.Counter()
    total = 0
    for line in Path(raw_path).read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        where = stack.split(";")[-1].partition(" (")[2].rsplit(":", 1)[0]
        if where.startswith("dirmq/store/"):
            layer = "store (Python, and the syscalls it makes)"
        elif os.path.basename(where) in LAYERS:
            layer = LAYERS[os.path.basename(where)]
        elif os.path.basename(where) in GLUE:
            layer = "thread pool hand-offs and asyncio glue"
        elif where.startswith("dirmq/") or "/" not in where:
            layer = "dialect, routing, observers (server/*, dialects/*, metrics)"
        else:
            layer = "other"
        by_layer[layer] += int(count_text)
        total += int(count_text)
    return {k: round(100 * v / total, 1) for k, v in by_layer.most_common()} if total else {}


def profile_drain(server: Traced, prefill: int, out_dir: str, label: str) -> dict[str, Any]:
    """One more drain with py-spy recording the server (collapsed stacks in `out_dir`)."""
    spy = py_spy_path()
    if spy is None:
        return {}
    server.prefill(prefill)
    out = os.path.join(out_dir, f"consume-{label}.txt")
    args = [spy, "record", "--pid", str(server.proc.pid), "--rate", "200", "--nonblocking"]
    spy_proc = subprocess.Popen(
        [*args, "--format", "raw", "--output", out],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # py-spy attaches
    try:
        trial = server.drain(int(prefill * 0.9))
    finally:
        spy_proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        spy_proc.wait(timeout=60)
    server.drain(prefill - int(prefill * 0.9))
    summary: dict[str, Any] = summarize_profile(out, top=20)
    return summary | {"rate": round(trial.rate, 1), "raw": out, "layers": layer_shares(out)}


def run_filesystem(
    parent: str,
    prefill: int,
    strace: str | None,
    rounds: int,
    profile_dir: str | None,
) -> dict[str, Any]:
    server = Traced(parent)
    result: dict[str, Any] = {"dir": parent, "filesystem": filesystem_of(parent)}
    try:
        drained = int(prefill * 0.9)
        timed = []
        for _ in range(rounds):
            server.prefill(prefill)
            user0, sys0 = cpu_split(server.proc.pid)
            os.kill(server.proc.pid, signal.SIGUSR2)
            trial = server.drain(drained)
            calls = server.calls()
            user1, sys1 = cpu_split(server.proc.pid)
            timed.append(
                {
                    "rate": round(trial.rate, 1),
                    "messages": trial.ops,
                    "server_user_us_per_message": round(1e6 * (user1 - user0) / trial.ops, 1),
                    "server_sys_us_per_message": round(1e6 * (sys1 - sys0) / trial.ops, 1),
                    "load_cores": round(trial.client_cores, 2),
                    "errors": trial.errors,
                    "store_calls": summarize_calls(calls, trial.ops),
                }
            )
            # What the drain left (10 %) is drained by the next prefill's queue; purge it.
            server.drain(prefill - drained)
        result["timed"] = timed
        if profile_dir is not None:
            label = "shm" if parent.startswith("/dev/shm") else "disk"
            result["profile"] = profile_drain(server, prefill, profile_dir, label)
        if strace is not None:
            server.prefill(prefill)
            result["strace_c"] = strace_drain(strace, server, drained)
            server.drain(prefill - drained)
            result["one_get_ack"] = strace_one(strace, server)
    finally:
        server.close()
    return result


def print_result(result: dict[str, Any]) -> None:
    print(f"\n== {result['dir']} ({result['filesystem']}) ==")
    for t in result["timed"]:
        calls = t["store_calls"]
        user, system = t["server_user_us_per_message"], t["server_sys_us_per_message"]
        print(
            f"  {t['rate']:>9,.0f} msg/s; server CPU per message: user {user} µs + sys {system} µs"
        )
        for kind in ("get", "ack"):
            if kind in calls:
                c = calls[kind]
                print(
                    f"    {kind}: {c['calls']} store calls, "
                    f"{c['mean_messages_per_call']} msgs/call "
                    f"(median {c['median_messages_per_call']}); "
                    f"per message {c['wall_us_per_message']} µs wall, "
                    + f"{c['thread_cpu_us_per_message']} µs thread CPU"
                )
    if result.get("profile"):
        p = result["profile"]
        print(
            f"  py-spy: {p['samples']} samples, {p['rate']:,.0f} msg/s under it; "
            "self time by layer:"
        )
        for layer, pct in p["layers"].items():
            print(f"    {pct:5.1f}%  {layer}")
        print("  top self time:")
        for frame, pct in p["self_pct"][:15]:
            print(f"    {pct:5.1f}%  {frame}")
    if "strace_c" in result:
        s = result["strace_c"]
        print(
            f"  strace -c over {s['messages']} messages ({s['rate_under_strace']:,.0f}/s under it):"
        )
        print(f"    {'syscall':<16}{'per msg':>9}{'µs/call':>9}{'µs/msg':>9}{'errors':>8}")
        for row in s["syscalls"][:20]:
            print(
                f"    {row['syscall']:<16}{row['per_message']:>9}{row['us_per_call']:>9}"
                f"{row['us_per_message']:>9}{row['errors']:>8}"
            )
    if "one_get_ack" in result:
        print("  one GET + DELETE, every syscall but the event loop's and the thread hand-offs':")
        for row in result["one_get_ack"]:
            if row["syscall"] in LOOP_CALLS:
                continue
            print(f"    {row['us']:>8} µs  {row['syscall']}({row['args']}) = {row['result']}")
        kinds = collections.Counter(row["syscall"] for row in result["one_get_ack"])
        print(f"    all syscalls of the pair, by kind: {dict(kinds.most_common())}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    parser.add_argument("--dirs", default=f"{tempfile.gettempdir()},{shm}")
    parser.add_argument("--prefill", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-strace", action="store_true")
    parser.add_argument("--profile", metavar="DIR", help="also py-spy one drain into DIR")
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    parser.add_argument(
        "--layers", nargs="+", metavar="RAW", help="only print the layer shares of py-spy files"
    )
    parser.add_argument("--child-serve", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layers:
        for raw in args.layers:
            print(f"{raw}:")
            for layer, pct in layer_shares(raw).items():
                print(f"  {pct:5.1f}%  {layer}")
        return 0
    if args.child_serve:
        root, port, out_path = args.child_serve
        return child_serve(root, int(port), out_path)
    if args.profile:
        ensure_pip(PIP_NEEDS)  # py-spy
    raise_fd_limit()
    strace = None if args.no_strace else ensure_strace()
    results = []
    for parent in [d for d in args.dirs.split(",") if d]:
        if args.profile:
            os.makedirs(args.profile, exist_ok=True)
        result = run_filesystem(parent, args.prefill, strace, args.rounds, args.profile)
        print_result(result)
        results.append(result)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"prefill": args.prefill, "results": results}, indent=1))
    print(f"JSON written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
