"""Soak: SIGKILL a real `dirmq serve` again and again under mixed load, then count what was lost.

    python -m tests.support.soak            (make soak)    SOAK_KILLS=100 by default

(`make soak` then runs tests/support/soak_gluster.py: the same kind of count on two GlusterFS
mounts.)

MAIN starts 3,000 deep, so that its backlog (messages behind @ready) is in play. Each cycle
starts the server on the same root, runs publishers (some with delays), consumers
(acks, nacks with and without delay, heartbeats, leases left to expire) and a purger of a second
queue against it for a random while, then SIGKILLs it mid-flight. One stretch of cycles runs with
the disk full (a ballast file takes every free block of the small filesystem), and the ballast
goes before the next cycle. At the end the root is drained with the library and checked:

- missing: publishes the server acknowledged (201) that were neither acknowledged by a consumer
  (nor possibly so: an ack whose answer was lost) nor found in the final drain;
- returned: deliveries whose ack the server confirmed that were delivered again;
- corrupt: files in any queue's @corrupt, and `dirmq fsck` problems.

All must be 0. The root is a small loop-mounted ext4 (else a tmpfs, else a plain directory with
no full-disk episode). It prints a table and writes JSON (default bench/results/soak.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import dirmq
from dirmq.client import RemoteStore
from dirmq.client.remote import RemoteQueue
from dirmq.errors import DirmqError, DiskFull, StaleReceipt
from dirmq.store import layout

from .servers import REPO, start_server
from .waiting import wait_until

DEFAULT_JSON = REPO / "bench" / "results" / "soak.json"
MAIN = "soak/main"
PURGED = "soak/purged"
VISIBILITY_S = 1.5  # the main queue's leases: short, so some expire during a cycle
MAX_DELAY_S = 1.0  # longest delay a publish or nack asks for
REQUEST_TIMEOUT_S = 10.0


@dataclass
class Ledger:
    """What the clients were told, by message body (each body is unique)."""

    published: set[bytes] = field(default_factory=set)  # 201 with an id
    acked: set[bytes] = field(default_factory=set)  # ack answered 204
    ack_in_doubt: set[bytes] = field(default_factory=set)  # ack sent, answer lost or 5xx
    returned: set[bytes] = field(default_factory=set)  # delivered again after a confirmed ack
    deliveries: int = 0
    publish_refused_full: int = 0  # DiskFull answers while the disk was full
    errors: dict[str, int] = field(default_factory=dict)
    first_errors: dict[str, str] = field(default_factory=dict)  # a message of each type
    lock: threading.Lock = field(default_factory=threading.Lock)

    def error(self, exc: Exception) -> None:
        with self.lock:
            name = type(exc).__name__
            self.errors[name] = self.errors.get(name, 0) + 1
            self.first_errors.setdefault(name, str(exc)[:200])

    def delivered(self, body: bytes) -> None:
        with self.lock:
            self.deliveries += 1
            if body in self.acked:
                self.returned.add(body)


@dataclass
class SoakResult:
    kills: int
    filesystem: str
    full_disk_cycles: int
    published: int
    acked: int
    ack_in_doubt: int
    deliveries: int
    publish_refused_full: int
    drained: int
    missing: int
    returned: int
    corrupt: int
    fsck_ok: bool
    fsck_problems: int
    errors: dict[str, int]
    first_errors: dict[str, str]
    seconds: float

    @property
    def clean(self) -> bool:
        return self.missing == 0 and self.returned == 0 and self.corrupt == 0 and self.fsck_ok


# -- the filesystem ------------------------------------------------------------------------------
@contextlib.contextmanager
def small_filesystem(base: Path, size_mib: int = 192) -> Iterator[tuple[Path, str]]:
    """A small filesystem of its own (so the disk can be filled without harm): (mount point,
    kind). Unmounted afterwards."""
    mount_point = base / "mnt"
    mount_point.mkdir()
    image = base / "disk.img"
    kind = "dir"
    with open(image, "wb") as f:
        f.truncate(size_mib * 1024 * 1024)
    mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-N", "100000", str(image)]
    if _run(mkfs) and _run(["mount", "-o", "loop", str(image), str(mount_point)]):
        kind = "ext4-loop"
    elif _run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount_point)]):
        kind = "tmpfs"
    image.unlink()  # the loop device holds it open; its blocks go with the unmount
    try:
        yield mount_point, kind
    finally:
        if kind != "dir":
            subprocess.run(["umount", "-l", str(mount_point)], check=False, capture_output=True)


def _run(args: list[str]) -> bool:
    try:
        return subprocess.run(args, check=False, capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


def fill_disk(path: Path) -> int:
    """Write `path` until the filesystem is full; bytes written."""
    written = 0
    with open(path, "wb", buffering=0) as f:
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 9):  # down to the last partial blocks
            chunk = bytes(size)
            with contextlib.suppress(OSError):
                while True:
                    written += f.write(chunk)
        with contextlib.suppress(OSError):
            os.fsync(f.fileno())
    return written


BACKLOG = 3_000  # messages in MAIN before the first cycle: more than @ready holds


# -- the load ----------------------------------------------------------------------------------
class Load:
    """Client threads against one server; stopped (and joined) before the server is killed
    and restarted, so each cycle's clients talk to one server."""

    def __init__(
        self, url: str, ledger: Ledger, rng: random.Random, cycle: int, disk_full: bool
    ) -> None:
        self.url = url
        # On a full disk every body is larger than a recycled file, so it needs new blocks.
        self.pads = [9000] if disk_full else [0, 0, 100, 3000, 9000]
        self.ledger = ledger
        self.stop = threading.Event()
        self.cycle = cycle
        seeds = [rng.randrange(1 << 30) for _ in range(6)]
        self.threads = [
            threading.Thread(target=self._publisher, args=(n, random.Random(seeds[n])))
            for n in range(3)
        ]
        self.threads += [
            threading.Thread(target=self._consumer, args=(random.Random(seeds[3 + n]),))
            for n in range(2)
        ]
        self.threads.append(threading.Thread(target=self._purger, args=(random.Random(seeds[5]),)))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=REQUEST_TIMEOUT_S * 3)

    def _publisher(self, n: int, rng: random.Random) -> None:
        ledger = self.ledger
        with RemoteStore(self.url, timeout_s=REQUEST_TIMEOUT_S) as store:
            queue = RemoteQueue(store, MAIN)  # not store.queue(): it asks the server
            for i in range(1_000_000):
                if self.stop.is_set():
                    return
                pad = b"." * rng.choice(self.pads)
                bodies = [
                    f"c{self.cycle}-p{n}-{i}-{k}".encode() + pad
                    for k in range(rng.choice([1, 1, 4]))
                ]
                delay = rng.choice([None, None, None, 0.2, MAX_DELAY_S])
                try:
                    if len(bodies) == 1:
                        ids = [queue.put(bodies[0], delay_s=delay)]
                    else:
                        ids = queue.put_many(bodies)
                except DiskFull:
                    with ledger.lock:
                        ledger.publish_refused_full += 1
                    time.sleep(0.05)
                    continue
                except DirmqError as exc:  # the server is gone (killed) or failing: in doubt
                    ledger.error(exc)
                    time.sleep(0.05)
                    continue
                assert len(ids) == len(bodies)
                with ledger.lock:
                    ledger.published.update(bodies)

    def _consumer(self, rng: random.Random) -> None:
        ledger = self.ledger
        with RemoteStore(self.url, timeout_s=REQUEST_TIMEOUT_S) as store:
            queue = RemoteQueue(store, MAIN)
            while not self.stop.is_set():
                try:
                    got = queue.get(rng.choice([1, 1, 5]), wait_s=0.2)
                except DirmqError as exc:
                    ledger.error(exc)
                    time.sleep(0.05)
                    continue
                for message in got:
                    ledger.delivered(message.body)
                    self._settle(queue, message, rng)

    def _settle(self, queue: RemoteQueue, message: dirmq.Message, rng: random.Random) -> None:
        ledger = self.ledger
        receipt = message.receipt or ""
        action = rng.choices(["ack", "nack", "nack-delay", "extend", "drop"], [70, 8, 8, 8, 6])[0]
        try:
            if action == "nack":
                queue.nack(receipt)
            elif action == "nack-delay":
                queue.nack(receipt, rng.uniform(0.05, MAX_DELAY_S))
            elif action == "extend":
                queue.extend(receipt, VISIBILITY_S * 2)
            if action in ("ack", "extend"):
                with ledger.lock:
                    ledger.ack_in_doubt.add(message.body)  # until the answer says otherwise
                queue.ack(receipt)
                with ledger.lock:
                    ledger.ack_in_doubt.discard(message.body)
                    ledger.acked.add(message.body)
        except StaleReceipt:  # the lease expired first: the message comes back, as it should
            with ledger.lock:
                ledger.ack_in_doubt.discard(message.body)
        except DirmqError as exc:
            ledger.error(exc)

    def _purger(self, rng: random.Random) -> None:
        with RemoteStore(self.url, timeout_s=REQUEST_TIMEOUT_S) as store:
            queue = RemoteQueue(store, PURGED)
            while not self.stop.is_set():
                try:
                    queue.put_many([b"to-purge"] * rng.randint(1, 20))
                    if rng.random() < 0.3:
                        queue.purge()
                except DirmqError as exc:
                    self.ledger.error(exc)
                self.stop.wait(0.05)


