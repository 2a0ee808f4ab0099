"""What a deep queue, many queues and a large body cost, as an operator meets them (issue 35).

Run by hand from the project root (never collected by pytest; the machine to itself, for the
full form):

    .venv/bin/python -m bench.scale                    # 1k/100k/1M deep, 10/1,000/10,000 queues,
                                                       # 1 KiB/1 MiB/64 MiB bodies
    .venv/bin/python -m bench.scale --quick            # 1k/10k deep, 10/100 queues, 1 KiB/1 MiB
    .venv/bin/python -m bench.scale --parts deep,bodies --json /tmp/scale.json
    .venv/bin/python -m bench.scale --parts queues --queues 5000   # the issue's 5,000 polls

It builds its roots under a fresh temp dir (`--dir`, default /tmp: the disk) and removes it at
the end, also on an error or Ctrl-C; every process it starts is stopped by PID.

- deep: one queue of 100 B messages, written straight into the layout as puts lay them out
  (`@ready/` up to its 1,000, the rest in the backlog's buckets; the build time is reported)
  and deepened in place from one size to the next. At each depth: a fresh library
  process's first get+ack (its own time from before `Store(...)` to after the ack), one `dirmq
  get --ack` (the subprocess's wall time) and `dirmq serve` from spawn to its first answered
  `GET /q/messages`; each with the process's peak RSS, and the ratio deepest/shallowest.
- queues: a root of N empty queues and one `dirmq serve` (1 worker). The server's CPU
  (utime+stime, /proc) to register one long poll on each of min(N, 5,000) distinct queues, and
  the same number of polls on one queue as the yardstick, and as many `GET /health` (each on
  its connection, kept open) through dirmq and through `bench.floor_server` (bare uvloop +
  httptools: the HTTP floor, to which the registrations' own syscalls in a bare loop add up to
  the design's floor); a publish sent halfway through the burst to a
  queue already polled, and how long until that poll answers; beside it, how long the client
  took to open every connection, and how many connections the kernel dropped meanwhile for a
  full accept queue (machine-wide; each such client retries a second later); and the
  server's resident memory growth over each burst, every poll (connection) still held.
- bodies: one body of each size POSTed to a queue of a fresh server and then got; each timed
  against `dd bs=1M conv=fsync` of the same size on the same filesystem (the floor, same run),
  with the server's peak RSS growth (VmHWM, reset before each step) during the POST and the GET.

It prints one table per part and the targets, and writes JSON (default
`bench/results/scale.json`). One run; compare within a row.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import BODY, HOST, REPO, RESULTS
from bench.harness.procs import Processes, cpu_seconds, raise_fd_limit, vm_rss_kib
from bench.harness.report import Report, filesystem_of, machine_basics, write_results
from bench.harness.roots import fill_ready, make_queues
from bench.harness.servers import http_call, start_dirmq, start_floor_server

DEFAULT_JSON = RESULTS / "scale.json"
PARTS = ("deep", "queues", "bodies")
FULL = {"depths": [1_000, 100_000, 1_000_000], "queues": [10, 1_000, 10_000]}
FULL["bodies"] = [1024, 2**20, 64 * 2**20]
QUICK = {"depths": [1_000, 10_000], "queues": [10, 100], "bodies": [1024, 2**20]}
MAX_POLLS = 5_000  # the burst: 5,000 long polls on 5,000 distinct queues
# The console's sampler lists every queue's directories every 10 s (0.4 s of CPU over 5,000
# queues, holding the GIL in turns with the event loop): a cost of the root, not of the polls,
# which fell into one burst and not the next. Out of the queues part's few seconds.
QUIET_SAMPLER = ["--sample-interval", "10m"]
STEP_BUDGET_S = 300.0  # any one timed subprocess or wait; a run that exceeds it is broken

# A fresh library process's first get+ack: its own clock from before Store(...) to after the
# ack (the import is not timed), then its peak RSS from /proc.
LIBRARY_CHILD = """
import json, sys, time
import dirmq
started = time.perf_counter()
with dirmq.Store(sys.argv[1]) as store:
    queue = store.queue(sys.argv[2])
    message = queue.get_one()
    assert message is not None, "the queue is empty"
    queue.ack(message.receipt)
    seconds = time.perf_counter() - started
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "hwm_kib": hwm}))
"""


def vm_hwm_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmHWM for pid {pid}")


def reset_hwm(pid: int) -> None:
    """Peak RSS back to the current RSS (Linux >= 4.0): the next VmHWM is this step's peak."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")


