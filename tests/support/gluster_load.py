"""A load harness for several hosts on one root through the library (issue 19). A helper, not
a test module.

`run_load(roots, messages)` runs, on each root of `roots` (e.g. the mounts of one GlusterFS
volume, `tests/support/gluster.py`), `producers` producer and `consumers` consumer processes
(library `Store(root, watch_mode="poll", shared=shared)`, one queue, visibility
`visibility_s`), which publish `messages` unique bodies in all (single `put`s) and receive
them (`get`, then one `ack` each), and returns a `LoadResult`:

- `lost`: bodies published (their `put` returned) but never acknowledged;
- `twice`: deliveries of a body already delivered whose earlier lease had not expired (a
  second delivery that only an expiry would excuse);
- `quarantined`: files in the queue's `@corrupt/` (listed from every root);
- `stale`: acks refused with `StaleReceipt` (or a `FileNotFoundError`-like loss of the lease)
  while the lease was still fresh (before its deadline);
- `errors`: other exceptions in producers or consumers (as text);
- `fsck`: the unrepaired problems `fsck(repair=False)` finds from each root after the run.

The processes are this file run as a script (`python gluster_load.py produce|consume ...`),
each writing one JSON line per event into the run's `work` directory; the parent stops the
consumers once every published body is acknowledged (or `timeout_s` passed) and a short grace
period (`settle_s`) has let any second delivery show up.

From the command line, on a fresh volume: `python tests/support/gluster_load.py run 10000`
prints the
result as JSON (`--local` runs both sides on one local temp directory instead; `--peers`,
`--batch`, `--rate` and `--shared auto|true|false` as in `run_load`). Needs `PYTHONPATH` to
reach the `dirmq` to test (the processes inherit the environment).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

QUEUE = "load"


@dataclass
class LoadResult:
    messages: int  # asked for
    published: int  # puts that returned
    acked: int  # distinct bodies acknowledged
    lost: int
    twice: int
    quarantined: int
    stale: int
    errors: list[str] = field(default_factory=list)
    fsck: dict[str, list[str]] = field(default_factory=dict)  # root -> unrepaired problems
    seconds: float = 0.0
    details: dict[str, list[str]] = field(default_factory=dict)  # a few examples per count

    @property
    def clean(self) -> bool:
        return (
            self.lost == 0
            and self.twice == 0
            and self.quarantined == 0
            and self.stale == 0
            and not self.errors
            and not any(self.fsck.values())
        )


def run_load(
    roots: Sequence[str],
    messages: int,
    *,
    producers: int = 2,
    consumers: int = 2,
    visibility_s: float = 120.0,
    shared: bool | None = None,
    timeout_s: float = 600.0,
    settle_s: float = 3.0,
    batch: int = 8,
    rate: float = 0.0,
    peers: int = 0,
) -> LoadResult:
    """Run the load described in the module docstring; `roots` are dirmq roots (created if
    needed) of one shared directory, seen through different mounts. `shared` is passed to every
    `Store` (None: auto-detected). `batch`: the most messages one `get` leases. `rate`: puts
    per second per producer (0: as fast as they go; a rate the consumers keep up with makes
    files retire while puts go on, which is when `@free` recycling crosses hosts). `peers`: the
    queue's `peers` (each get picks one of the oldest `peers + 1` at random: consumers on many
    hosts then race less for the one head; 0 makes them all race, the issue's case)."""
    from dirmq.store import QueueConfig, Store
    from dirmq.store.fsck import fsck

    started = time.monotonic()
    Store(roots[0], shared=shared).create_queue(
        QUEUE, QueueConfig(visibility_timeout_s=visibility_s, peers=peers)
    )
    work = tempfile.mkdtemp(prefix="dirmq-load-")
    stop = os.path.join(work, "stop")
    procs: list[tuple[str, subprocess.Popen[bytes]]] = []
    shares = _shares(messages, producers * len(roots))
    env = dict(os.environ)
    shared_arg = "auto" if shared is None else str(shared).lower()
    p = 0
    for r, root in enumerate(roots):
        for i in range(producers):
            out = os.path.join(work, f"p{r}.{i}.jsonl")
            cmd = ["produce", root, out, shared_arg, f"m{r}p{i}", str(shares[p]), str(rate)]
            procs.append((out, _spawn(cmd, env)))
            p += 1
        for i in range(consumers):
            out = os.path.join(work, f"c{r}.{i}.jsonl")
            cmd = ["consume", root, out, shared_arg, stop, str(batch)]
            procs.append((out, _spawn(cmd, env)))
    producer_procs = [pr for out, pr in procs if os.path.basename(out).startswith("p")]
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if all(pr.poll() is not None for pr in producer_procs):
                published = _bodies(work, "p", "put")
                if published <= _bodies(work, "c", "acked"):
                    break
        time.sleep(settle_s)
    finally:
        with open(stop, "w"):
            pass
        for _out, pr in procs:
            try:
                pr.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pr.kill()
                pr.wait()
    result = _count(work, messages)
    shutil.rmtree(work, ignore_errors=True)
    result.quarantined = _quarantined(roots)
    for root in roots:
        report = fsck(root, repair=False)
        result.fsck[root] = [f"{p.kind}: {p.path}: {p.detail}" for p in report.unrepaired]
    for _out, pr in procs:
        if pr.returncode != 0:
            result.errors.append(f"{pr.args}: exit {pr.returncode}")
    result.seconds = round(time.monotonic() - started, 1)
    return result


