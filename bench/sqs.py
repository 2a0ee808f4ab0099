"""SQS API benchmark: boto3 against `dirmq serve` and against moto's server, in one run.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.sqs                    # full run, about 3 minutes
    .venv/bin/python -m bench.sqs --quick            # smoke run, under a minute
    .venv/bin/python -m bench.sqs --profile DIR      # also py-spy the dirmq server under load

It installs what it needs itself (`moto[server]`, and `py-spy` for --profile, with this
interpreter's pip), starts its own servers on free ports of 127.0.0.1 and stops exactly those,
by PID, at the end, even when a step fails:

- dirmq: `python -m dirmq serve` on a fresh root under /tmp (on disk), one worker, the default
  durability (writethrough: a sent message is fsynced, file and directory, before the answer);
- dirmq+sigv4: the same with `--sqs-credentials`, so every request's signature is verified;
- moto: `python -m moto.server` (in-memory, nothing written anywhere).

Every subject gets the same client code and concurrency: `--procs` client processes (this module
with `--child`), each with `--threads` threads, each thread with its own boto3 client (JSON
protocol, SigV4-signed, keep-alive, no retries). Phases, each on a fresh queue, in rounds; each
round runs the subjects in a rotating order:

    send            SendMessage, one 100-byte message per request
    receive+delete  ReceiveMessage (up to 10) then DeleteMessage per message, until the messages
                    of `send` are gone
    send batch      SendMessageBatch of 10
    receive+delete batch
                    ReceiveMessage (up to 10) then DeleteMessageBatch

Every loop stops at a message count or a time budget, whichever comes first. Reported: median
msg/s over the rounds, the cores each server and the clients used (from /proc), and dirmq's
ratio to moto (median of the per-round ratios). It prints a table and writes JSON (default
`bench/results/sqs.json`). The box has 2 vCPUs shared by clients and server, so the client
side's CPU is part of every number: see docs/benchmarks-sqs.md.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import HOST, REPO, RESULTS
from bench.harness.install import ensure_pip, py_spy_path
from bench.harness.procs import Processes, cpu_seconds, free_port
from bench.harness.report import machine_basics, version_of
from bench.harness.rounds import median
from bench.harness.servers import start_dirmq

DEFAULT_JSON = RESULTS / "sqs.json"
BODY = "x" * 100
KEY_ID, SECRET = "AKIDBENCH", "bench-secret"
PHASES = ("send", "consume", "send_batch", "consume_batch")
PHASE_LABELS = {
    "send": "send",
    "consume": "receive+delete",
    "send_batch": "send batch (10)",
    "consume_batch": "receive+delete batch (10)",
}
TIMES = "\u00d7"  # the multiplication sign, for the table


# -- the client side (child processes) ----------------------------------------------------------


def _client(endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, max_pool_connections=4),
    )


def _work(client: Any, phase: str, url: str, quota: int, deadline: float) -> tuple[int, int]:
    """One thread's loop; returns (messages, errors)."""
    done = errors = empty = 0
    while done < quota and time.monotonic() < deadline and errors < 100:
        try:
            if phase == "send":
                client.send_message(QueueUrl=url, MessageBody=BODY)
                done += 1
            elif phase == "send_batch":
                entries = [{"Id": str(i), "MessageBody": BODY} for i in range(10)]
                result = client.send_message_batch(QueueUrl=url, Entries=entries)
                done += len(result.get("Successful", []))
                errors += len(result.get("Failed", []))
            else:
                got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get(
                    "Messages", []
                )
                if not got:
                    empty += 1
                    if empty >= 3:  # drained (three empty answers in a row)
                        break
                    continue
                empty = 0
                if phase == "consume":
                    for message in got:
                        client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
                else:
                    entries = [
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(got)
                    ]
                    result = client.delete_message_batch(QueueUrl=url, Entries=entries)
                    errors += len(result.get("Failed", []))
                done += len(got)
        except Exception as exc:
            errors += 1
            if errors == 1:
                print(f"client error: {exc!r}"[:300], file=sys.stderr)
    return done, errors


