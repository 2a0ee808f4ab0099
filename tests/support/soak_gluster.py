"""Soak on GlusterFS (issue 19): 10,000 messages through two mounts of one volume, through the
library and through one `dirmq serve` per mount, while one mount's processes (its server, its
library producer and consumer, its HTTP producer and consumer) are SIGKILLed 10 times under
load and restarted. Part of `make soak` (after tests/support/soak.py); alone:

    python -m tests.support.soak_gluster    SOAK_GLUSTER_MESSAGES=10000 SOAK_GLUSTER_KILLS=10

Every client is a process of its own (this file run as `worker`), which writes one JSON line per
event into the run's work directory before it goes on: a line is in the kernel once written, so
a SIGKILL leaves what the process was told. At the end the queue is drained with the library
(once every lease has run out), and counted, by message body (each body unique):

- lost: puts that returned (acknowledged by the library or by a 201) whose message was neither
  acknowledged by a consumer (nor possibly so: an ack whose process died or whose answer was
  lost) nor found in the final drain; the acknowledged lost, which the issue asks to be 0;
- returned: deliveries of a message after an ack of it had returned;
- twice: deliveries of a message while an earlier delivery's lease still ran (an expiry is the
  only excuse for a second delivery: nothing nacks, and a killed consumer's leases run out);
- stale: acks refused (StaleReceipt) before their lease's deadline;
- quarantined: files in the queue's `@corrupt/`, from both mounts; and `dirmq fsck` from both.

All must be 0. Prints a table and writes JSON (default bench/results/soak-gluster.json). Where
the machine cannot run a GlusterFS volume it says why and exits 0 (nothing was tested).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .servers import REPO, ServerProcess, start_server

DEFAULT_JSON = REPO / "bench" / "results" / "soak-gluster.json"
QUEUE = "soak"
VISIBILITY_S = 15.0  # short: a killed consumer's leases come back within the run
DRAIN_QUIET_S = 10.0  # consumers stop when nothing was settled for this long
BATCH = 25  # HTTP puts per request, messages per get (acked by one ack_many)
MAX_BACKLOG = 600  # producers pause while more messages than this wait unsettled
KINDS = ("lib-produce", "lib-consume", "http-produce", "http-consume")


# -- the workers ---------------------------------------------------------------------------------
def worker(kind: str, target: str, out: str, stop: str, tag: str) -> None:
    """One client: `target` is a root (lib-*) or a server's URL (http-*)."""
    from dirmq.client import RemoteStore
    from dirmq.client.remote import RemoteQueue
    from dirmq.errors import DirmqError, StaleReceipt
    from dirmq.store import Store

    log = open(out, "a", buffering=1)  # noqa: SIM115  (open until SIGKILL or the stop file)

    def write(**event: object) -> None:
        log.write(json.dumps({"t": time.time(), **event}) + "\n")

    queue: object
    if kind.startswith("lib"):
        queue = Store(target, watch_mode="poll").queue(QUEUE)
    else:
        queue = RemoteQueue(RemoteStore(target, timeout_s=15), QUEUE)
    i = 0
    producing = kind.endswith("produce")
    # Producers stop first (at `stop` + ".produce"), consumers when the queue is drained;
    # producers wait while the backlog is long (`stop` + ".pause": the parent counts).
    while not os.path.exists(stop + ".produce" if producing else stop):
        if producing and os.path.exists(stop + ".pause"):
            time.sleep(0.1)
            continue
        if producing:
            bodies = [f"{tag}-{i + k}" for k in range(1 if kind.startswith("lib") else BATCH)]
            i += len(bodies)
            try:
                queue.put_many([b.encode() for b in bodies])  # type: ignore[attr-defined]
            except (DirmqError, OSError) as exc:  # in doubt: not counted as published
                write(o="put-error", e=repr(exc)[:200])
                time.sleep(0.1)
                continue
            for body in bodies:
                write(o="put", b=body)
            continue
        try:
            got = queue.get(BATCH, wait_s=0.5)  # type: ignore[attr-defined]
        except (DirmqError, OSError) as exc:
            write(o="get-error", e=repr(exc)[:200])
            time.sleep(0.1)
            continue
        for message in got:
            write(o="got", b=message.body.decode(), r=message.receipt, d=message.lease_deadline_s)
        try:
            failed = queue.ack_many(m.receipt for m in got)  # type: ignore[attr-defined]
        except (DirmqError, OSError) as exc:  # in doubt: the acks may have taken
            for message in got:
                write(o="ack-error", b=message.body.decode(), r=message.receipt, e=repr(exc)[:200])
            continue
        for message in got:
            error = failed.get(message.receipt or "")
            outcome = "acked" if error is None else "stale"
            if error is not None and not isinstance(error, StaleReceipt):
                outcome = "ack-error"
            write(o=outcome, b=message.body.decode(), r=message.receipt, e=repr(error)[:200])


