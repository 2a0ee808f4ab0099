"""The systems dirmq is measured against, from Debian's packages, on loopback, stopped by PID."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import HOST
from bench.harness.install import package_version
from bench.harness.procs import Processes, free_port, process_tree, wait_port


@dataclass
class RedisServer:
    proc: subprocess.Popen[bytes]
    port: int
    version: str
    client: Any  # redis.Redis, for setup and checks (the load goes through raw sockets)

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid]


def start_redis(
    procs: Processes, directory: str, version: str, extra: Sequence[str] = ()
) -> RedisServer:
    """redis-server on a free loopback port, its data in `directory`: an append-only file
    fsynced before each reply (`appendfsync always`), no snapshots. `extra`: more settings (a
    later one wins over the defaults here)."""
    import redis

    os.makedirs(directory, exist_ok=True)
    port = free_port()
    args = ["redis-server", "--bind", HOST, "--port", str(port), "--dir", directory]
    args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
    args += ["--maxclients", "15000"]  # the held long polls: 10,000 at once
    args += ["--daemonize", "no", "--logfile", os.path.join(directory, "redis.log"), *extra]
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


@dataclass
class Peer:
    """A server a benchmark measures: its port, version and the PIDs whose CPU is its own."""

    system: str
    port: int
    version: str
    pids: Callable[[], list[int]]  # the processes whose CPU is the server's, now
    detail: str = ""
    handle: Any = None  # the benchmark's own handle on it (a DirmqServer, a RedisServer, ...)


RABBIT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # not the su wrapper in /usr/sbin


def start_rabbitmq(procs: Processes, directory: str) -> Peer:
    """A RabbitMQ node of our own: its own epmd (on a free port, so no system-wide epmd is
    started or used), node name, AMQP and distribution ports, Mnesia and log dirs, HOME (for the
    Erlang cookie) and an empty plugin list."""
    for sub in ("mnesia", "log", "home"):
        os.makedirs(os.path.join(directory, sub), exist_ok=True)
    plugins = os.path.join(directory, "enabled_plugins")
    Path(plugins).write_text("[].\n")
    epmd_port, amqp_port, dist_port = free_port(), free_port(), free_port()
    epmd = procs.start(
        ["epmd", "-port", str(epmd_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    wait_port(epmd_port, epmd, "epmd", 15)
    env = {
        **os.environ,
        "HOME": os.path.join(directory, "home"),
        "ERL_EPMD_PORT": str(epmd_port),
        "RABBITMQ_NODENAME": f"dirmqbench{os.getpid()}@localhost",
        "RABBITMQ_NODE_IP_ADDRESS": HOST,
        "RABBITMQ_NODE_PORT": str(amqp_port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_MNESIA_BASE": os.path.join(directory, "mnesia"),
        "RABBITMQ_LOG_BASE": os.path.join(directory, "log"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": plugins,
        "RABBITMQ_CONFIG_FILE": os.path.join(directory, "rabbitmq"),  # none: the defaults
        "RABBITMQ_PID_FILE": os.path.join(directory, "rabbitmq.pid"),
    }
    log = open(os.path.join(directory, "stdout.log"), "wb")  # noqa: SIM115 (the server's life)
    proc = procs.start([RABBIT_SERVER], env=env, stdout=log, stderr=subprocess.STDOUT)
    wait_port(amqp_port, proc, "rabbitmq-server", 120)
    for pid in process_tree(proc.pid)[1:]:
        procs.adopt(pid)  # beam.smp and its helpers: killed by PID if the script dies without them
    return Peer(
        "rabbitmq",
        amqp_port,
        package_version("rabbitmq-server"),
        lambda: process_tree(proc.pid),
        detail=f"epmd port {epmd_port}, node {env['RABBITMQ_NODENAME']}",
    )


def start_nats(procs: Processes, directory: str) -> Peer:
    store = os.path.join(directory, "jetstream")
    os.makedirs(store, exist_ok=True)
    port = free_port()
    conf = os.path.join(directory, "nats.conf")
    # No sync_interval: 2.9 refuses the key ("unknown field"); its file store syncs every 2 min.
    Path(conf).write_text(f'listen: "{HOST}:{port}"\njetstream {{\n  store_dir: "{store}"\n}}\n')
    log = open(os.path.join(directory, "nats.log"), "wb")  # noqa: SIM115 (the server's life)
    proc = procs.start(["nats-server", "-c", conf], stdout=log, stderr=subprocess.STDOUT)
    wait_port(port, proc, "nats-server", 30)
    out = subprocess.run(["nats-server", "--version"], capture_output=True, text=True, check=False)
    version = out.stdout.strip().removeprefix("nats-server: ") or "?"
    return Peer("nats", port, version, lambda: process_tree(proc.pid))
