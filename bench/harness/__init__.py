"""What every benchmark shares, one concept a module:

- `install`: Debian packages and pip requirements a benchmark installs itself when missing;
- `procs`: the processes a benchmark starts (stopped by PID), free ports, /proc readings;
- `servers`: `dirmq serve` on 127.0.0.1:0 and control-plane calls to it;
- `peers`: Redis, RabbitMQ and NATS from Debian's packages, on loopback;
- `wire`: HTTP/1.1 and RESP requests built once, replies parsed minimally;
- `loadgen`: the load generator, run as child processes (`python -m bench.harness.loadgen`);
- `load`: driving load processes from the parent, and a trial's result;
- `rounds`: rounds in rotating order, medians and per-round ratios;
- `report`: result rows, tables, JSON, and what machine and source a run measured;
- `profiles`: py-spy's collapsed stacks summarized;
- `roots`: roots of many queues, built straight into the on-disk layout;
- `floors`: bare-syscall loops, what the store's own syscalls cost without dirmq around them;
- `charts`: bar charts of results (matplotlib).
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
RESULTS = REPO / "bench" / "results"
HOST = "127.0.0.1"
SHM = "/dev/shm"
BODY = b"x" * 100  # a message body, unless a benchmark says otherwise