def child_main(spec: dict[str, Any]) -> None:
    """`--child`: build the clients, say ready, wait for `go` on stdin, run, report JSON."""
    clients = [_client(spec["endpoint"]) for _ in range(spec["threads"])]
    for c in clients:  # first request untimed: connection set up, endpoint resolved
        c.get_queue_url(QueueName=spec["queue"])
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return
    results: list[tuple[int, int]] = [(0, 0)] * len(clients)
    cpu0 = time.process_time()
    start = time.time()
    deadline = time.monotonic() + spec["seconds"]

    def run(i: int) -> None:
        results[i] = _work(clients[i], spec["phase"], spec["url"], spec["quota"], deadline)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    end = time.time()
    report = {
        "messages": sum(r[0] for r in results),
        "errors": sum(r[1] for r in results),
        "start": start,
        "end": end,
        "cpu_s": time.process_time() - cpu0,
    }
    print(json.dumps(report), flush=True)


# -- servers --------------------------------------------------------------------------------------


@dataclass
class Server:
    """A server under test, started and stopped by PID through the run's `Processes`."""

    name: str
    url: str
    pid: int

    def cpu_s(self) -> float:
        return cpu_seconds([self.pid])


def start_sqs_dirmq(procs: Processes, name: str, root: Path, *extra: str) -> Server:
    server = start_dirmq(procs, str(root), 1, name, extra)
    return Server(name, f"http://{HOST}:{server.port}", server.proc.pid)


def start_moto(procs: Processes, logs: Path) -> Server:
    port = free_port()
    log = logs / "moto.log"
    with open(log, "wb") as out:
        proc = procs.start(
            [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Server("moto", f"http://{HOST}:{port}", proc.pid)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            _client(server.url).list_queues()
            return server
        except Exception:
            time.sleep(0.2)
    procs.stop(proc)
    raise RuntimeError(f"moto did not start: {log.read_text()[-2000:]}")


# -- the parent: phases, rounds, table ------------------------------------------------------------


@dataclass
class Trial:
    subject: str
    phase: str
    round: int
    messages: int
    errors: int
    seconds: float
    server_cores: float
    client_cores: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Run:
    args: dict[str, Any]
    machine: dict[str, Any]
    trials: list[Trial] = field(default_factory=list)
    profiles: dict[str, Any] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def run_phase(
    server: Server,
    phase: str,
    queue: str,
    url: str,
    args: argparse.Namespace,
    rnd: int,
    profile: Path | None = None,
) -> Trial:
    spec = {
        "endpoint": server.url,
        "queue": queue,
        "url": url,
        "phase": phase,
        "threads": args.threads,
        "seconds": args.seconds,
        "quota": args.messages // (args.procs * args.threads),
    }
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.sqs", "--child", json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        for _ in range(args.procs)
    ]
    spy: subprocess.Popen[bytes] | None = None
    try:
        for child in children:
            assert child.stdout is not None
            line = child.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"client process failed to start ({line!r})")
        if profile is not None:
            spy = subprocess.Popen(
                [
                    py_spy_path() or "py-spy",
                    "record",
                    "-p",
                    str(server.pid),
                    "-d",
                    str(int(args.seconds) + 10),
                    "-r",
                    "200",
                    "-f",
                    "raw",
                    "--idle",
                    "-o",
                    str(profile),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)
        cpu0 = server.cpu_s()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = []
        for child in children:
            out, _ = child.communicate(timeout=args.seconds + 60)
            reports.append(json.loads(out.strip().splitlines()[-1]))
        server_cpu = server.cpu_s() - cpu0
        if spy is not None and spy.poll() is None:
            spy.send_signal(signal.SIGINT)  # the phase is over: py-spy writes what it has
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
        if spy is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(args.seconds + 30)
            if spy.poll() is None:
                spy.kill()
                spy.wait()
    start = min(r["start"] for r in reports)
    seconds = max(r["end"] for r in reports) - start
    return Trial(
        subject=server.name,
        phase=phase,
        round=rnd,
        messages=sum(r["messages"] for r in reports),
        errors=sum(r["errors"] for r in reports),
        seconds=seconds,
        server_cores=server_cpu / seconds if seconds > 0 else 0.0,
        client_cores=sum(r["cpu_s"] for r in reports) / seconds if seconds > 0 else 0.0,
    )


def supports_batches(server: Server) -> str | None:
    """None if SendMessageBatch/DeleteMessageBatch work on this server, else why not."""
    client = _client(server.url)
    url = client.create_queue(QueueName="bench-probe")["QueueUrl"]
    try:
        sent = client.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": BODY}])
        if sent.get("Failed"):
            return f"SendMessageBatch failed: {sent['Failed']}"
        got = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
        client.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": "1", "ReceiptHandle": got[0]["ReceiptHandle"]}]
        )
    except Exception as exc:
        return repr(exc)[:200]
    return None