def _shares(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args], env=env)


def _events(work: str, prefix: str) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []
    for name in sorted(os.listdir(work)):
        if name.startswith(prefix) and name.endswith(".jsonl"):
            with open(os.path.join(work, name)) as f:
                for line in f:
                    if line.endswith("\n"):  # a line still being written is read next time
                        events.append(json.loads(line))
    return events


def _bodies(work: str, prefix: str, outcome: str) -> set[str]:
    return {str(e["body"]) for e in _events(work, prefix) if e["outcome"] == outcome}


def _count(work: str, messages: int) -> LoadResult:
    puts = _events(work, "p")
    deliveries = sorted(_events(work, "c"), key=lambda e: float(str(e.get("got", 0.0))))
    published = {str(e["body"]) for e in puts if e["outcome"] == "put"}
    errors = [str(e["error"]) for e in puts + deliveries if e["outcome"] == "error"]
    acked = {str(e["body"]) for e in deliveries if e["outcome"] == "acked"}
    details: dict[str, list[str]] = {"lost": sorted(published - acked)[:10]}
    twice = stale = 0
    last_deadline: dict[str, float] = {}
    for e in deliveries:
        body = str(e["body"])
        if e["outcome"] == "error":
            continue
        got, deadline = float(str(e["got"])), float(str(e["deadline"]))
        if body in last_deadline and got < last_deadline[body]:
            twice += 1
            details.setdefault("twice", []).append(f"{e['id']} {body} {e['receipt']}")
        last_deadline[body] = max(last_deadline.get(body, 0.0), deadline)
        if e["outcome"] == "stale" and float(str(e["settled"])) < deadline:
            stale += 1
            details.setdefault("stale", []).append(f"{e['id']} {body} {e['receipt']}")
    counts = Counter(str(e["outcome"]) for e in deliveries)
    details["outcomes"] = [f"{k}={v}" for k, v in sorted(counts.items())]
    return LoadResult(
        messages=messages,
        published=len(published),
        acked=len(acked & published),
        lost=len(published - acked),
        twice=twice,
        quarantined=0,
        stale=stale,
        errors=errors[:20],
        details=details,
    )


def _quarantined(roots: Sequence[str]) -> int:
    names: set[str] = set()
    for root in roots:
        try:
            names.update(os.listdir(os.path.join(root, QUEUE, "@corrupt")))
        except FileNotFoundError:
            pass
    return len(names)