# -- the soak ---------------------------------------------------------------------------------


def run_soak(
    kills: int, workdir: Path, *, seed: int = 0, cycle_s: tuple[float, float] = (0.3, 1.5)
) -> SoakResult:
    rng = random.Random(seed)
    ledger = Ledger()
    started = time.monotonic()
    full_from = kills // 2  # the full-disk stretch: two cycles in the middle
    full_cycles = {k for k in range(full_from, full_from + 2) if 0 < k < kills}
    with small_filesystem(workdir) as (mount, kind):
        root = mount / "root"
        ballast = mount / "ballast"
        if kind == "dir":
            full_cycles = set()
        with dirmq.Store(root) as store:
            main = store.create_queue(MAIN, dirmq.QueueConfig(visibility_timeout_s=VISIBILITY_S))
            store.create_queue(PURGED)
            # A backlog from the start (docs/FORMAT.md, "The backlog"): publishes go behind
            # it, gets refill from it, and kills land in both.
            for start in range(0, BACKLOG, 500):
                bodies = [f"backlog-{i}".encode() for i in range(start, start + 500)]
                main.put_many(bodies)
                ledger.published.update(bodies)
        for cycle in range(kills):
            if cycle in full_cycles and not ballast.exists():
                fill_disk(ballast)
            server = start_server(root)
            try:
                refused_before = ledger.publish_refused_full
                with Load(server.url, ledger, rng, cycle, cycle in full_cycles):
                    time.sleep(rng.uniform(*cycle_s))
                    # A slow start must not skip what the cycle tests; if the queue never
                    # filled, the checks after the run say what that means.
                    if cycle in full_cycles:
                        with contextlib.suppress(AssertionError):
                            wait_until(
                                lambda n=refused_before: ledger.publish_refused_full > n, 20.0
                            )
                    server.proc.send_signal(signal.SIGKILL)  # mid-flight: clients still running
                    server.proc.wait(timeout=30)
            finally:
                server.stop(signal.SIGKILL)
            if cycle + 1 not in full_cycles and ballast.exists():
                ballast.unlink()
        with contextlib.suppress(FileNotFoundError):
            ballast.unlink()
        drained = drain(root, ledger)
        corrupt = count_corrupt(root)
        fsck = subprocess.run(
            [sys.executable, "-m", "dirmq", "fsck", "--root", str(root), "--json"],
            capture_output=True,
            text=True,
            check=False,
        )
    report = json.loads(fsck.stdout) if fsck.stdout.strip() else {"ok": False, "problems": ["?"]}
    consumed = ledger.acked | ledger.ack_in_doubt
    missing = ledger.published - consumed - drained
    return SoakResult(
        kills=kills,
        filesystem=kind,
        full_disk_cycles=len(full_cycles),
        published=len(ledger.published),
        acked=len(ledger.acked),
        ack_in_doubt=len(ledger.ack_in_doubt),
        deliveries=ledger.deliveries,
        publish_refused_full=ledger.publish_refused_full,
        drained=len(drained),
        missing=len(missing),
        returned=len(ledger.returned),
        corrupt=corrupt,
        fsck_ok=bool(report.get("ok")) and fsck.returncode == 0,
        fsck_problems=len(report.get("problems", [])),
        errors=dict(sorted(ledger.errors.items())),
        first_errors=dict(sorted(ledger.first_errors.items())),
        seconds=round(time.monotonic() - started, 1),
    )


