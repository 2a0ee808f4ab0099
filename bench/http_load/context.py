"""The run's settings and state, shared by the sections: sizes, the servers started so far,
the report, and a profiled trial."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.harness import RESULTS
from bench.harness.install import py_spy_path
from bench.harness.load import Trial, run_load
from bench.harness.peers import RedisServer, start_redis
from bench.harness.procs import Processes
from bench.harness.profiles import summarize_profile
from bench.harness.report import Report
from bench.harness.rounds import rate_text
from bench.harness.servers import DirmqServer, start_dirmq

DEFAULT_JSON = RESULTS / "http.json"


CONNECTIONS = 64  # dirmq load: concurrent connections, one request in flight on each


REDIS_CLIENTS = 50


BATCH = 100  # messages per batch request


SECTIONS = ("publish", "secure", "writeback", "latency", "longpoll", "getack")


CONNECT_GATE = 64  # long polls: connections in the making at once, over all load processes


PARK_S = 0.01  # latency: how long a poll sits before the publish (it is parked by then)


# (import name, distribution, pip requirement)
PIP_NEEDS = (("redis", "redis", "redis"), ("py_spy", "py-spy", "py-spy"))


@dataclass(frozen=True, slots=True)
class Sizes:
    rounds: int
    trial_s: float  # each throughput trial runs this long...
    trial_ops: int  # ...or until this many messages, whichever comes first
    dirmq_prefill: int  # messages queued before each dirmq get+ack trial
    redis_prefill: int
    longpolls: int
    longpoll_procs: int
    latency_samples: int


FULL = Sizes(
    rounds=3,
    trial_s=4.0,
    trial_ops=1_000_000,
    dirmq_prefill=40_000,
    redis_prefill=250_000,
    longpolls=10_000,
    longpoll_procs=4,
    latency_samples=500,
)


QUICK = Sizes(
    rounds=1,
    trial_s=1.0,
    trial_ops=200_000,
    dirmq_prefill=5_000,
    redis_prefill=50_000,
    longpolls=1_000,
    longpoll_procs=2,
    latency_samples=50,
)


def profile_trial(
    ctx: Context,
    name: str,
    server: DirmqServer | RedisServer,
    run: Callable[[], Trial],
    prepare: Callable[[], None] | None = None,
) -> None:
    """One more trial (not in the table) with py-spy recording the server: stacks of every
    thread that is not idle, written as collapsed stacks (`--format raw`; render them with
    flamegraph.pl or speedscope) and summarized as self and inclusive shares per function."""
    if ctx.profile_dir is None:
        return
    spy = py_spy_path()
    if spy is None:
        print("  py-spy is missing: no profile", file=sys.stderr)
        return
    out = os.path.join(ctx.profile_dir, f"{name}.txt")
    args = [spy, "record", "--pid", str(server.proc.pid), "--rate", "200", "--nonblocking"]
    args += ["--format", "raw", "--output", out]
    if isinstance(server, DirmqServer) and len(server.workers) > 1:
        args.append("--subprocesses")
    if prepare is not None:
        prepare()  # not profiled
    spy_proc = ctx.procs.start(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    try:
        trial = run()
    finally:
        if spy_proc.poll() is None:
            os.kill(spy_proc.pid, signal.SIGINT)  # py-spy writes its output on SIGINT
        ctx.procs.reap(spy_proc, 60)
    if not os.path.exists(out) or os.path.getsize(out) == 0:
        print(f"  py-spy wrote no profile for {name} (exit {spy_proc.returncode})", file=sys.stderr)
        return
    summary = summarize_profile(out)
    summary |= {"profiled_trial": trial.to_json(), "raw": out}
    ctx.report.data.setdefault("profiles", {})[name] = summary
    print(f"  profile {name}: {rate_text(trial.rate)} under py-spy; top self time:", flush=True)
    for frame, pct in summary["self_pct"][:12]:
        print(f"      {pct:5.1f}%  {frame}", flush=True)


@dataclass
class Context:
    sizes: Sizes
    procs: Processes
    report: Report
    disk: str  # temp dir on disk (/tmp)
    shm: str  # temp dir on tmpfs
    load_procs: int
    redis_version: str
    profile_dir: str | None
    servers: dict[str, DirmqServer] = field(default_factory=dict)
    _redis: RedisServer | None = None

    @property
    def probe(self) -> str:
        """Where inode allocations are probed (and the probed inodes kept)."""
        return os.path.join(self.disk, "inode-probe")

    def dirmq(self, label: str, filesystem: str, workers: int) -> DirmqServer:
        if label not in self.servers:
            parent = self.disk if filesystem == "disk" else self.shm
            root = os.path.join(parent, label)
            server = start_dirmq(self.procs, root, workers, label)
            self.servers[label] = server
            print(f"  started dirmq {label}: port {server.port}, pids {server.pids}", flush=True)
        return self.servers[label]

    @property
    def redis(self) -> RedisServer:
        if self._redis is None:
            self._redis = start_redis(
                self.procs, os.path.join(self.disk, "redis"), self.redis_version
            )
            print(f"  started redis {self.redis_version}: port {self._redis.port}", flush=True)
        return self._redis

    def load(
        self,
        server: DirmqServer | RedisServer,
        spec: dict[str, Any],
        conns: int,
        nprocs: int | None = None,
    ) -> Trial:
        proto = "http" if isinstance(server, DirmqServer) else "resp"
        full = {"proto": proto, "port": server.port, "duration_s": self.sizes.trial_s}
        full |= {"max_ops": self.sizes.trial_ops}
        if isinstance(server, DirmqServer) and server.access is not None:
            full["cafile"] = server.access.cafile
        full |= spec
        return run_load(self.procs, full, conns, nprocs or self.load_procs, server.pids)