def run_child(procs: Processes, args: list[str], workdir: Path) -> tuple[float, int, str]:
    """Run `args` to its end: wall seconds, its own peak RSS in KiB (the rusage `wait4` gives of
    this child alone) and its stdout. An error if it fails; killed by PID past the budget."""
    out_path, err_path = workdir / "child.out", workdir / "child.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        started = time.perf_counter()
        proc = procs.start(args, stdout=out, stderr=err, cwd=REPO)
        timer = threading.Timer(STEP_BUDGET_S, os.kill, (proc.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    if proc.returncode != 0:
        tail = err_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{' '.join(args[1:3])} exited {proc.returncode}: {tail}")
    return seconds, usage.ru_maxrss, out_path.read_text()


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    """A part's table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n== {title} ==")
    for r in [header, *rows]:
        cells = [r[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)]
        print("  ".join(cells))


# == deep: one queue at 1k, 100k, 1M ===========================================================
def first_served_get(procs: Processes, root: Path) -> tuple[float, int]:
    """`dirmq serve` (1 worker) from spawn to its first 200 to `GET /q/messages`; its VmHWM."""
    started = time.perf_counter()
    server = start_dirmq(procs, str(root), 1, "deep")
    try:
        status, headers, _ = http_call(server.port, "GET", "/q/messages", timeout_s=STEP_BUDGET_S)
        seconds = time.perf_counter() - started
        if status != 200:
            raise RuntimeError(f"first GET /q/messages of a deep queue: {status}")
        hwm = vm_hwm_kib(server.proc.pid)
        # acked, untimed: the next depth is then built on exactly three messages fewer
        http_call(server.port, "DELETE", f"/q/messages/{headers['x-receipt']}")
        return seconds, hwm
    finally:
        procs.stop(server.proc)


def deep(procs: Processes, workdir: Path, depths: list[int], report: Report) -> dict[str, Any]:
    root = workdir / "deep"
    make_queues(root, ["q"])
    results: dict[str, Any] = {"rows": {}, "build_s": {}}
    have = 0
    for depth in depths:
        started = time.perf_counter()
        fill_ready(root / "q", depth - have, BODY)
        os.sync()  # the build's writeback is not charged to the first row
        results["build_s"][depth] = round(time.perf_counter() - started, 2)
        report.row("deep: build", f"{depth:,} deep", f"{results['build_s'][depth]:.1f} s")
        py = sys.executable
        lib_s, lib_rss, out = run_child(procs, [py, "-c", LIBRARY_CHILD, str(root), "q"], workdir)
        lib = json.loads(out)
        cli_s, cli_rss, _ = run_child(
            procs, [py, "-m", "dirmq", "get", "--ack", "--root", str(root), "q"], workdir
        )
        srv_s, srv_hwm = first_served_get(procs, root)
        row = {
            "library_first_get_ack_s": lib["seconds"],
            "library_child_wall_s": lib_s,
            "library_hwm_kib": lib["hwm_kib"],
            "library_maxrss_kib": lib_rss,
            "cli_get_ack_s": cli_s,
            "cli_maxrss_kib": cli_rss,
            "serve_first_get_s": srv_s,
            "serve_hwm_kib": srv_hwm,
        }
        results["rows"][depth] = row
        have = depth - 3  # each of the three consumed one message
        for name, value in row.items():
            shown = f"{value / 1024:.1f} MiB" if name.endswith("kib") else f"{value:.3f} s"
            report.row(f"deep: {depth:,}", name, shown)
    low, high = depths[0], depths[-1]
    ratios = {}
    for name in results["rows"][low]:
        base = results["rows"][low][name]
        ratios[name] = results["rows"][high][name] / base if base else float("inf")
    results["ratios"] = {"of": f"{high}/{low}", **ratios}
    rows = []
    for name in results["rows"][low]:
        scale = 1024 if name.endswith("kib") else 1
        rows.append([name, *(f"{results['rows'][d][name] / scale:.3f}" for d in depths)])
        rows[-1].append(f"{ratios[name]:.2f}x")
    header = ["row (s, or MiB)", *(f"{d:,} deep" for d in depths), f"{high:,}/{low:,}"]
    table("deep: one queue of 100 B messages", header, rows)
    for name in ("library_first_get_ack_s", "cli_get_ack_s", "serve_first_get_s"):
        value = ratios[name]
        report.target(f"deep {name}", value, "<= 2x", value <= 2.0, f"{high:,} vs {low:,} deep")
    return results


# == queues: long polls on many queues =========================================================
async def _open_poll(port: int, name: str, wait_s: int) -> tuple[asyncio.Task[bytes], Any]:
    """A long poll on `name`, and a task that ends with its status line (when it is answered)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    writer.write(f"GET /{name}/messages?wait={wait_s} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
    return asyncio.create_task(reader.readline()), writer


async def _publish_and_wait(
    port: int, name: str, answer: asyncio.Task[bytes]
) -> tuple[float, float]:
    """Publish one message to `name`; seconds from sending it to its poll's status line, and
    to the publish's own answer (the server read and stored it: what came before that is the
    server's backlog of connections to read, not the delivery's)."""
    reader, writer = await asyncio.open_connection(HOST, port)
    request = (
        f"POST /{name}/messages HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {len(BODY)}\r\n\r\n"
    )
    started = time.perf_counter()
    writer.write(request.encode() + BODY)

    async def stored_answer() -> tuple[bytes, float]:
        line = await reader.readline()
        return line, time.perf_counter()

    stored = asyncio.create_task(stored_answer())
    async with asyncio.timeout(60):
        status = await answer
        seconds = time.perf_counter() - started
        published, stored_at = await stored
    writer.close()
    if b" 200 " not in status:
        raise RuntimeError(f"the poll on {name} answered {status!r} to a publish")
    if b" 201 " not in published:
        raise RuntimeError(f"the publish to {name} answered {published!r}")
    return seconds, stored_at - started


def listen_overflows() -> int:
    """The kernel's count of connections dropped because a listener's accept queue was full
    (TcpExt ListenOverflows, the whole machine): a client whose connection is dropped retries
    its SYN a second later, which shows in a delivery as a second more."""
    try:
        with open("/proc/net/netstat") as f:
            lines = f.read().splitlines()
    except OSError:
        return 0
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        if head.startswith("TcpExt:") and "ListenOverflows" in head.split():
            return int(values.split()[head.split().index("ListenOverflows")])
    return 0


def rss_kib(pids: list[int]) -> int:
    """The resident memory of the server's processes, KiB."""
    return sum(vm_rss_kib(pid) for pid in pids)


async def burst(port: int, pids: list[int], names: list[str], probe: bool) -> dict[str, float]:
    """One long poll per name, each on its own connection, opened one after another; with
    `probe`, a publish to the first name when half are open. The server's CPU from before the
    first to when it is idle again (no 10 ms of CPU in 0.2 s) after the last. An error if any
    other poll was answered meanwhile (refused: its cost would not be a registration's)."""
    cpu_before, overflows, rss_before = cpu_seconds(pids), listen_overflows(), rss_kib(pids)
    started = time.perf_counter()
    polls: list[tuple[asyncio.Task[bytes], Any]] = []
    delivery: asyncio.Task[tuple[float, float]] | None = None
    try:
        for i, name in enumerate(names):
            polls.append(await _open_poll(port, name, 600))
            if probe and i == len(names) // 2:
                delivery = asyncio.create_task(_publish_and_wait(port, names[0], polls[0][0]))
        sent_s = time.perf_counter() - started
        latency, stored = await delivery if delivery is not None else (math.nan, math.nan)
        deadline, last = time.monotonic() + STEP_BUDGET_S, cpu_seconds(pids)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            now = cpu_seconds(pids)
            if now - last < 0.01:
                break
            last = now
        cpu = cpu_seconds(pids) - cpu_before
        answered = [task for task, _ in polls[1 if probe else 0 :] if task.done()]
        if answered:
            first = answered[0].result() if not answered[0].exception() else answered[0]
            raise RuntimeError(f"{len(answered)} polls answered with nothing published: {first!r}")
        return {
            "polls": len(names),
            "server_cpu_s": cpu,
            "sent_s": sent_s,
            "delivery_s": latency,
            "stored_s": stored,  # to the publish's 201: the server had read it
            "listen_overflows": listen_overflows() - overflows,  # machine-wide, during the burst
            "rss_growth_mib": (rss_kib(pids) - rss_before) / 1024,  # with every poll held
        }
    finally:
        for task, writer in polls:
            task.cancel()
            writer.close()


async def floor_burst(port: int, pids: list[int], count: int) -> dict[str, float]:
    """The HTTP floor of a burst: `count` connections, one after another, each sending the
    cheapest request on the same path as a poll (`GET /health`: parsed, routed, answered by
    the native dialect) and kept open like a poll; the server's CPU from before the first to
    when it is idle again, as `burst` measures."""
    cpu_before, rss_before = cpu_seconds(pids), rss_kib(pids)
    opened: list[tuple[asyncio.Task[bytes], Any]] = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(f"GET /health HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode())
            opened.append((asyncio.create_task(reader.readline()), writer))
        async with asyncio.timeout(STEP_BUDGET_S):
            statuses = await asyncio.gather(*(task for task, _ in opened))
        if any(b" 200 " not in status for status in statuses):
            raise RuntimeError(f"GET /health answered {statuses[0]!r}")
        last = cpu_seconds(pids)
        while True:
            await asyncio.sleep(0.2)
            now = cpu_seconds(pids)
            if now - last < 0.01:
                break
            last = now
        return {
            "requests": count,
            "server_cpu_s": cpu_seconds(pids) - cpu_before,
            "rss_growth_mib": (rss_kib(pids) - rss_before) / 1024,  # every connection open
        }
    finally:
        for task, writer in opened:
            task.cancel()
            writer.close()


def registration_floor(root: Path, names: list[str]) -> float:
    """CPU seconds of the syscalls a poll's registration on an idle queue new to the process
    needs, in a bare loop over `names` (this process, one fresh inotify instance): its
    configuration read, a watch on @ready, @delayed and @backlog (watch before look), a look
    into @ready, @delayed and @leased (the first entry), a stat of @backlog. What no server of
    this design can spend less on; the HTTP floor is on top."""
    from dirmq.store import layout
    from dirmq.store.watch import _MASK, IN_CLOEXEC, IN_NONBLOCK, IN_ONLYDIR, _libc, add_watch

    fd = int(_libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
    if fd < 0:
        raise OSError("inotify_init1 failed")
    mask = _MASK | IN_ONLYDIR  # as the store's watches
    started = time.process_time()
    try:
        for name in names:
            queue = f"{root}/{name}/"
            config = os.open(queue + layout.CONFIG_FILE, os.O_RDONLY | os.O_CLOEXEC)
            os.read(config, 4096)
            os.close(config)
            for watched in (layout.READY, layout.DELAYED, layout.BACKLOG):
                add_watch(fd, queue + watched, mask)
            for looked in (layout.READY, layout.DELAYED, layout.LEASED):
                with os.scandir(queue + looked) as entries:
                    next(entries, None)
            os.stat(queue + layout.BACKLOG)
        return time.process_time() - started
    finally:
        os.close(fd)


def queues(procs: Processes, workdir: Path, counts: list[int], report: Report) -> dict[int, Any]:
    raise_fd_limit()  # the server (started after) inherits it
    results: dict[int, Any] = {}
    for count in counts:
        root = workdir / f"queues-{count}"
        names = [f"q{n:05d}" for n in range(count)]
        make_queues(root, names)
        polled = names[: min(count, MAX_POLLS)]
        server = start_dirmq(procs, str(root), 1, f"queues-{count}", QUIET_SAMPLER)
        try:
            distinct = asyncio.run(burst(server.port, server.pids, polled, probe=True))
        finally:
            procs.stop(server.proc)
        server = start_dirmq(procs, str(root), 1, f"queues-{count}-one", QUIET_SAMPLER)
        try:
            one = asyncio.run(burst(server.port, server.pids, [names[0]] * len(polled), False))
        finally:
            procs.stop(server.proc)
        server = start_dirmq(procs, str(root), 1, f"queues-{count}-floor", QUIET_SAMPLER)
        try:
            floor = asyncio.run(floor_burst(server.port, server.pids, len(polled)))
        finally:
            procs.stop(server.proc)
        bare_server = start_floor_server(procs, str(workdir / "bare-http"), 1)
        try:
            bare = asyncio.run(floor_burst(bare_server.port, bare_server.workers, len(polled)))
        finally:
            procs.stop(bare_server.proc)
        syscalls_s = registration_floor(root, polled)
        shutil.rmtree(root)
        results[count] = {"distinct": distinct, "one_queue": one, "floor": floor, "bare": bare}
        results[count]["registration_syscalls_s"] = syscalls_s
        design_floor_s = bare["server_cpu_s"] + syscalls_s
        results[count]["design_floor_s"] = design_floor_s
        each = f"{1000 * distinct['server_cpu_s'] / len(polled):.2f} ms each"
        report.row(
            f"queues: {count:,}",
            f"{len(polled):,} polls, distinct queues",
            f"{distinct['server_cpu_s']:.3f} s CPU",
            each,
        )
        report.row(
            f"queues: {count:,}",
            f"{len(polled):,} polls, one queue",
            f"{one['server_cpu_s']:.3f} s CPU",
        )
        report.row(
            f"queues: {count:,}",
            f"{len(polled):,} GET /health through dirmq",
            f"{floor['server_cpu_s']:.3f} s CPU",
        )
        report.row(
            f"queues: {count:,}",
            f"{len(polled):,} GET /health, bare uvloop + httptools (bench.floor_server)",
            f"{bare['server_cpu_s']:.3f} s CPU",
        )
        report.row(
            f"queues: {count:,}",
            f"{len(polled):,} registrations' syscalls in a bare loop",
            f"{syscalls_s:.3f} s CPU",
            f"the design's floor (bare HTTP + these): {design_floor_s:.3f} s"
            + (
                f", dirmq {distinct['server_cpu_s'] / design_floor_s:.2f}x it"
                if design_floor_s
                else ""
            ),
        )
        report.row(
            f"queues: {count:,}",
            "publish during the burst",
            f"{1000 * distinct['delivery_s']:.1f} ms",
            f"to its poll's answer ({1000 * distinct['stored_s']:.1f} ms to its own 201)",
        )
    rows = []
    for count, r in results.items():
        d, o = r["distinct"], r["one_queue"]
        # None: the yardstick took under a clock tick (10 ms), too little to divide by
        ratio = d["server_cpu_s"] / o["server_cpu_s"] if o["server_cpu_s"] else None
        r["ratio_distinct_to_one"] = ratio
        cpu, one_cpu, ms = d["server_cpu_s"], o["server_cpu_s"], 1000 * d["delivery_s"]
        floor_cpu = r["floor"]["server_cpu_s"]
        rows.append([f"{count:,}", f"{d['polls']:,}", f"{cpu:.3f}", f"{one_cpu:.3f}"])
        rows[-1] += [f"{floor_cpu:.3f}", f"{r['design_floor_s']:.3f}"]
        rows[-1] += ["-" if ratio is None else f"{ratio:.2f}x", f"{ms:.1f}"]
        rows[-1] += [f"{1000 * d['stored_s']:.1f}", f"{d['sent_s']:.2f}"]
        rows[-1] += [f"{d['listen_overflows']:,}"]
        rss = (d["rss_growth_mib"], o["rss_growth_mib"], r["floor"]["rss_growth_mib"])
        rows[-1] += ["{:.1f} / {:.1f} / {:.1f}".format(*rss)]
    header = ["queues", "polls", "CPU s, distinct", "CPU s, one queue", "CPU s, /health"]
    header += ["CPU s, design floor"]
    header += ["ratio", "delivery ms", "its 201 ms", "client s", "overflows"]
    header += ["RSS + MiB: distinct / one / floor"]
    table("queues: long polls, the server's CPU to register them", header, rows)
    top = results[counts[-1]]["distinct"]
    polls = int(top["polls"])
    report.target(
        f"CPU of {polls:,} polls on distinct queues",
        top["server_cpu_s"],
        "<= 0.5 s",
        top["server_cpu_s"] <= 0.5,
        f"{counts[-1]:,} queues",
    )
    report.target(
        "publish delivered during the burst",
        1000 * top["delivery_s"],
        "<= 50 ms",
        top["delivery_s"] <= 0.05,
        f"{polls:,} polls",
    )
    return results


# == bodies: large messages through the server =================================================
def dd_fsync(source: Path, target: Path) -> float:
    started = time.perf_counter()
    subprocess.run(
        ["dd", f"if={source}", f"of={target}", "bs=1M", "conv=fsync", "status=none"],
        check=True,
        timeout=STEP_BUDGET_S,
    )
    seconds = time.perf_counter() - started
    target.unlink()
    return seconds


def bodies(procs: Processes, workdir: Path, sizes: list[int], report: Report) -> dict[int, Any]:
    root = workdir / "bodies"
    limit = str(2 * max(sizes) + 2**20)
    server = start_dirmq(procs, str(root), 1, "bodies", ["--max-body-bytes", limit])
    results: dict[int, Any] = {}
    try:
        status, _, text = http_call(
            server.port, "PUT", "/big", json.dumps({"max_message_bytes": int(limit)}).encode()
        )
        if status not in (200, 201):
            raise RuntimeError(f"PUT /big: {status} {text[:200]!r}")
        pid = server.proc.pid
        for size in sizes:
            source = workdir / f"body-{size}"
            body = os.urandom(size)
            source.write_bytes(body)
            floor_s = dd_fsync(source, workdir / f"dd-{size}")
            reset_hwm(pid)
            before = vm_hwm_kib(pid)
            started = time.perf_counter()
            status, _, _ = http_call(
                server.port, "POST", "/big/messages", body, timeout_s=STEP_BUDGET_S
            )
            post_s = time.perf_counter() - started
            if status != 201:
                raise RuntimeError(f"POST of {size} bytes: {status}")
            post_growth = vm_hwm_kib(pid) - before
            reset_hwm(pid)
            before = vm_hwm_kib(pid)
            started = time.perf_counter()
            status, headers, got = http_call(
                server.port, "GET", "/big/messages", timeout_s=STEP_BUDGET_S
            )
            get_s = time.perf_counter() - started
            if status != 200 or got != body:
                raise RuntimeError(
                    f"GET of the {size} bytes just posted: {status}, {len(got)} bytes"
                )
            get_growth = vm_hwm_kib(pid) - before
            http_call(server.port, "DELETE", f"/big/messages/{headers['x-receipt']}")
            source.unlink()
            del body, got
            results[size] = {
                "dd_fsync_s": floor_s,
                "post_s": post_s,
                "get_s": get_s,
                "post_vs_dd": floor_s / post_s,
                "get_vs_dd": floor_s / get_s,
                "post_hwm_growth_kib": post_growth,
                "get_hwm_growth_kib": get_growth,
            }
            r = results[size]
            report.row(
                f"bodies: {size:,} B",
                "POST",
                f"{post_s:.4f} s",
                f"{r['post_vs_dd']:.2f}x dd conv=fsync ({floor_s:.4f} s); "
                f"RSS +{post_growth / 1024:.1f} MiB",
            )
            report.row(
                f"bodies: {size:,} B",
                "GET",
                f"{get_s:.4f} s",
                f"{r['get_vs_dd']:.2f}x dd; RSS +{get_growth / 1024:.1f} MiB",
            )
    finally:
        procs.stop(server.proc)
    rows = []
    for size, r in results.items():
        rows.append([f"{size:,}", f"{r['dd_fsync_s']:.4f}", f"{r['post_s']:.4f}"])
        rows[-1] += [f"{r['post_vs_dd']:.2f}", f"{r['get_s']:.4f}", f"{r['get_vs_dd']:.2f}"]
        rows[-1] += [f"{r[f'{step}_hwm_growth_kib'] / 1024:.1f}" for step in ("post", "get")]
    header = ["bytes", "dd s", "POST s", "x dd", "GET s", "x dd", "POST +MiB", "GET +MiB"]
    table("bodies: through the server vs dd bs=1M conv=fsync (x dd: speed over dd's)", header, rows)
    top, r = sizes[-1], results[sizes[-1]]
    for step in ("post", "get"):
        ratio = r[f"{step}_vs_dd"]
        report.target(
            f"{step.upper()} {top:,} B vs dd conv=fsync",
            ratio,
            ">= 0.5x",
            ratio >= 0.5,
            "same size, same filesystem",
        )
        growth = r[f"{step}_hwm_growth_kib"] / 1024
        report.target(
            f"server RSS growth during {step.upper()}",
            growth,
            "<= 32 MiB",
            growth <= 32,
            f"{top:,} B body",
        )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true", help="1k/10k deep, 10/100 queues, 1 KiB/1 MiB bodies"
    )
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of {','.join(PARTS)}"
    )
    parser.add_argument(
        "--queues",
        help="queue counts of the queues part, comma-separated (e.g. 5000: 5,000 polls on "
        "5,000 queues), in place of the form's",
    )
    parser.add_argument(
        "--dir", default="/tmp", help="where the temp dir of roots goes (default /tmp)"
    )
    parser.add_argument(
        "--json", default=str(DEFAULT_JSON), help=f"results file (default {DEFAULT_JSON})"
    )
    args = parser.parse_args(argv)
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    sizes = dict(QUICK if args.quick else FULL)
    if args.queues:
        try:
            sizes["queues"] = [int(n.replace("_", "")) for n in args.queues.split(",")]
        except ValueError:
            parser.error(f"--queues takes whole numbers, comma-separated; got {args.queues!r}")
    procs, report = Processes(), Report()
    out: dict[str, Any] = {"machine": machine_basics(), "quick": args.quick, "dir": args.dir}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up as on Ctrl-C
    workdir = Path(tempfile.mkdtemp(prefix="dirmq-bench-scale-", dir=args.dir))
    run: dict[str, Callable[[], Any]] = {
        "deep": lambda: deep(procs, workdir, sizes["depths"], report),
        "queues": lambda: queues(procs, workdir, sizes["queues"], report),
        "bodies": lambda: bodies(procs, workdir, sizes["bodies"], report),
    }
    started = time.monotonic()
    try:
        out["machine"]["disk_fs"] = filesystem_of(str(workdir))
        for part in parts:
            print(f"\n-- {part} --", flush=True)
            out[part] = run[part]()
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    out["seconds"] = round(time.monotonic() - started, 1)
    write_results(report, out, args.json, "times in s, RSS in MiB; one run")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