def busy_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Where the server's threads spent the phase, from py-spy's raw output (`--idle`, so
    waiting shows too). The event loop thread is idle when its leaf frame is `Runner.run` (it
    is inside uvloop's C code, waiting for sockets); a pool thread is idle when its leaf is
    `_worker` (waiting for a store call to run). The rest is work, or blocking in a syscall
    (fsync, syncfs, rename), which py-spy cannot tell apart: the leaf names it."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    busy = 0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [f for f in stack.split(";") if f]
            leaf = frames[-1]
            kind = "loop" if any(f.startswith("Runner.run") for f in frames) else "pool"
            idle = leaf.startswith(("Runner.run", "_worker ("))
            kinds[f"{kind}_{'idle' if idle else 'busy'}"] += count
            if idle:
                continue
            busy += count
            own[leaf] += count
            for frame in {
                f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] + ")"
                for f in frames
                if " (" in f
            }:
                inclusive[frame] += count

    def share(n: int) -> float:
        return round(100 * n / busy, 1) if busy else 0.0

    loop = kinds["loop_idle"] + kinds["loop_busy"]
    return {
        "busy_samples": busy,
        "event_loop_busy_pct": round(100 * kinds["loop_busy"] / loop, 1) if loop else 0.0,
        "pool_busy_samples": kinds["pool_busy"],
        "pool_idle_samples": kinds["pool_idle"],
        "self_pct_of_busy": [(f, share(n)) for f, n in own.most_common(top)],
        "inclusive_pct_of_busy": [(f, share(n)) for f, n in inclusive.most_common(top * 2)],
    }


def machine() -> dict[str, Any]:
    return machine_basics() | {"boto3": version_of("boto3"), "moto": version_of("moto")}


