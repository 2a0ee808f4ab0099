"""Pub/sub fan-out benchmark: dirmq `everyone` (and `anyone`) against Redis pub/sub and streams.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.pubsub                       # 1, 10 and 100 subscribers
    .venv/bin/python -m bench.pubsub --messages 200 --fanout 1,10 --json /tmp/out.json
    .venv/bin/python -m bench.pubsub --no-loop             # on a plain directory (see below)

It installs what it needs itself: Debian's `redis-server` (apt-get) when it is missing and the
`redis` package (pip, into this interpreter). Every process it starts (Redis servers on
127.0.0.1 and free ports, subscriber and publisher processes) it stops itself, by PID, even
when a step fails. It prints a table and writes JSON (default `bench/results/pubsub.json`).

One trial = one system, one fan-out N, a fixed number of messages M (100 B bodies):
- N subscriber processes (multiprocessing, forked: not GIL-bound) attach and say so; only then
  does one publisher process start and publish M messages back to back (one call, or one
  Redis round trip, per message); each subscriber stops after M messages or at the trial's
  deadline, whichever comes first.
- delivered/s = deliveries settled by all subscribers / (last settle - first publish), wall
  clock across processes. "Settled" is `done` for dirmq, XACK for Redis streams (each read
  of up to 100 entries is acked in one XACK, as streams are used), and receipt for Redis
  pub/sub, which has no acknowledgement.
- bytes written per message: the trial's filesystem (dirmq root, Redis's AOF) is an ext4 image
  loop-mounted for this run only (journaled, no lazy init), so the loop device's sectors
  written (/proc/diskstats) are this trial's and nobody else's: data, metadata, journal. Both
  ends of the window are a syncfs of that filesystem. Also reported: write_bytes of
  /proc/<pid>/io summed over the processes involved (misses the journal and metadata, which
  the kernel writes on nobody's account) and the logical bytes (dirmq: the size of the one
  message file, plus its one hard link into the pool or a log, whatever N; Redis streams: AOF
  growth).
  With --no-loop the trial runs in a directory under --dir and the device counter is the whole
  disk's, other processes' writes included: only an upper bound.

Systems: dirmq `everyone`, persistence writethrough; dirmq `anyone` (N=1 only); dirmq `future`
(the retained log, read by each subscription from its cursor: Redis streams' model); Redis pub/sub
(PUBLISH, N SUBSCRIBE connections); Redis streams (XADD; N consumer groups, one
XREADGROUP/XACK consumer each), `appendonly yes, appendfsync always`, so a delivery survives a
crash of the machine as dirmq's do. A fresh Redis server per trial, on the same filesystem.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from bench.harness import BODY, HOST, RESULTS
from bench.harness.install import ensure_pip, ensure_redis_server
from bench.harness.peers import start_redis
from bench.harness.procs import Processes, cpu_seconds
from bench.harness.report import machine_basics, version_of

DEFAULT_JSON = RESULTS / "pubsub.json"
CHANNEL = "bench"
IMAGE_BYTES = 4 << 30  # sparse: only what is written takes space
READ_BATCH = 100  # Redis streams: entries per XREADGROUP (and per XACK)
INOTIFY_SPARE = 16  # inotify instances left to the user's other programs
POLL_S = 1.0  # a worker looks at its deadline at least this often
CTX = mp.get_context("fork")  # the parent holds no threads or stores when it forks


# -- the filesystem under test, and counting what reaches its device ----------------------------
@dataclass
class Disk:
    path: str  # where trials put their files
    device: str  # its name in /proc/diskstats
    isolated: bool  # True: only this benchmark writes to `device`
    description: str
    image: str | None = None
    loop: str | None = None

    def written(self) -> int:
        """Bytes written to the device so far (sectors written x 512)."""
        with open("/proc/diskstats") as f:
            for line in f:
                fields = line.split()
                if fields[2] == self.device:
                    return int(fields[9]) * 512
        raise RuntimeError(f"{self.device} is not in /proc/diskstats")

    def sync(self) -> None:
        """Write out everything dirty on this filesystem (and only this one, when it can)."""
        from dirmq.store.fsio import syncfs

        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            syncfs(fd)
        finally:
            os.close(fd)


def _run(*args: str) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout.strip()


@contextlib.contextmanager
def loop_disk(base: str, journal: bool) -> Iterator[Disk]:
    """An ext4 on a loop device of our own, mounted for the run, then torn down."""
    work = tempfile.mkdtemp(prefix="dirmq-bench-pubsub-", dir=base)
    image, mount = os.path.join(work, "fs.img"), os.path.join(work, "mnt")
    os.mkdir(mount)
    loop = None
    mounted = False
    try:
        with open(image, "wb") as f:
            f.truncate(IMAGE_BYTES)
        # No lazy init: a background ext4lazyinit would write during the trials.
        features = [] if journal else ["-O", "^has_journal"]
        _run(
            "mkfs.ext4",
            "-q",
            "-F",
            *features,
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
            image,
        )
        loop = _run("losetup", "--find", "--show", image)
        _run("mount", "-t", "ext4", loop, mount)
        mounted = True
        device = os.path.basename(loop)
        kind = "with a journal" if journal else "without a journal"
        yield Disk(mount, device, True, f"ext4 {kind} on {loop} (image on {base})", image, loop)
    finally:
        if mounted:
            subprocess.run(["umount", mount], check=False, timeout=300)
        if loop is not None:
            subprocess.run(["losetup", "-d", loop], check=False, timeout=60)
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def plain_disk(base: str) -> Iterator[Disk]:
    work = tempfile.mkdtemp(prefix="dirmq-bench-pubsub-", dir=base)
    try:
        st = os.stat(work)
        sys_dev = f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        device = os.path.basename(os.path.realpath(sys_dev))
        yield Disk(work, device, False, f"{base} on {device}, shared with every other process")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def inotify_instances_free() -> int:
    """How many more inotify instances this user may open (each dirmq process holds one)."""
    with open("/proc/sys/fs/inotify/max_user_instances") as f:
        limit = int(f.read())
    used = 0
    uid = os.getuid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                    used += 1
        except OSError:
            continue
    return limit - used


def proc_io_written(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


# -- worker processes ----------------------------------------------------------------------------
@dataclass
class WorkerResult:
    role: str
    count: int = 0
    first_s: float = 0.0  # wall clock: first publish / first delivery
    last_s: float = 0.0  # wall clock: last publish / last settle
    write_bytes: int = 0  # /proc/self/io
    cpu_s: float = 0.0
    reached_min: int | None = None  # publishers: fewest subscribers a message reached
    error: str = ""


def _worker(body: Callable[[WorkerResult, Any], None], role: str, ready: Any, results: Any) -> None:
    """Run `body` with a result to fill; report it (and any error) on `results`."""
    result = WorkerResult(role)
    io0, cpu0 = proc_io_written(), time.process_time()
    try:
        body(result, ready)
    except BaseException as exc:  # reported, so the parent does not wait for nothing
        result.error = f"{type(exc).__name__}: {exc}"
    result.write_bytes = proc_io_written() - io0
    result.cpu_s = time.process_time() - cpu0
    results.put(asdict(result))


def _fewest(known: int | None, reached: int) -> int:
    return reached if known is None else min(known, reached)


def dirmq_subscriber(
    root: str, name: str, expected: int, deadline: float, ready: Any, results: Any
) -> None:
    def body(result: WorkerResult, ready: Any) -> None:
        from dirmq.pubsub import PubSub
        from dirmq.store import Store

        with Store(root, create=False) as store:
            sub = PubSub(store).subscribe(name, channels=[CHANNEL])
            ready.put(name)
            try:
                while result.count < expected and time.time() < deadline:
                    delivery = sub.receive(wait_s=POLL_S)
                    if delivery is None:
                        continue
                    if not result.count:
                        result.first_s = time.time()
                    sub.done(delivery)
                    result.count += 1
                    result.last_s = time.time()
            finally:
                sub.close()

    _worker(body, "subscriber", ready, results)


def dirmq_publisher(root: str, mode: str, messages: int, ready: Any, results: Any) -> None:
    def body(result: WorkerResult, _ready: Any) -> None:
        from dirmq.pubsub import PubSub
        from dirmq.store import Store

        with Store(root, create=False) as store:
            hub = PubSub(store)
            result.first_s = time.time()
            for _ in range(messages):
                published = hub.publish(
                    CHANNEL,
                    BODY,
                    mode=mode,
                    persistence="writethrough",
                    accept_timeout_s=3600.0,  # slow subscribers must not lose messages
                    process_timeout_s=300.0,
                )
                if published.subscribers is not None:
                    reached = published.subscribers
                    result.reached_min = _fewest(result.reached_min, reached)
                result.count += 1
            result.last_s = time.time()

    _worker(body, "publisher", ready, results)


def redis_pubsub_subscriber(
    port: int, expected: int, deadline: float, ready: Any, results: Any
) -> None:
    def body(result: WorkerResult, ready: Any) -> None:
        import redis

        client = redis.Redis(host=HOST, port=port)
        pubsub = client.pubsub()
        pubsub.subscribe(CHANNEL)
        confirmed = None
        while confirmed is None and time.time() < deadline:  # SUBSCRIBE answered: attached
            confirmed = pubsub.get_message(timeout=POLL_S)
        ready.put("sub")
        while result.count < expected and time.time() < deadline:
            message = pubsub.get_message(timeout=POLL_S)
            if message is None or message["type"] != "message":
                continue
            if not result.count:
                result.first_s = time.time()
            result.count += 1
            result.last_s = time.time()
        pubsub.close()

    _worker(body, "subscriber", ready, results)


def redis_publisher(port: int, kind: str, messages: int, ready: Any, results: Any) -> None:
    def body(result: WorkerResult, _ready: Any) -> None:
        import redis

        client = redis.Redis(host=HOST, port=port)
        result.first_s = time.time()
        for _ in range(messages):
            if kind == "pubsub":
                reached = int(client.publish(CHANNEL, BODY))
                result.reached_min = _fewest(result.reached_min, reached)
            else:
                client.xadd(CHANNEL, {"body": BODY})
            result.count += 1
        result.last_s = time.time()

    _worker(body, "publisher", ready, results)


def redis_stream_subscriber(
    port: int, group: str, expected: int, deadline: float, ready: Any, results: Any
) -> None:
    def body(result: WorkerResult, ready: Any) -> None:
        import redis

        client = redis.Redis(host=HOST, port=port)
        ready.put(group)
        while result.count < expected and time.time() < deadline:
            got = client.xreadgroup(
                group, "c", {CHANNEL: ">"}, count=READ_BATCH, block=int(POLL_S * 1000)
            )
            if not got:
                continue
            ids = [entry_id for _stream, entries in got for entry_id, _fields in entries]
            if not result.count:
                result.first_s = time.time()
            client.xack(CHANNEL, group, *ids)
            result.count += len(ids)
            result.last_s = time.time()

    _worker(body, "subscriber", ready, results)


# -- Redis servers of our own --------------------------------------------------------------------


@contextlib.contextmanager
def redis_server(directory: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The harness's Redis (AOF fsynced before each reply), never rewriting its AOF in the
    middle of a trial nor dropping a slow subscriber."""
    procs = Processes()
    extra = ["--auto-aof-rewrite-percentage", "0", "--client-output-buffer-limit", "pubsub 0 0 0"]
    try:
        redis = start_redis(procs, directory, "", [*extra, "--maxclients", "1000"])
        redis.client.close()
        yield redis.port, redis.proc
    finally:
        procs.stop_all()


