"""Real dirmq servers for tests: `dirmq serve` in a subprocess on 127.0.0.1 port 0."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_names = itertools.count()


def fresh(prefix: str) -> str:
    """A queue name no other test of this process uses (tests sharing a server)."""
    return f"{prefix}-{next(_names)}"


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    yaq_url: str | None
    root: Path
    sqs_url: str | None = None  # with --sqs-listen
    # Everything it printed, stdout and stderr (its log), read all along by a thread: a pipe
    # nobody reads would stop the server once 64 KiB of access log filled it.
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, found: Callable[[str], bool], timeout_s: float = 10) -> list[str]:
        """The lines printed so far that `found` accepts, once there is one (else [])."""
        deadline = time.monotonic() + timeout_s
        while True:
            matching = [line for line in list(self.lines) if found(line)]
            if matching or time.monotonic() > deadline:
                return matching
            time.sleep(0.02)

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        """Signal the server we started (by PID) and reap it; returns its exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.reader is not None:
            self.reader.join(timeout=10)  # the pipe ends when its last writer (a worker) exits
        return self.proc.returncode


def start_server(
    root: Path,
    *extra: str,
    yaq: bool = False,
    env: Mapping[str, str] | None = None,
    listen: str | None = "127.0.0.1:0",
    launcher: list[str] | None = None,
) -> ServerProcess:
    """`dirmq serve` on `root` (`extra`: more flags; `env`: more environment variables;
    `listen` None: no --listen flag, the address comes from elsewhere; `launcher`: a script
    the interpreter runs first, which executes `-m dirmq serve ...` itself)."""
    args = [sys.executable, *(launcher or []), "-m", "dirmq", "serve", "--root", str(root)]
    if listen is not None:
        args += ["--listen", listen]
    args += extra
    if yaq:
        args += ["--yaq-listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    assert proc.stdout is not None
    urls: dict[str, str] = {}
    output: list[str] = []
    for line in proc.stdout:
        output.append(line)
        if " API listening on " in line:
            urls[line.split()[1]] = line.rsplit(" ", 1)[1].strip()
        if line.startswith("storing queues under"):
            break
    else:
        # Closed here: nobody else will, and an unclosed pipe warns when it is collected.
        proc.stdout.close()
        proc.wait()
        said = "".join(output[-20:]).strip()
        raise RuntimeError(f"dirmq serve exited with {proc.returncode} before listening: {said}")
    server = ServerProcess(proc, urls["native"], urls.get("yaq"), root, urls.get("sqs"), output)
    server.reader = threading.Thread(target=_read_all, args=(proc, output), daemon=True)
    server.reader.start()
    return server


def _read_all(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stdout is not None
    with proc.stdout:
        for line in proc.stdout:
            lines.append(line)


def sqs_client(url: str) -> Any:
    """A boto3 SQS client of the server at `url` (any credentials do; retries off, so a test
    sees every error). Each one opens its own connections."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="test",
        aws_secret_access_key="test",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
