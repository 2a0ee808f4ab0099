"""The systems dirmq is measured against, from Debian's packages, on loopback, stopped by PID."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from bench.harness import HOST
from bench.harness.procs import Processes, free_port


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    port: int
    version: str
    client: Any  # redis.Redis, for setup and checks (the load goes through raw sockets)

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]


def start_redis(procs: Processes, directory: str, version: str) -> RedisServer:
    import redis

    os.makedirs(directory, exist_ok=True)
    port = free_port()
    args = ["redis-server", "--bind", HOST, "--port", str(port), "--dir", directory]
    args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    args += ["--maxclients", "15000"]  # the held long polls: 10,000 at once
    args += ["--daemonize", "no", "--logfile", os.path.join(directory, "redis.log")]
    proc = procs.start(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host=HOST, port=port, socket_timeout=60)
    deadline = time.monotonic() + 15
    while True:
        try:
            if client.ping():
                break
        except redis.ConnectionError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"redis-server did not start (exit {proc.poll()})")
        time.sleep(0.05)
    fsync = client.config_get("appendfsync")["appendfsync"]
    if fsync != "always":
        raise RuntimeError(f"redis appendfsync is {fsync!r}, not 'always'")
    return RedisServer(proc, port, version, client)