# -- the run -------------------------------------------------------------------------------------
@dataclass
class GlusterSoakResult:
    messages: int
    kills: int
    published: int
    published_by_kind: dict[str, int]
    acked: int
    ack_in_doubt: int
    deliveries: int
    drained: int
    lost: int
    returned: int
    twice: int
    stale: int
    quarantined: int
    fsck_ok: dict[str, bool]
    fsck_problems: dict[str, list[str]]
    errors: dict[str, int]
    first_errors: dict[str, str]
    examples: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    work: str = ""  # the workers' logs: removed when clean, kept for a look otherwise

    @property
    def clean(self) -> bool:
        counts = (self.lost, self.returned, self.twice, self.stale, self.quarantined)
        return counts == (0, 0, 0, 0, 0) and all(self.fsck_ok.values())


class Mount:
    """The processes of one mount (one host): its server and its four clients."""

    def __init__(self, index: int, root: Path, work: Path, stop: Path) -> None:
        self.index, self.root, self.work, self.stop = index, root, work, stop
        self.server: ServerProcess | None = None
        self.clients: list[subprocess.Popen[bytes]] = []
        self.incarnation = 0

    def start(self) -> None:
        self.incarnation += 1
        self.server = start_server(self.root)
        for kind in KINDS:
            target = str(self.root) if kind.startswith("lib") else self.server.url
            tag = f"m{self.index}.{kind}.{self.incarnation}"
            args = [str(self.work / f"{tag}.jsonl"), str(self.stop), tag]
            command = [sys.executable, "-m", "tests.support.soak_gluster", "worker", kind, target]
            self.clients.append(subprocess.Popen([*command, *args], cwd=REPO))

    def kill(self) -> None:
        """SIGKILL the server and the clients, each by pid, all at once; then reap them."""
        procs = [p for p in self.clients if p.poll() is None]
        if self.server is not None:
            procs.append(self.server.proc)
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)
        for proc in procs:
            proc.wait(30)
        if self.server is not None:
            self.server.stop(signal.SIGKILL)
        self.clients = []

    def end(self) -> None:
        """The clients stop at the stop file; then the server drains (SIGTERM)."""
        for proc in self.clients:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.server is not None:
            self.server.stop()


def events(work: Path) -> Iterator[dict[str, object]]:
    for path in sorted(work.glob("*.jsonl")):
        kind = path.name.split(".")[1]  # m<mount>.<kind>.<incarnation>.jsonl
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):  # a line cut by a SIGKILL was never told to anyone
                yield {**json.loads(line), "file": path.name, "kind": kind}


