"""Load processes driven from the parent: started, released at once, their results merged."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import select
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.harness import REPO
from bench.harness.procs import Processes, cpu_seconds


class LoadChild:
    def __init__(
        self,
        procs: Processes,
        spec: dict[str, Any],
        program: Sequence[str] = ("-m", "bench.harness.loadgen"),
    ) -> None:
        """`program`: what runs the load after the interpreter (a benchmark with a load
        generator of its own passes `-m bench.<name> --child`); the spec is its last argument."""
        self.proc = procs.start(
            [sys.executable, *program, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:  # closed at its end: this thread is its only reader
            for line in self.proc.stdout:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def line(self, timeout_s: float) -> str:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"load process {self.proc.pid} silent for {timeout_s} s") from None
        if line is None:
            raise RuntimeError(f"load process {self.proc.pid} exited ({self.proc.poll()})")
        return line

    def expect(self, word: str, timeout_s: float) -> None:
        line = self.line(timeout_s)
        if line != word:
            raise RuntimeError(f"load process {self.proc.pid} said {line[:200]!r}, not {word!r}")

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def result(self, timeout_s: float) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.line(timeout_s))
        return data


def write_result(result: dict[str, Any]) -> None:
    """A load child's result, one JSON line on its stdout, every byte of it. The line (with its
    latency samples) is hundreds of KiB, and was read cut at exactly 65,536 or 131,072
    characters even with stdout set blocking first: a pipe left non-blocking by the load's event
    loop. A write that meets a full pipe waits here until it drains."""
    sys.stdout.flush()
    data = memoryview((json.dumps(result) + "\n").encode())
    fd = sys.stdout.fileno()
    while data:
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            select.select([], [fd], [])
            continue
        data = data[written:]


def split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


@dataclass(frozen=True, slots=True)
class Trial:
    ops: int
    seconds: float
    server_cpu_s: float
    client_cpu_s: float
    errors: dict[str, int]
    dry: int = 0

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    @property
    def server_cores(self) -> float:
        return self.server_cpu_s / self.seconds if self.seconds > 0 else 0.0

    @property
    def client_cores(self) -> float:
        return self.client_cpu_s / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "seconds": round(self.seconds, 4),
            "per_s": round(self.rate, 1),
            "server_cores": round(self.server_cores, 2),
            "client_cores": round(self.client_cores, 2),
            "errors": self.errors,
            "dry_connections": self.dry,
        }


def run_load(
    procs: Processes,
    spec: dict[str, Any],
    conns: int,
    nprocs: int,
    server_pids: list[int],
) -> Trial:
    """Run `spec` on `conns` connections spread over `nprocs` load processes, all started at
    once after every connection is open; the rate is all ops over the union of their windows."""
    children = [LoadChild(procs, {**spec, "conns": n}) for n in split(conns, nprocs)]
    try:
        for child in children:
            child.expect("ready", 60)
        cpu0 = cpu_seconds(server_pids)
        for child in children:
            child.go()
        for child in children:
            child.expect("sent", 30)
        results = [c.result(float(spec["duration_s"]) + 60) for c in children]
        server_cpu = cpu_seconds(server_pids) - cpu0
    finally:
        for child in children:
            if child.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    child.proc.stdin.close()
            procs.reap(child.proc, 15)
    errors: collections.Counter[str] = collections.Counter()
    for r in results:
        errors.update(r["errors"])
        if r["unfinished"]:
            errors["unfinished connections"] += r["unfinished"]
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    return Trial(
        ops=sum(r["ops"] for r in results),
        seconds=seconds,
        server_cpu_s=server_cpu,
        client_cpu_s=sum(r["cpu_s"] for r in results),
        errors=dict(errors),
        dry=sum(r["dry"] for r in results),
    )