def dir_bytes(path: str) -> int:
    total = 0
    for parent, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


# -- one trial -----------------------------------------------------------------------------------
@dataclass
class Trial:
    system: str
    fanout: int
    messages: int
    deliveries: int = 0
    seconds: float = 0.0
    delivered_per_s: float = 0.0
    messages_per_s: float = 0.0
    publish_per_s: float = 0.0
    device_bytes_per_msg: float = 0.0
    process_bytes_per_msg: float = 0.0
    logical_bytes_per_msg: float = 0.0
    links_per_msg: int = 0
    cpu_s: float = 0.0
    reached_min: int | None = None
    complete: bool = False
    errors: list[str] = field(default_factory=list)


class Workers:
    """The worker processes of one trial; whatever is still alive at the end is killed."""

    def __init__(self) -> None:
        self.procs: list[BaseProcess] = []
        self.ready = CTX.Queue()
        self.results = CTX.Queue()

    def start(self, target: Callable[..., None], *args: Any) -> None:
        proc = CTX.Process(target=target, args=(*args, self.ready, self.results), daemon=True)
        proc.start()
        self.procs.append(proc)

    def wait_ready(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for _ in range(count):
            self.ready.get(timeout=max(0.1, deadline - time.monotonic()))

    def collect(self, count: int, deadline: float) -> list[WorkerResult]:
        found: list[WorkerResult] = []
        for _ in range(count):
            try:
                data = self.results.get(timeout=max(0.1, deadline - time.time()))
            except Exception:  # queue.Empty: a worker hung past its deadline
                break
            found.append(WorkerResult(**data))
        return found

    def stop(self) -> None:
        for proc in self.procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()  # by PID: only our own children
                proc.join(timeout=10)
        self.ready.close()
        self.results.close()


def run_trial(
    system: str,
    fanout: int,
    messages: int,
    disk: Disk,
    timeout_s: float,
    index: int,
) -> Trial:
    trial = Trial(system, fanout, messages)
    work = os.path.join(disk.path, f"t{index:02d}-{system}-{fanout}")
    os.makedirs(work)
    workers = Workers()
    redis_proc: subprocess.Popen[bytes] | None = None
    stack = contextlib.ExitStack()
    try:
        deadline = time.time() + timeout_s
        expected = messages
        if system.startswith("dirmq"):
            from dirmq.store import Store

            Store(work).close()  # make the root (no threads survive into the forks)
            mode = system.split("-", 1)[1]
            for i in range(fanout):
                workers.start(dirmq_subscriber, work, f"s{i}", expected, deadline)
            publisher: tuple[Callable[..., None], tuple[Any, ...]] = (
                dirmq_publisher,
                (work, mode, messages),
            )
        else:
            port, redis_proc = stack.enter_context(redis_server(os.path.join(work, "redis")))
            if system == "redis-streams":
                import redis

                admin = redis.Redis(host=HOST, port=port)
                for i in range(fanout):
                    admin.xgroup_create(CHANNEL, f"g{i}", id="$", mkstream=True)
                admin.close()
                for i in range(fanout):
                    workers.start(redis_stream_subscriber, port, f"g{i}", expected, deadline)
                publisher = (redis_publisher, (port, "streams", messages))
            else:
                for _ in range(fanout):
                    workers.start(redis_pubsub_subscriber, port, expected, deadline)
                publisher = (redis_publisher, (port, "pubsub", messages))
        workers.wait_ready(fanout, timeout_s=min(120.0, timeout_s))
        disk.sync()
        device0 = disk.written()
        redis_io0 = proc_io_written(redis_proc.pid) if redis_proc else 0
        redis_cpu0 = cpu_seconds([redis_proc.pid]) if redis_proc else 0.0
        aof0 = dir_bytes(os.path.join(work, "redis")) if redis_proc else 0
        workers.start(publisher[0], *publisher[1])
        results = workers.collect(fanout + 1, deadline + 30)
        disk.sync()
        trial.device_bytes_per_msg = (disk.written() - device0) / messages
        process_bytes = sum(r.write_bytes for r in results)
        trial.cpu_s = sum(r.cpu_s for r in results)
        if redis_proc is not None:
            process_bytes += proc_io_written(redis_proc.pid) - redis_io0
            trial.cpu_s += cpu_seconds([redis_proc.pid]) - redis_cpu0
            if system == "redis-streams":
                aof = dir_bytes(os.path.join(work, "redis")) - aof0
                trial.logical_bytes_per_msg = aof / messages
        else:
            trial.logical_bytes_per_msg = message_file_bytes(work)
            trial.links_per_msg = 1  # into the pool or a log: subscriptions read positions
        trial.process_bytes_per_msg = process_bytes / messages
        subs = [r for r in results if r.role == "subscriber"]
        pubs = [r for r in results if r.role == "publisher"]
        trial.errors = [f"{r.role}: {r.error}" for r in results if r.error]
        trial.deliveries = sum(r.count for r in subs)
        trial.complete = (
            len(subs) == fanout and len(pubs) == 1 and trial.deliveries == fanout * messages
        )
        if pubs:
            pub = pubs[0]
            trial.reached_min = pub.reached_min
            trial.publish_per_s = pub.count / max(1e-9, pub.last_s - pub.first_s)
            last = max((r.last_s for r in subs), default=pub.last_s)
            trial.seconds = max(1e-9, last - pub.first_s)
            trial.delivered_per_s = trial.deliveries / trial.seconds
            trial.messages_per_s = trial.delivered_per_s / fanout
    finally:
        workers.stop()
        stack.close()
        shutil.rmtree(work, ignore_errors=True)
    return trial


def message_file_bytes(root: str) -> float:
    """Size of one pub/sub message file (they are all alike here)."""
    messages = os.path.join(root, "@pubsub", "messages")
    for name in os.listdir(messages):
        return float(os.stat(os.path.join(messages, name)).st_size)
    return 0.0


# -- the report ----------------------------------------------------------------------------------
def rate(value: float) -> str:
    return f"{value / 1000:.1f}k" if value >= 10_000 else f"{value:.0f}"


def print_table(trials: list[Trial]) -> list[dict[str, Any]]:
    """Print every trial with its ratios to Redis; return the ratios for the JSON."""
    by = {(t.system, t.fanout): t for t in trials}
    head = (
        f"{'system':<16} {'N':>3} {'msgs':>5} {'delivered/s':>11} {'msgs/s':>7} {'pub/s':>6} "
        f"{'disk B/msg':>10} {'proc B/msg':>10} {'logical B/msg':>13} {'cpu s':>6}  vs streams"
        "  vs pubsub"
    )
    print(head)
    print("-" * len(head))
    ratios: list[dict[str, Any]] = []
    for t in trials:
        vs: dict[str, str] = {}
        for other in ("redis-streams", "redis-pubsub"):
            ref = by.get((other, t.fanout))
            if ref is None or not t.system.startswith("dirmq") or not ref.delivered_per_s:
                vs[other] = ""
                continue
            speed = t.delivered_per_s / ref.delivered_per_s
            text = f"{speed:.2f}x"
            entry: dict[str, Any] = {"system": t.system, "vs": other, "fanout": t.fanout}
            entry["throughput_ratio"] = speed
            if ref.device_bytes_per_msg:
                disk = t.device_bytes_per_msg / ref.device_bytes_per_msg
                entry["disk_bytes_ratio"] = disk
                text += f" {disk:.1f}xB"
            ratios.append(entry)
            vs[other] = text
        logical = f"{t.logical_bytes_per_msg:.0f}" + (
            f" +{t.links_per_msg}L" if t.links_per_msg else ""
        )
        flag = "" if t.complete else "  INCOMPLETE"
        print(
            f"{t.system:<16} {t.fanout:>3} {t.messages:>5} {rate(t.delivered_per_s):>11} "
            f"{rate(t.messages_per_s):>7} {rate(t.publish_per_s):>6} "
            f"{t.device_bytes_per_msg:>10.0f} {t.process_bytes_per_msg:>10.0f} "
            f"{logical:>13} {t.cpu_s:>6.1f}  {vs['redis-streams']:<10}  "
            f"{vs['redis-pubsub']}{flag}"
        )
        for error in t.errors[:3]:
            print(f"    error: {error}")
    print(
        "\ndelivered/s: deliveries settled per second, first publish to last settle; msgs/s = "
        "that / N.\ndisk B/msg: bytes the filesystem's device wrote / messages published; "
        "proc B/msg: /proc/<pid>/io write_bytes; L = hard links.\nvs: dirmq's delivered/s "
        "over Redis's, and (xB) its disk bytes per message over Redis's."
    )
    return ratios


def machine(disk: Disk, redis_version: str) -> dict[str, Any]:
    return machine_basics() | {
        "redis_server": redis_version,
        "redis_py": version_of("redis"),
        "disk": disk.description,
        "disk_isolated": disk.isolated,
        "body_bytes": len(BODY),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=500, help="messages per trial")
    parser.add_argument("--fanout", default="1,10,100", help="subscriber counts (default 1,10,100)")
    parser.add_argument(
        "--systems",
        default="dirmq-everyone,dirmq-anyone,dirmq-future,redis-pubsub,redis-streams",
        help="which systems (dirmq-anyone runs with N=1 only)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per trial, at most")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the disk image goes")
    parser.add_argument(
        "--no-loop",
        action="store_true",
        help="use a plain directory under --dir (its device is shared: bytes are an upper bound)",
    )
    parser.add_argument(
        "--no-journal", action="store_true", help="make the loop-mounted ext4 without a journal"
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    args = parser.parse_args()
    fanouts = [int(n) for n in args.fanout.split(",")]
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    redis_version = ensure_redis_server()
    ensure_pip((("redis", "redis", "redis"),))
    trials: list[Trial] = []
    opened = plain_disk(args.dir) if args.no_loop else loop_disk(args.dir, not args.no_journal)
    with opened as disk:
        print(f"filesystem: {disk.description}", flush=True)
        info = machine(disk, redis_version)
        index = 0
        for fanout in fanouts:
            for system in systems:
                if system == "dirmq-anyone" and fanout != 1:
                    continue
                index += 1
                print(f"  {system} N={fanout} ...", end=" ", flush=True)
                spare = INOTIFY_SPARE + fanout + 1
                if system.startswith("dirmq") and inotify_instances_free() < spare:
                    # Taking the last of the user's inotify instances would break other
                    # programs of this user (the limit is per user, not per process tree).
                    print(f"skipped: fewer than {spare} inotify instances free")
                    trials.append(Trial(system, fanout, args.messages, errors=["skipped"]))
                    continue
                trial = run_trial(system, fanout, args.messages, disk, args.timeout, index)
                print(
                    f"{rate(trial.delivered_per_s)} delivered/s, "
                    f"{trial.device_bytes_per_msg:.0f} B/msg"
                    + ("" if trial.complete else f" (INCOMPLETE: {trial.deliveries})"),
                    flush=True,
                )
                trials.append(trial)
    print()
    ratios = print_table(trials)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": info,
        "messages": args.messages,
        "trials": [asdict(t) for t in trials],
        "ratios": ratios,
    }
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0 if all(t.complete for t in trials) else 1


if __name__ == "__main__":
    sys.exit(main())