def report(result: Run) -> str:
    lines = [
        "| phase | subject | msg/s (median) | rounds | server cores | client cores | errors "
        "| vs moto |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    by = collections.defaultdict(list)
    for t in result.trials:
        by[(t.phase, t.subject)].append(t)
    subjects = ["dirmq", "dirmq+sigv4", "moto"]
    for phase in PHASES:
        for subject in subjects:
            trials = by.get((phase, subject))
            if not trials:
                continue
            rates = [t.rate for t in trials]
            ratio = "—"
            if subject != "moto":
                paired = []
                for t in trials:
                    moto = [m for m in by.get((phase, "moto"), []) if m.round == t.round]
                    if moto and moto[0].rate > 0:
                        paired.append(t.rate / moto[0].rate)
                if paired:
                    each = ", ".join(f"{p:.2f}" for p in paired)
                    ratio = f"**{median(paired):.2f}{TIMES}** ({each})"
            lines.append(
                f"| {PHASE_LABELS[phase]} | {subject} | {median(rates, 0.0):,.0f} | "
                f"{', '.join(f'{r:,.0f}' for r in rates)} | "
                f"{median([t.server_cores for t in trials], 0.0):.2f} | "
                f"{median([t.client_cores for t in trials], 0.0):.2f} | "
                f"{sum(t.errors for t in trials)} | {ratio} |"
            )
    return "\n".join(lines)


@contextlib.contextmanager
def servers(work: Path, logs: Path, names: list[str]) -> Iterator[list[Server]]:
    started: list[Server] = []
    procs = Processes()
    try:
        if "dirmq" in names:
            started.append(start_sqs_dirmq(procs, "dirmq", work / "root-plain"))
        if "dirmq+sigv4" in names:
            creds = work / "credentials"
            creds.write_text(f"# bench\n{KEY_ID} {SECRET}\n")
            started.append(
                start_sqs_dirmq(
                    procs, "dirmq+sigv4", work / "root-sigv4", "--sqs-credentials", str(creds)
                )
            )
        if "moto" in names:
            started.append(start_moto(procs, logs))
        yield started
    finally:
        procs.stop_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="1 round, short phases")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="time budget per phase")
    parser.add_argument("--messages", type=int, default=12_000, help="message budget per phase")
    parser.add_argument("--procs", type=int, default=2, help="client processes")
    parser.add_argument("--threads", type=int, default=4, help="threads per client process")
    parser.add_argument("--subjects", default="dirmq,dirmq+sigv4,moto", help="comma list")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma list")
    parser.add_argument("--profile", type=Path, help="py-spy the dirmq server into this dir")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    if args.child:
        child_main(json.loads(args.child))
        return 0
    if args.quick:
        args.rounds, args.seconds, args.messages = 1, 2.0, 4_000
    ensure_pip((("moto", "moto", "moto[server]"), ("flask", "flask", "moto[server]")))
    if args.profile:
        ensure_pip((("py_spy", "py-spy", "py-spy"),))
        args.profile.mkdir(parents=True, exist_ok=True)
    result = Run(args={k: str(v) for k, v in vars(args).items()}, machine=machine())
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dirmq-bench-sqs-", dir="/tmp") as tmp:
        work = Path(tmp)
        logs = work / "logs"
        logs.mkdir()
        with servers(work, logs, args.subjects.split(",")) as subjects:
            batch_ok = {s.name: supports_batches(s) for s in subjects}
            for name, why in batch_ok.items():
                if why:
                    result.skipped[name] = f"batch phases: {why}"
                    print(f"{name}: skipping the batch phases: {why}", flush=True)
            for rnd in range(args.rounds):
                order = subjects[rnd % len(subjects) :] + subjects[: rnd % len(subjects)]
                for server in order:
                    client = _client(server.url)
                    for kind in ("single", "batch"):
                        if kind == "batch" and batch_ok[server.name]:
                            continue
                        queue = f"bench-r{rnd}-{kind}"
                        url = client.create_queue(QueueName=queue)["QueueUrl"]
                        phases = ("send", "consume") if kind == "single" else PHASES[2:]
                        phases = tuple(p for p in phases if p in args.phases.split(","))
                        for phase in phases:
                            profile = None
                            if (
                                args.profile is not None
                                and server.name == "dirmq"
                                and rnd == args.rounds - 1
                            ):
                                profile = args.profile / f"sqs-{phase}.txt"
                            trial = run_phase(server, phase, queue, url, args, rnd, profile)
                            result.trials.append(trial)
                            print(
                                f"round {rnd + 1}/{args.rounds} {server.name:12} "
                                f"{PHASE_LABELS[phase]:26} {trial.rate:8,.0f} msg/s "
                                f"({trial.messages} in {trial.seconds:.2f} s, server "
                                f"{trial.server_cores:.2f} cores, clients "
                                f"{trial.client_cores:.2f}, errors {trial.errors})",
                                flush=True,
                            )
    if args.profile is not None:
        for phase in PHASES:
            path = args.profile / f"sqs-{phase}.txt"
            if path.exists():
                result.profiles[phase] = busy_profile(path)
    result.machine["seconds"] = round(time.monotonic() - started, 1)
    table = report(result)
    print()
    print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(result)
    data["table"] = table
    for trial in data["trials"]:
        trial["rate"] = trial["messages"] / trial["seconds"] if trial["seconds"] else 0.0
    args.json.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
