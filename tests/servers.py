"""Real dirmq servers for tests: `dirmq serve` in a subprocess on 127.0.0.1 port 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    yaq_url: str | None
    root: Path
    sqs_url: str | None = None  # with --sqs-listen

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
        """Signal the server we started (by PID) and reap it; returns its exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
        try:
            self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
        return self.proc.returncode


def start_server(root: Path, *extra: str, yaq: bool = False) -> ServerProcess:
    args = [
        sys.executable,
        "-m",
        "dirmq",
        "serve",
        "--root",
        str(root),
        "--listen",
        "127.0.0.1:0",
        *extra,
    ]
    if yaq:
        args += ["--yaq-listen", "127.0.0.1:0"]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
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
    return ServerProcess(proc, urls["native"], urls.get("yaq"), root, urls.get("sqs"))


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
