"""The processes a benchmark starts, and only those, stopped by PID; what /proc says of them."""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from typing import Any

from bench.harness import HOST

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after the command name (field 3 onwards)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def cpu_seconds(pids: Iterable[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLK_TCK
    return total


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def child_pids(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


class Processes:
    """Every process this benchmark started (and the workers they forked), to be stopped by PID."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[Any]] = []
        self.forked: list[tuple[int, str]] = []  # (pid, start time): never signal a reused pid

    def start(self, args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        proc: subprocess.Popen[Any] = subprocess.Popen(args, **kwargs)
        self.started.append(proc)
        return proc

    def adopt(self, pid: int) -> None:
        with contextlib.suppress(OSError):
            self.forked.append((pid, _stat_fields(pid)[19]))

    @staticmethod
    def stop(proc: subprocess.Popen[Any], timeout_s: float = 20.0) -> None:
        """SIGTERM (a dirmq server drains), then SIGKILL after `timeout_s`; reap it."""
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    @staticmethod
    def reap(proc: subprocess.Popen[Any], timeout_s: float) -> None:
        """Wait for a process that ends by itself; kill it (by PID) if it does not."""
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            try:
                self.stop(proc)
            except Exception as exc:
                print(f"could not stop pid {proc.pid}: {exc!r}", file=sys.stderr)
        for pid, started in self.forked:  # a worker whose supervisor died without it
            try:
                if _stat_fields(pid)[19] == started:
                    os.kill(pid, signal.SIGKILL)
            except (OSError, IndexError):
                pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft


# == the servers (parent process) ===============================================================
def process_tree(root: int) -> list[int]:
    """`root` and every descendant (children of any of its threads), from /proc."""
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo.extend(int(p) for p in f.read().split())
            except OSError:
                pass
    return found


def wait_port(port: int, proc: subprocess.Popen[Any], what: str, budget_s: float) -> None:
    """Until `port` accepts a connection; an error if `proc` exits first or the budget ends."""
    deadline = time.monotonic() + budget_s
    while True:
        with socket.socket() as s:
            s.settimeout(1.0)
            if s.connect_ex((HOST, port)) == 0:
                return
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not listen on {port} within {budget_s:.0f} s")
        time.sleep(0.2)
