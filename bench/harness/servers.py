"""`dirmq serve` on 127.0.0.1:0 (stopped by PID through `Processes`), and calls to its API."""

from __future__ import annotations

import collections
import http.client
import json
import os
import queue
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.harness import BODY, HOST, REPO
from bench.harness.procs import Processes, child_pids, process_tree


def _drain_output(stream: Any, tail: collections.deque[str]) -> None:
    """Read a server's output to its end (or the pipe fills and the server stalls), keeping
    the last lines for an error message; the stream is closed at the end."""
    with stream:
        for line in stream:
            tail.append(line.rstrip("\n"))


@dataclass
class DirmqServer:
    proc: subprocess.Popen[str]
    port: int
    root: str
    workers: list[int]  # the PIDs that serve requests
    label: str
    access: Access | None = None  # TLS and a token (the "secure" section); None: plain HTTP
    log: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=50))

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid, *[p for p in self.workers if p != self.proc.pid]]


@dataclass(frozen=True)
class Access:
    """How a client reaches a server started with TLS and credentials."""

    cafile: str
    token: str

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.cafile)


def start_dirmq(
    procs: Processes,
    root: str,
    workers: int,
    label: str,
    extra: Sequence[str] = (),
    access: Access | None = None,
    env: Mapping[str, str] | None = None,
) -> DirmqServer:
    """`dirmq serve --workers N` on 127.0.0.1:0, once it answers /health: its port and PIDs
    (each worker adopted by `procs`, stopped by PID even if the supervisor dies first). `env`:
    variables over this process's (`PYTHONPATH` to run another checkout's dirmq)."""
    args = [sys.executable, "-m", "dirmq", "serve", "--root", root, "--listen", f"{HOST}:0"]
    args += ["--workers", str(workers), *extra]
    proc = procs.start(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def read_until_started() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
            if line.startswith("storing queues under"):
                break
        lines.put(None)

    reader = threading.Thread(target=read_until_started, daemon=True)
    reader.start()
    url = ""
    deadline = time.monotonic() + 30
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise RuntimeError(f"dirmq serve ({label}) did not start within 30 s") from None
        if line is None:
            break
        if " native API listening on " in line:
            url = line.rsplit(" ", 1)[1].strip()
    if not url:
        raise RuntimeError(f"dirmq serve ({label}) exited with {proc.poll()} before listening")
    reader.join(timeout=5)
    server = DirmqServer(proc, int(url.rsplit(":", 1)[1]), root, [proc.pid], label, access=access)
    threading.Thread(target=_drain_output, args=(proc.stdout, server.log), daemon=True).start()
    if workers > 1:
        deadline = time.monotonic() + 10
        while len(child_pids(proc.pid)) < workers and time.monotonic() < deadline:
            time.sleep(0.05)
        server.workers = child_pids(proc.pid)
        for pid in server.workers:
            procs.adopt(pid)
        if len(server.workers) != workers:
            raise RuntimeError(f"{label}: {len(server.workers)} of {workers} workers started")
    wait_http(server.port, access=access)
    return server


def wait_http(port: int, budget_s: float = 10.0, access: Access | None = None) -> None:
    deadline = time.monotonic() + budget_s
    while True:
        try:
            if http_call(port, "GET", "/health", timeout_s=2, access=access)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"no healthy dirmq on port {port}")
        time.sleep(0.05)


def http_call(
    port: int,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    timeout_s: float = 60.0,
    access: Access | None = None,
) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    headers = dict(headers or {})
    if access is None:
        conn = http.client.HTTPConnection(HOST, port, timeout=timeout_s)
    else:
        conn = http.client.HTTPSConnection(HOST, port, timeout=timeout_s, context=access.context())
        headers["Authorization"] = f"Bearer {access.token}"
    try:
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data
    finally:
        conn.close()


def create_queue(
    port: int, name: str, durability: str | None = None, access: Access | None = None
) -> None:
    config = {} if durability is None else {"durability": durability}
    body = json.dumps(config).encode()
    status, _, body = http_call(port, "PUT", f"/{name}", body, access=access)
    if status not in (200, 201):
        raise RuntimeError(f"PUT /{name}: {status} {body[:200]!r}")


def warm_up(port: int, name: str, access: Access | None = None) -> None:
    """One publish, one get, one ack: the queue's index, watcher and publisher exist after it."""
    status, _, _ = http_call(port, "POST", f"/{name}/messages", BODY, access=access)
    if status != 201:
        raise RuntimeError(f"warm-up publish to {name}: {status}")
    status, headers, _ = http_call(port, "GET", f"/{name}/messages", access=access)
    if status != 200:
        raise RuntimeError(f"warm-up get from {name}: {status}")
    receipt = headers["x-receipt"]
    status, _, _ = http_call(port, "DELETE", f"/{name}/messages/{receipt}", access=access)
    if status != 204:
        raise RuntimeError(f"warm-up ack on {name}: {status}")


def queue_stats(port: int, name: str) -> dict[str, Any]:
    status, _, body = http_call(port, "GET", f"/{name}")
    if status != 200:
        raise RuntimeError(f"GET /{name}: {status}")
    stats: dict[str, Any] = json.loads(body)["stats"]
    return stats


def delete_queue(port: int, name: str) -> None:
    """Untimed, after a trial: every trial then starts from the same filesystem state."""
    status, _, body = http_call(port, "DELETE", f"/{name}", timeout_s=600)
    if status != 204:
        raise RuntimeError(f"DELETE /{name}: {status} {body[:200]!r}")


@dataclass
class FloorServer:
    """A running `bench.floor_server`: its supervisor, port and worker PIDs."""

    proc: subprocess.Popen[str]
    port: int
    workers: list[int]


def start_floor_server(procs: Processes, root: str, workers: int) -> FloorServer:
    """`bench.floor_server --workers N` on 127.0.0.1:0, its queues under `root`: the least a
    server on dirmq's stack (uvloop + httptools) does for an answer (its docstring)."""
    os.makedirs(root, exist_ok=True)
    args = [sys.executable, "-m", "bench.floor_server", "--root", root]
    proc = procs.start(
        [*args, "--workers", str(workers)], stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("listening on "):
        raise RuntimeError(f"floor_server.py did not start: {line!r}")
    children = process_tree(proc.pid)[1:]
    for pid in children:
        procs.adopt(pid)
    return FloorServer(proc, int(line.split()[-1]), children)