# -- the processes ------------------------------------------------------------------------------
def _shared_setting(text: str) -> bool | None:
    return None if text == "auto" else text == "true"


def _produce(root: str, out: str, shared: str, tag: str, count: int, rate: float) -> None:
    from dirmq.store import Store

    queue = Store(root, watch_mode="poll", shared=_shared_setting(shared)).queue(QUEUE)
    started = time.monotonic()
    with open(out, "a", buffering=1) as log:
        for i in range(count):
            if rate > 0 and (ahead := started + i / rate - time.monotonic()) > 0:
                time.sleep(ahead)
            body = f"{tag}-{i}"
            try:
                message_id = queue.put(body.encode())
            except Exception as exc:
                log.write(json.dumps({"body": body, "outcome": "error", "error": repr(exc)}) + "\n")
                continue
            log.write(json.dumps({"body": body, "id": message_id, "outcome": "put"}) + "\n")


def _consume(root: str, out: str, shared: str, stop: str, batch: int) -> None:
    from dirmq.errors import StaleReceipt
    from dirmq.store import Store

    queue = Store(root, watch_mode="poll", shared=_shared_setting(shared)).queue(QUEUE)
    with open(out, "a", buffering=1) as log:
        while not os.path.exists(stop):
            try:
                got = queue.get(batch, wait_s=0.5)
            except Exception as exc:
                log.write(json.dumps({"body": "", "outcome": "error", "error": repr(exc)}) + "\n")
                time.sleep(0.2)
                continue
            at = time.time()
            for message in got:
                try:
                    queue.ack(message.receipt)
                    outcome, error = "acked", ""
                except StaleReceipt as exc:
                    outcome, error = "stale", repr(exc)
                except Exception as exc:
                    outcome, error = "error", repr(exc)
                event = {
                    "id": message.id,
                    "body": message.body.decode(errors="replace"),
                    "receipt": message.receipt,
                    "got": at,
                    "deadline": message.lease_deadline_s,
                    "settled": time.time(),
                    "outcome": outcome,
                    "error": error,
                }
                log.write(json.dumps(event) + "\n")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="set up a volume (or --local) and run the load")
    run.add_argument("messages", type=int)
    run.add_argument("--local", action="store_true", help="one local temp dir, no GlusterFS")
    run.add_argument("--shared", choices=("auto", "true", "false"), default="auto")
    run.add_argument("--batch", type=int, default=8)
    run.add_argument("--rate", type=float, default=0.0, help="puts/s per producer (0: no limit)")
    run.add_argument("--peers", type=int, default=0, help="the queue's peers (see run_load)")
    produce = sub.add_parser("produce")
    for name in ("root", "out", "shared", "tag"):
        produce.add_argument(name)
    produce.add_argument("count", type=int)
    produce.add_argument("rate", type=float)
    consume = sub.add_parser("consume")
    for name in ("root", "out", "shared", "stop"):
        consume.add_argument(name)
    consume.add_argument("batch", type=int)
    args = parser.parse_args(argv)
    if args.command == "produce":
        _produce(args.root, args.out, args.shared, args.tag, args.count, args.rate)
    elif args.command == "consume":
        _consume(args.root, args.out, args.shared, args.stop, args.batch)
    else:
        shared = _shared_setting(args.shared)
        with contextlib.ExitStack() as stack:
            if args.local:
                base = stack.enter_context(tempfile.TemporaryDirectory())
                roots = [os.path.join(base, "root")] * 2
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
                from gluster import running_volume

                volume = stack.enter_context(running_volume())
                roots = [os.path.join(m, "root") for m in volume.mounts]
            result = run_load(
                roots,
                args.messages,
                shared=shared,
                batch=args.batch,
                rate=args.rate,
                peers=args.peers,
            )
        print(json.dumps(asdict(result), indent=1))


if __name__ == "__main__":
    main(sys.argv[1:])