def drain(root: Path, ledger: Ledger) -> set[bytes]:
    """Every message left in the main queue, once leases and delays have run out (the purged
    queue is purged); delivered messages are checked against confirmed acks."""
    time.sleep(max(VISIBILITY_S * 2, MAX_DELAY_S) + 0.5)  # the longest lease or delay given
    bodies: set[bytes] = set()
    with dirmq.Store(root, create=False) as store:
        main = store.queue(MAIN)
        main.sweep()
        while got := main.get(100, visibility_s=600):
            for message in got:
                ledger.delivered(message.body)
                bodies.add(message.body)
            main.ack_many(m.receipt or "" for m in got)
        stats = main.stats()
        assert stats.total == 0, f"the main queue did not drain: {stats}"
        store.queue(PURGED).purge()
    return bodies


def count_corrupt(root: Path) -> int:
    total = 0
    for dirpath, dirnames, _ in os.walk(root):
        if os.path.basename(dirpath) == layout.CORRUPT:
            total += len(os.listdir(dirpath))
            dirnames[:] = []
    return total


def print_table(result: SoakResult) -> None:
    rows = asdict(result)
    width = max(map(len, rows))
    for name, value in rows.items():
        print(f"{name:<{width}}  {value}")
    print(f"{'clean':<{width}}  {result.clean}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=int(os.environ.get("SOAK_KILLS", "100")))
    parser.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "0")))
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dirmq-soak-") as workdir:
        result = run_soak(args.kills, Path(workdir), seed=args.seed)
    print_table(result)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(asdict(result) | {"clean": result.clean}, indent=2) + "\n")
    print(f"JSON written to {out}")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