class Progress:
    """Puts and settlements so far, read incrementally from the workers' logs (cheaply: by
    substring, the final count parses every line)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.offsets: dict[Path, int] = {}
        self.published = 0
        self.settled = 0

    def update(self) -> None:
        for path in self.work.glob("*.jsonl"):
            with open(path, "rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            self.published += complete.count(b'"o": "put"')
            self.settled += complete.count(b'"o": "acked"') + complete.count(b'"o": "stale"')

    @property
    def backlog(self) -> int:
        return self.published - self.settled


def wait_for_consumers(progress: Progress, quiet_s: float) -> None:
    """Until every published message was settled by a consumer, or none was for `quiet_s`
    (what is left, in leases of killed consumers or not yet due, the final drain takes)."""
    seen, quiet_since = -1, time.monotonic()
    while time.monotonic() - quiet_since < quiet_s:
        progress.update()
        if progress.backlog <= 0:
            return
        if progress.settled != seen:
            seen, quiet_since = progress.settled, time.monotonic()
        time.sleep(0.5)


def run_gluster_soak(messages: int, kills: int, mounts: tuple[str, str]) -> GlusterSoakResult:
    import dirmq

    started = time.monotonic()
    roots = (Path(mounts[0]) / "soak", Path(mounts[1]) / "soak")
    with dirmq.Store(roots[0]) as store:
        store.create_queue(QUEUE, dirmq.QueueConfig(visibility_timeout_s=VISIBILITY_S))
    work = Path(tempfile.mkdtemp(prefix="dirmq-soak-gluster-"))
    stop = work / "stop"
    produced_stop = work / "stop.produce"
    paused = work / "stop.pause"
    steady, killed = Mount(0, roots[0], work, stop), Mount(1, roots[1], work, stop)
    steady.start()
    killed.start()
    done_kills = 0
    try:
        # The kills are spread over the run by what has been published: the k-th once
        # k/(kills+1) of the messages are.
        progress = Progress(work)
        while progress.published < messages:
            count = progress.published
            if done_kills < kills and count >= messages * (done_kills + 1) / (kills + 1):
                killed.kill()
                done_kills += 1
                killed.start()
            if progress.backlog > MAX_BACKLOG:
                paused.touch()
            elif paused.exists():
                paused.unlink()
            time.sleep(0.2)
            progress.update()
        produced_stop.touch()
        wait_for_consumers(progress, DRAIN_QUIET_S)
    finally:
        produced_stop.touch()
        stop.touch()
        steady.end()
        killed.end()
    return count_run(work, roots, messages, done_kills, started)


def count_run(
    work: Path, roots: tuple[Path, Path], messages: int, kills: int, started: float
) -> GlusterSoakResult:
    import dirmq

    time.sleep(VISIBILITY_S + 1)  # every lease a killed consumer held has run out
    drained: set[str] = set()
    drain_deliveries = []
    with dirmq.Store(roots[0], create=False) as store:
        queue = store.queue(QUEUE)
        queue.sweep()
        while got := queue.get(100, visibility_s=600):
            now = time.time()
            for message in got:
                drained.add(message.body.decode())
                drain_deliveries.append((message.body.decode(), now))
            queue.ack_many(m.receipt or "" for m in got)
    all_events = list(events(work))
    published = {str(e["b"]) for e in all_events if e["o"] == "put"}
    by_kind: dict[str, int] = {}
    for e in all_events:
        if e["o"] == "put":
            by_kind[str(e["kind"])] = by_kind.get(str(e["kind"]), 0) + 1
    acked_at: dict[str, float] = {}
    for e in all_events:
        if e["o"] == "acked":
            body = str(e["b"])
            acked_at[body] = min(acked_at.get(body, float("inf")), float(str(e["t"])))
    # A delivery whose consumer died before its ack's answer, or whose ack's answer was lost.
    settled = {(str(e["r"])) for e in all_events if e["o"] in ("acked", "stale")}
    in_doubt = {
        str(e["b"])
        for e in all_events
        if (e["o"] == "got" and str(e["r"]) not in settled) or e["o"] == "ack-error"
    }
    lost = published - acked_at.keys() - in_doubt - drained
    deliveries = sorted(
        [
            (str(e["b"]), float(str(e["t"])), float(str(e["d"] or 0)))
            for e in all_events
            if e["o"] == "got"
        ]
        + [(b, t, t + 600) for b, t in drain_deliveries],
        key=lambda d: d[1],
    )
    returned, twice = [], []
    lease_until: dict[str, float] = {}
    for body, at, deadline in deliveries:
        if body in acked_at and at > acked_at[body]:
            returned.append(body)
        if body in lease_until and at < lease_until[body] - 0.01:
            twice.append(body)
        lease_until[body] = max(lease_until.get(body, 0.0), deadline)
    deadline_of = {str(e["r"]): float(str(e["d"] or 0)) for e in all_events if e["o"] == "got"}
    stale = [
        str(e["r"])
        for e in all_events
        if e["o"] == "stale" and float(str(e["t"])) < deadline_of.get(str(e["r"]), 0.0)
    ]
    errors: dict[str, int] = {}
    first_errors: dict[str, str] = {}
    for e in all_events:
        if str(e["o"]).endswith("error"):
            name = f"{e['kind']} {e['o']}: {str(e['e']).split('(', 1)[0]}"
            errors[name] = errors.get(name, 0) + 1
            first_errors.setdefault(name, str(e["e"]))
    quarantined: set[str] = set()
    for root in roots:
        corrupt = root / QUEUE / "@corrupt"
        quarantined.update(os.listdir(corrupt) if corrupt.is_dir() else [])
    fsck_ok, fsck_problems = {}, {}
    for root in roots:
        done = subprocess.run(
            [sys.executable, "-m", "dirmq", "fsck", "--root", str(root), "--json"],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        report = json.loads(done.stdout) if done.stdout.strip() else {"ok": False}
        fsck_ok[str(root)] = bool(report.get("ok")) and done.returncode == 0
        fsck_problems[str(root)] = [json.dumps(p) for p in report.get("problems", [])][:10]
    return GlusterSoakResult(
        messages=messages,
        kills=kills,
        published=len(published),
        published_by_kind=dict(sorted(by_kind.items())),
        acked=len(acked_at.keys() & published),
        ack_in_doubt=len(in_doubt - acked_at.keys()),
        deliveries=len(deliveries),
        drained=len(drained),
        lost=len(lost),
        returned=len(returned),
        twice=len(twice),
        stale=len(stale),
        quarantined=len(quarantined),
        fsck_ok=fsck_ok,
        fsck_problems=fsck_problems,
        errors=dict(sorted(errors.items())),
        first_errors=dict(sorted(first_errors.items())),
        examples={
            "lost": sorted(lost)[:5],
            "returned": returned[:5],
            "twice": twice[:5],
            "stale": stale[:5],
            "quarantined": sorted(quarantined)[:5],
        },
        seconds=round(time.monotonic() - started, 1),
        work=str(work),
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "worker":
        worker(*argv[1:6])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default_messages = int(os.environ.get("SOAK_GLUSTER_MESSAGES", "10000"))
    parser.add_argument("--messages", type=int, default=default_messages)
    parser.add_argument(
        "--kills", type=int, default=int(os.environ.get("SOAK_GLUSTER_KILLS", "10"))
    )
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    from .gluster import GlusterUnavailable, running_volume

    with contextlib.ExitStack() as stack:
        try:  # waits for any other volume on this machine first
            volume = stack.enter_context(running_volume())
        except GlusterUnavailable as exc:
            print(f"GlusterFS soak skipped: {exc}")
            return 0
        result = run_gluster_soak(args.messages, args.kills, (volume.mounts[0], volume.mounts[1]))
    if result.clean:
        shutil.rmtree(result.work, ignore_errors=True)
    rows = asdict(result)
    width = max(map(len, rows))
    for name, value in rows.items():
        print(f"{name:<{width}}  {value}")
    print(f"{'clean':<{width}}  {result.clean}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows | {"clean": result.clean}, indent=2) + "\n")
    print(f"JSON written to {out}")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
