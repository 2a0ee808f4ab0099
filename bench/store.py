"""Storage-core benchmark: dirmq against raw syscalls and other directory and SQLite queues.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.store            # full run, a few minutes
    .venv/bin/python -m bench.store --quick    # smoke run, well under a minute

It installs the peers it compares with (vsqs 0.3 and watchdog, dirq, persist-queue, litequeue)
with pip if they are missing, prints a table and writes JSON (default `bench/results/store.json`).

The box is shared and noisy, so every measurement is repeated `REPEATS` times, interleaved with
the thing it is compared with, and reported as a median; the verdicts use ratios between subjects
measured in the same run, never absolute times. Every loop is bounded both in count and in time.

What is measured:
1. durable single put: `Queue.put` (writethrough) against the same syscalls in a bare loop;
2. `put_many` of 100 against single puts;
   1 and 2 twice: cold, into a queue nobody consumes (every message is a new inode), and in the
   steady state of a queue in use, where the previous burst is consumed and acked (untimed)
   before each timed burst, so puts recycle the retired files from this process's own pool in
   `@free/`; plus `put_many` recycling from the shared pool (acks made by another process);
3. publish and get+ack at 10k depth: dirmq, vsqs 0.3, dirq, persist-queue, litequeue;
4. get+ack at a 1M backlog against a 1k backlog, on tmpfs, in a fresh process each time
   (also the one-time index build and the RSS of the process holding the index);
5. concurrent durable puts from 8 threads (group commit) against 1 thread.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.harness import BODY, REPO, RESULTS, SHM
from bench.harness.install import ensure_pip
from bench.harness.report import Report, filesystem_of, machine_basics, print_summary
from bench.harness.rounds import rate_text, ratio
from dirmq import Durability, QueueConfig, Store
from dirmq.store import fsio
from dirmq.store.ownpool import release_own_pool, wait_reaped

REPEATS = 3
DEFAULT_JSON = RESULTS / "store.json"
SECTIONS = ("put", "threads", "depth", "backlog")
# (import name, distribution name, pip requirement)
PEERS: tuple[tuple[str, str, str], ...] = (
    ("watchdog", "watchdog", "watchdog"),
    ("vsqs", "vsqs", "vsqs==0.3"),
    ("dirq", "dirq", "dirq"),
    ("persistqueue", "persist-queue", "persist-queue"),
    ("litequeue", "litequeue", "litequeue"),
)
SQLITE_SYNC = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


@dataclass(frozen=True, slots=True)
class Sizes:
    put_ops: int  # single durable puts per trial
    put_budget_s: float
    many_calls: int  # put_many calls of `many_batch` per trial
    many_batch: int
    depth: int  # backlog at the start of each depth trial
    publish_ops: int
    get_ops: int
    slow_ops: int  # publish and get+ack ops for vsqs (O(N) per op)
    op_budget_s: float
    backlog: int  # the big tmpfs backlog
    small_backlog: int
    backlog_gets: int
    backlog_fill_budget_s: float
    threads: int
    thread_ops: int  # puts per thread per trial
    burst: int  # single-threaded ops per burst when interleaving subjects
    thread_burst: int  # ops per thread per burst


FULL = Sizes(
    put_ops=400,
    put_budget_s=10.0,
    many_calls=30,
    many_batch=100,
    depth=10_000,
    publish_ops=300,
    get_ops=3000,
    slow_ops=200,
    op_budget_s=10.0,
    backlog=1_000_000,
    small_backlog=1000,
    backlog_gets=20_000,
    backlog_fill_budget_s=600.0,
    threads=8,
    thread_ops=150,
    burst=20,
    thread_burst=10,
)
QUICK = Sizes(
    put_ops=60,
    put_budget_s=2.0,
    many_calls=5,
    many_batch=100,
    depth=2000,
    publish_ops=50,
    get_ops=300,
    slow_ops=40,
    op_budget_s=3.0,
    backlog=50_000,
    small_backlog=1000,
    backlog_gets=2000,
    backlog_fill_budget_s=60.0,
    threads=8,
    thread_ops=20,
    burst=10,
    thread_burst=5,
)


# -- peers -----------------------------------------------------------------------------------------
def ensure_peers() -> dict[str, str]:
    """Install each missing peer with this interpreter's pip; {distribution: version or note}."""
    return ensure_pip(PEERS)


# -- timing ----------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Trial:
    ops: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, float]:
        return {"ops": self.ops, "seconds": round(self.seconds, 6), "per_s": round(self.rate, 1)}


def run_bounded(op: Callable[[], int], count: int, budget_s: float) -> Trial:
    """Call `op` (which returns how many messages it handled) until `count` or `budget_s`."""
    done = 0
    start = time.perf_counter()
    deadline = start + budget_s
    while done < count and time.perf_counter() < deadline:
        done += op()
    return Trial(done, time.perf_counter() - start)


def run_threads(op: Callable[[], int], threads: int, per_thread: int, budget_s: float) -> Trial:
    """`threads` threads call `op` up to `per_thread` times each (or until `budget_s`)."""
    barrier = threading.Barrier(threads + 1)
    counts = [0] * threads
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        barrier.wait()
        deadline = time.perf_counter() + budget_s
        done = 0
        try:
            while done < per_thread and time.perf_counter() < deadline:
                done += op()
        except BaseException as exc:
            errors.append(exc)
        counts[slot] = done

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    barrier.wait()
    start = time.perf_counter()
    for w in workers:
        w.join(timeout=budget_s + 60)
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return Trial(sum(counts), elapsed)


def interleave(
    bursts: dict[str, Callable[[], Trial]], counts: dict[str, int], budget_s: float
) -> dict[str, Trial]:
    """One trial of several subjects side by side: a short burst of each in turn, summing ops and
    time per subject, until every subject has handled `counts[name]` messages or `budget_s` is
    spent. A slow patch of the shared disk then slows every subject alike."""
    ops = dict.fromkeys(bursts, 0)
    seconds = dict.fromkeys(bursts, 0.0)
    deadline = time.perf_counter() + budget_s
    while time.perf_counter() < deadline and any(ops[k] < counts[k] for k in bursts):
        for name, burst in bursts.items():
            trial = burst()
            ops[name] += trial.ops
            seconds[name] += trial.seconds
    return {k: Trial(ops[k], seconds[k]) for k in bursts}


def ratios_per_trial(trials: list[dict[str, Trial]], top: str, bottom: str) -> list[float]:
    return [round(ratio(t[top].rate, t[bottom].rate), 3) for t in trials]


def paired_ratio(trials: list[dict[str, Trial]], top: str, bottom: str) -> float:
    """Median over trials of top/bottom, each ratio taken within one interleaved trial."""
    return statistics.median(ratios_per_trial(trials, top, bottom)) if trials else 0.0


def median_rate(trials: list[Trial]) -> float:
    return statistics.median(t.rate for t in trials) if trials else 0.0


def series(trials: list[Trial]) -> dict[str, Any]:
    return {"median_per_s": round(median_rate(trials), 1), "trials": [t.to_json() for t in trials]}


# -- results ---------------------------------------------------------------------------------------


# -- 1, 2: durable put -----------------------------------------------------------------------------
class RawCreate:
    """The syscalls of one durable create, straight from Python: the floor dirmq is held to.

    open(O_CREAT|O_EXCL) a temp file, write 100 B, fsync it, rename it into the target directory,
    fsync that directory (whose fd stays open, so the loop has nothing dirmq could shave off).
    """

    def __init__(self, path: str) -> None:
        self.tmp = os.path.join(path, "tmp")
        self.dst = os.path.join(path, "new")
        os.makedirs(self.tmp)
        os.makedirs(self.dst)
        self.dir_fd = os.open(self.dst, os.O_RDONLY | os.O_DIRECTORY)
        self._names = itertools.count()
        # Seconds spent in each step, to tell which syscall dominates (single-threaded use only).
        self.spent = dict.fromkeys(("create", "write", "fsync", "rename", "fsync_dir"), 0.0)
        self.calls = 0

    def put(self) -> int:
        name = str(next(self._names))
        tmp = os.path.join(self.tmp, name)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, BODY)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, os.path.join(self.dst, name))
        os.fsync(self.dir_fd)
        return 1

    def put_timed(self) -> int:
        """`put`, timing each step into `spent`."""
        clock = time.perf_counter
        name = str(next(self._names))
        tmp = os.path.join(self.tmp, name)
        t0 = clock()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        t1 = clock()
        try:
            os.write(fd, BODY)
            t2 = clock()
            os.fsync(fd)
            t3 = clock()
        finally:
            os.close(fd)
        t4 = clock()
        os.rename(tmp, os.path.join(self.dst, name))
        t5 = clock()
        os.fsync(self.dir_fd)
        t6 = clock()
        steps = (t1 - t0, t2 - t1, t3 - t2, t5 - t4, t6 - t5)
        for key, seconds in zip(self.spent, steps, strict=True):
            self.spent[key] += seconds
        self.calls += 1
        return 1

    def breakdown_us(self) -> dict[str, float]:
        return {k: round(v / self.calls * 1e6, 1) for k, v in self.spent.items() if self.calls}

    def close(self) -> None:
        os.close(self.dir_fd)


class RecycledQueue:
    """A queue in use, for the steady-state puts: before each timed burst, what the previous
    burst published is consumed and acked untimed, so this process's own pool in `@free/` holds
    retired files and each timed put overwrites one in place instead of creating an inode.
    With `shared`, the acked files are then handed to the shared pool (untimed), as if another
    process had acked them, so each timed put claims one by a rename first.

    The acks leave dirty metadata (renames through `@leased/` into `@free/`) that the timed
    burst's own flush then writes, as it would with consumers acking alongside; what is still
    dirty after the burst is flushed untimed, so it is not charged to the next subject.
    """

    def __init__(
        self, store: Store, name: str, prefill: int, sync_fd: int, shared: bool = False
    ) -> None:
        self.queue = store.create_queue(name)
        self.ready_dir = os.path.join(self.queue.path, "@ready")
        self.sync_fd = sync_fd
        self.shared = shared
        # Fresh files, acked into the pool right away. Published through another Store: its
        # listing of the still empty shared pool must not make this queue's first look at it
        # wait (a fruitless listing of @free is repeated at most once a second).
        with Store(store.root) as other:
            other.queue(name).put_many([BODY] * prefill)
        self.drain()
        self.pool = self._inodes(os.path.join(self.queue.path, "@free"))
        self.seen: set[int] = set()  # inodes of every file the timed bursts published

    @staticmethod
    def _inodes(path: str) -> set[int]:
        """Inodes of the files under `path` (the pools are directories in @free)."""
        found: set[int] = set()
        with os.scandir(path) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    found |= RecycledQueue._inodes(entry.path)
                else:
                    found.add(entry.inode())
        return found

    def drain(self) -> int:
        """get(100) + ack_many until the queue is empty; returns how many were acked."""
        done = 0
        while got := self.queue.get(100, visibility_s=600):
            failed = self.queue.ack_many(m.receipt for m in got if m.receipt is not None)
            if failed:
                raise RuntimeError(f"ack failed: {next(iter(failed.values()))!r}")
            done += len(got)
        # The acks only renamed the files into this process's pool: its reaper blanks them,
        # and a put reuses only blanked files. Untimed, like the drain.
        if not wait_reaped(30):
            raise RuntimeError("the pool's reaper did not catch up within 30 s")
        if self.shared:
            release_own_pool(os.path.join(self.queue.path, "@free"))
        return done

    def burst(self, op: Callable[[], int], count: int, budget_s: float) -> Trial:
        self.drain()
        trial = run_bounded(op, count, budget_s)
        self.seen |= self._inodes(self.ready_dir)
        fsio.syncfs(self.sync_fd)
        return trial

    def fresh_inodes(self) -> int:
        """Files the timed bursts created rather than recycled (0 when the pool never ran dry)."""
        return len(self.seen - self.pool)


def bench_put(base: str, sizes: Sizes, report: Report) -> None:
    print("\n[1, 2] durable put (writethrough) and put_many: new files, then recycled", flush=True)
    raw = RawCreate(os.path.join(base, "raw-put"))
    store = Store(os.path.join(base, "dirmq-put"))
    sync_fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    queue = store.create_queue("put")
    batch = [BODY] * sizes.many_batch
    budget = sizes.put_budget_s
    prefill = 2 * max(sizes.many_batch, sizes.burst)
    warm_one = RecycledQueue(store, "put-recycled", prefill, sync_fd)
    warm_many = RecycledQueue(store, "put-many-recycled", prefill, sync_fd)
    shared_many = RecycledQueue(store, "put-many-shared", prefill, sync_fd, shared=True)

    def put_to(q: Any) -> Callable[[], int]:
        def single() -> int:
            q.put(BODY)
            return 1

        return single

    def put_many_to(q: Any) -> Callable[[], int]:
        def many() -> int:
            return len(q.put_many(batch))

        return many

    single, many = put_to(queue), put_many_to(queue)
    warm_single, warm_batch = put_to(warm_one.queue), put_many_to(warm_many.queue)
    shared_batch = put_many_to(shared_many.queue)
    # One burst of each in turn; names ending in "_warm" are the steady state (recycled files).
    bursts: dict[str, Callable[[], Trial]] = {
        "raw": lambda: run_bounded(raw.put_timed, sizes.burst, budget),
        "put": lambda: run_bounded(single, sizes.burst, budget),
        "put_many": lambda: run_bounded(many, sizes.many_batch, budget),
        "put_warm": lambda: warm_one.burst(warm_single, sizes.burst, budget),
        "put_many_warm": lambda: warm_many.burst(warm_batch, sizes.many_batch, budget),
        "put_many_shared": lambda: shared_many.burst(shared_batch, sizes.many_batch, budget),
    }
    singles, batches = sizes.put_ops, sizes.many_calls * sizes.many_batch
    counts = {"raw": singles, "put": singles, "put_many": batches}
    counts |= {"put_warm": singles, "put_many_warm": batches, "put_many_shared": batches}
    trials: list[dict[str, Trial]] = []
    try:
        single()  # warm-up: the first put creates the store's lazily made state
        for _ in range(REPEATS):
            trials.append(interleave(bursts, counts, budget * 2))
    finally:
        raw.close()
        store.close()
        os.close(sync_fd)
    by_name = {k: [t[k] for t in trials] for k in bursts}
    rate = {k: median_rate(v) for k, v in by_name.items()}
    put_ratio = paired_ratio(trials, "put", "raw")
    many_ratio = paired_ratio(trials, "put_many", "put")
    warm_put_raw = paired_ratio(trials, "put_warm", "raw")
    warm_put_cold = paired_ratio(trials, "put_warm", "put")
    warm_many_ratio = paired_ratio(trials, "put_many_warm", "put_warm")
    warm_many_cold = paired_ratio(trials, "put_many_warm", "put_many")
    shared_many_ratio = paired_ratio(trials, "put_many_shared", "put_warm")
    fresh = warm_one.fresh_inodes() + warm_many.fresh_inodes() + shared_many.fresh_inodes()
    steps = raw.breakdown_us()
    report.row("durable single put", "raw syscalls (Python)", rate_text(rate["raw"]), "new files")
    report.row(
        "  raw, us per step",
        "mean of all raw puts",
        f"{sum(steps.values()):,.0f} us",
        ", ".join(f"{k} {v:,.0f}" for k, v in steps.items()),
    )
    report.row(
        "durable single put",
        "dirmq put(), new files",
        rate_text(rate["put"]),
        f"cold: O_TMPFILE + fsync + link + dir fsync; {put_ratio:.2f}x raw (paired)",
    )
    report.row(
        "durable single put",
        "dirmq put(), recycled",
        rate_text(rate["put_warm"]),
        f"steady state: overwrite an own-pool file; {warm_put_raw:.2f}x raw, "
        f"{warm_put_cold:.2f}x cold put (paired)",
    )
    report.row(
        "durable put_many(100)",
        "dirmq, new files",
        rate_text(rate["put_many"]),
        f"cold: syncfs + 1 dir fsync; {many_ratio:.1f}x cold put (paired)",
    )
    report.row(
        "durable put_many(100)",
        "dirmq, recycled files",
        rate_text(rate["put_many_warm"]),
        f"steady state, own pool; {warm_many_ratio:.1f}x steady put, {warm_many_cold:.2f}x "
        f"cold put_many (paired); {fresh} inodes created",
    )
    report.row(
        "durable put_many(100)",
        "dirmq, shared pool",
        rate_text(rate["put_many_shared"]),
        f"steady state, acked by another process (claim rename each); "
        f"{shared_many_ratio:.1f}x steady put (paired)",
    )
    report.target(
        "put vs raw durable create", put_ratio, ">= 0.8", put_ratio >= 0.8, "new files, both"
    )
    report.target(
        "put_many(100) vs put, cold",
        many_ratio,
        ">= 10",
        many_ratio >= 10,
        "msgs/s, batch vs single, new files",
    )
    report.target(
        "put_many(100) vs put, steady state",
        warm_many_ratio,
        ">= 10",
        warm_many_ratio >= 10,
        "msgs/s, batch vs single, recycled files",
    )
    report.data["durable_put"] = {
        "raw": series(by_name["raw"]),
        "raw_step_us": steps,
        "dirmq_put": series(by_name["put"]),
        "dirmq_put_many": series(by_name["put_many"]) | {"batch": sizes.many_batch},
        "dirmq_put_recycled": series(by_name["put_warm"]),
        "dirmq_put_many_recycled": series(by_name["put_many_warm"]) | {"batch": sizes.many_batch},
        "dirmq_put_many_shared_pool": series(by_name["put_many_shared"])
        | {"batch": sizes.many_batch},
        "recycled_pool_prefill": prefill,
        "recycled_inodes_created": fresh,
        "ratio_put_vs_raw": round(put_ratio, 3),
        "ratio_put_many_vs_put": round(many_ratio, 2),
        "ratio_recycled_put_vs_raw": round(warm_put_raw, 3),
        "ratio_recycled_put_vs_put": round(warm_put_cold, 3),
        "ratio_recycled_put_many_vs_recycled_put": round(warm_many_ratio, 2),
        "ratio_recycled_put_many_vs_put_many": round(warm_many_cold, 3),
        "ratio_shared_pool_put_many_vs_recycled_put": round(shared_many_ratio, 2),
        "ratios_per_trial_put_vs_raw": ratios_per_trial(trials, "put", "raw"),
        "ratios_per_trial_put_many_vs_put": ratios_per_trial(trials, "put_many", "put"),
        "ratios_per_trial_recycled_put_many_vs_recycled_put": ratios_per_trial(
            trials, "put_many_warm", "put_warm"
        ),
        "ratios_per_trial_shared_pool_put_many_vs_recycled_put": ratios_per_trial(
            trials, "put_many_shared", "put_warm"
        ),
    }


# -- 3: queues at 10k depth ------------------------------------------------------------------------
class Subject:
    """One queue implementation under test. `fill` is fast and untimed; the rest is timed."""

    name = "?"
    slow = False  # O(N) per op: time only `Sizes.slow_ops` of them
    durability = "?"

    def fill(self, count: int) -> None:
        raise NotImplementedError

    def publish(self) -> int:
        raise NotImplementedError

    def get_ack(self) -> int:
        raise NotImplementedError

    def close(self) -> None:
        pass


class DirmqSubject(Subject):
    name = "dirmq"
    durability = (
        "writethrough: fsync file + dir before put returns; "
        "ack renames into @free while it holds < 1,024 files, else unlinks"
    )

    def __init__(self, path: str) -> None:
        self.store = Store(path)
        self.queue = self.store.create_queue("bench")

    def fill(self, count: int) -> None:
        for start in range(0, count, 1000):
            chunk = [BODY] * min(1000, count - start)
            self.queue.put_many(chunk, durability=Durability.MEMORY)

    def publish(self) -> int:
        self.queue.put(BODY)
        return 1

    def get_ack(self) -> int:
        message = self.queue.get_one(visibility_s=600)
        if message is None or message.receipt is None:
            raise RuntimeError("dirmq queue ran dry")
        self.queue.ack(message.receipt)
        return 1

    def close(self) -> None:
        self.store.close()


class VsqsSubject(Subject):
    name = "vsqs 0.3"
    slow = True
    durability = "fsync file, never the dir; every op lists the dir"

    def __init__(self, path: str) -> None:
        from vsqs.queue import QueueManager

        self.manager = QueueManager(path)
        self.queue = self.manager.get_queue("bench")
        # Older than any id publish() mints (its ids are the current time in microseconds).
        self._next_id = time.time_ns() // 1000 - 10**10

    def fill(self, count: int) -> None:
        # vsqs's own format (a file named by its integer id), written directly: filling through
        # publish() would list the whole directory per message, O(N^2).
        for _ in range(count):
            self._next_id += 1
            with open(os.path.join(self.queue.path, str(self._next_id)), "xb") as f:
                f.write(BODY)

    def publish(self) -> int:
        self.queue.publish(BODY)
        return 1

    def get_ack(self) -> int:
        message_id, _data = self.queue.receive(visibility_timeout=600, timeout=0.01)
        if message_id is None:
            raise RuntimeError("vsqs queue ran dry")
        self.queue.delete(message_id)
        return 1

    def close(self) -> None:
        self.queue.close()
        self.manager.close()
        self.manager.observer.join(timeout=5)


class DirqSubject(Subject):
    name = "dirq QueueSimple"
    durability = "no fsync at all (write, link, unlink)"

    def __init__(self, path: str) -> None:
        from dirq.QueueSimple import QueueSimple

        self.queue = QueueSimple(path)
        self._iterating = False

    def fill(self, count: int) -> None:
        for _ in range(count):
            self.queue.add(BODY)

    def publish(self) -> int:
        self.queue.add(BODY)
        return 1

    def get_ack(self) -> int:
        # dirq's consumer idiom: iterate names (cached per time bucket), lock, read, remove.
        for _pass in range(2):
            name = self.queue.next() if self._iterating else self.queue.first()
            self._iterating = True
            while name:
                if self.queue.lock(name):
                    self.queue.get(name)
                    self.queue.remove(name)
                    return 1
                name = self.queue.next()
            self._iterating = False
        raise RuntimeError("dirq queue ran dry")


def _sqlite_setting(conn: sqlite3.Connection) -> str:
    sync = conn.execute("PRAGMA synchronous").fetchone()[0]
    journal = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return f"SQLite journal={journal}, synchronous={SQLITE_SYNC.get(sync, sync)}"


class _FastFill:
    """Fill a SQLite-backed peer with synchronous=OFF, then restore its own setting."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.saved = conn.execute("PRAGMA synchronous").fetchone()[0]

    def __enter__(self) -> None:
        self.conn.execute("PRAGMA synchronous=OFF")

    def __exit__(self, *_exc: object) -> None:
        self.conn.execute(f"PRAGMA synchronous={int(self.saved)}")


class PersistQueueSubject(Subject):
    name = "persist-queue SQLiteAck"

    def __init__(self, path: str) -> None:
        from persistqueue import SQLiteAckQueue

        self.queue = SQLiteAckQueue(path, auto_resume=False)
        self.durability = _sqlite_setting(self.queue._putter) + "; a commit per op; ack = UPDATE"

    def fill(self, count: int) -> None:
        with _FastFill(self.queue._putter):
            for _ in range(count):
                self.queue.put(BODY)

    def publish(self) -> int:
        self.queue.put(BODY)
        return 1

    def get_ack(self) -> int:
        item = self.queue.get(block=False, raw=True)
        self.queue.ack(id=item["pqid"])
        return 1

    def close(self) -> None:
        self.queue.close()


class LiteQueueSubject(Subject):
    name = "litequeue"
    text = "x" * len(BODY)  # litequeue stores text

    def __init__(self, path: str) -> None:
        from litequeue import LiteQueue

        os.makedirs(path)
        self.queue = LiteQueue(os.path.join(path, "queue.sqlite3"))
        self.durability = _sqlite_setting(self.queue.conn) + "; a commit per op; done = UPDATE"

    def fill(self, count: int) -> None:
        with _FastFill(self.queue.conn):
            for _ in range(count):
                self.queue.put(self.text)

    def publish(self) -> int:
        self.queue.put(self.text)
        return 1

    def get_ack(self) -> int:
        message = self.queue.pop()
        if message is None:
            raise RuntimeError("litequeue ran dry")
        self.queue.done(message.message_id)
        return 1

    def close(self) -> None:
        self.queue.close()


SUBJECTS: tuple[tuple[str, type[Subject]], ...] = (
    ("dirmq", DirmqSubject),
    ("vsqs", VsqsSubject),
    ("dirq", DirqSubject),
    ("persist-queue", PersistQueueSubject),
    ("litequeue", LiteQueueSubject),
)


def bench_depth(base: str, sizes: Sizes, versions: dict[str, str], report: Report) -> None:
    print(f"\n[3] publish and get+ack at {sizes.depth:,} depth", flush=True)
    subjects: list[Subject] = []
    for dist, make in SUBJECTS:
        if dist != "dirmq" and versions.get(dist, "missing") == "missing":
            report.row("get+ack at depth", dist, "skipped", "not installable here")
            continue
        subjects.append(make(os.path.join(base, f"depth-{dist}")))
    depth = {s.name: 0 for s in subjects}
    publish: dict[str, list[Trial]] = {s.name: [] for s in subjects}
    gets: dict[str, list[Trial]] = {s.name: [] for s in subjects}
    try:
        for _round in range(REPEATS):
            for s in subjects:
                s.fill(sizes.depth - depth[s.name])
                depth[s.name] = sizes.depth
                os.sync()  # every subject starts from flushed files, so removals cost the same
                time.sleep(0.5)  # let vsqs's watchdog thread digest the fill's events
                depth[s.name] -= s.get_ack()  # untimed: builds indexes, drains inotify queues
                count = sizes.slow_ops if s.slow else sizes.publish_ops
                trial = run_bounded(s.publish, count, sizes.op_budget_s)
                depth[s.name] += trial.ops
                publish[s.name].append(trial)
                count = min(sizes.slow_ops if s.slow else sizes.get_ops, depth[s.name] - 1)
                trial = run_bounded(s.get_ack, count, sizes.op_budget_s)
                depth[s.name] -= trial.ops
                gets[s.name].append(trial)
    finally:
        for s in subjects:
            s.close()
    section: dict[str, Any] = {"depth": sizes.depth, "subjects": {}}
    dirmq_get = median_rate(gets["dirmq"])
    for s in subjects:
        pub_r, get_r = median_rate(publish[s.name]), median_rate(gets[s.name])
        report.row("publish at depth", s.name, rate_text(pub_r), s.durability)
        section["subjects"][s.name] = {
            "durability": s.durability,
            "publish": series(publish[s.name]),
            "get_ack": series(gets[s.name]),
            "dirmq_get_ack_ratio": round(ratio(dirmq_get, get_r), 2),
        }
    for s in subjects:
        get_r = median_rate(gets[s.name])
        note = "" if s.name == "dirmq" else f"dirmq is {ratio(dirmq_get, get_r):,.1f}x"
        report.row("get+ack at depth", s.name, rate_text(get_r), note)
    if "vsqs 0.3" in gets:
        # Paired per round (both measured within the same round), then the median.
        pairs = zip(gets["dirmq"], gets["vsqs 0.3"], strict=True)
        rounds = [{"dirmq": d, "vsqs": v} for d, v in pairs]
        vs = paired_ratio(rounds, "dirmq", "vsqs")
        section["ratios_per_round_dirmq_vs_vsqs"] = ratios_per_trial(rounds, "dirmq", "vsqs")
        report.target(
            f"get+ack at {sizes.depth:,} depth vs vsqs 0.3",
            vs,
            ">= 50",
            vs >= 50,
            "dirmq / vsqs msgs/s, paired per round",
        )
    report.data["depth"] = section


# -- 4: 1M backlog on tmpfs ------------------------------------------------------------------------
def rss_kib() -> dict[str, int]:
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def backlog_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs in a fresh process: open the queue, build the index, then time get+ack."""
    before = rss_kib()
    store = Store(spec["root"], create=False)
    queue = store.queue(spec["name"])
    start = time.perf_counter()
    first = queue.get_one(visibility_s=3600)
    assert first is not None and first.receipt is not None
    queue.ack(first.receipt)
    build_s = time.perf_counter() - start
    with_index = rss_kib()
    depth = queue.stats().ready
    refill_to: int = spec["refill_to"]
    latencies: list[float] = []
    deadline = time.perf_counter() + spec["budget_s"]
    clock = time.perf_counter
    while len(latencies) < spec["gets"] and clock() < deadline:
        if refill_to and queue.stats().ready <= refill_to // 2:
            missing = refill_to - queue.stats().ready
            queue.put_many([BODY] * missing, durability=Durability.MEMORY)
            queue.stats()  # drains the inotify events of the refill outside the timed part
        for _ in range(min(500, spec["gets"] - len(latencies))):
            t0 = clock()
            message = queue.get_one(visibility_s=3600)
            if message is None or message.receipt is None:
                raise RuntimeError("backlog queue ran dry")
            queue.ack(message.receipt)
            latencies.append(clock() - t0)
    start = time.perf_counter()
    names = len(os.listdir(os.path.join(queue.path, "@ready")))
    scan_s = time.perf_counter() - start
    store.close()
    latencies.sort()
    n = len(latencies)
    return {
        "depth_at_start": depth,
        "gets": n,
        "index_build_s": round(build_s, 4),
        "listdir_ready_s": round(scan_s, 4),
        "ready_names_after": names,
        "mean_us": round(sum(latencies) / n * 1e6, 2),
        "p50_us": round(latencies[n // 2] * 1e6, 2),
        "p99_us": round(latencies[min(n - 1, n * 99 // 100)] * 1e6, 2),
        "rss_kib_before_open": before.get("VmRSS", 0),
        "rss_kib_with_index": with_index.get("VmRSS", 0),
        "hwm_kib": rss_kib().get("VmHWM", 0),
    }


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.store", "--child-backlog", json.dumps(spec)]
    done = subprocess.run(
        command,
        check=True,
        capture_output=True,
        text=True,
        timeout=spec["budget_s"] + 600,
        cwd=REPO,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def fill_memory(queue: Any, count: int, budget_s: float) -> Trial:
    """Publish `count` messages without any flush, 10k per call (stops early past `budget_s`)."""
    left = [count]

    def chunk() -> int:
        n = min(10_000, left[0])
        left[0] -= n
        return len(queue.put_many([BODY] * n, durability=Durability.MEMORY))

    return run_bounded(chunk, count, budget_s)


def bench_backlog(sizes: Sizes, report: Report) -> None:
    print(f"\n[4] get+ack at a {sizes.backlog:,} backlog vs {sizes.small_backlog:,} (tmpfs)")
    if not os.path.isdir(SHM):
        report.row("backlog", "dirmq", "skipped", f"no {SHM}")
        return
    root = tempfile.mkdtemp(prefix="dirmq-bench-", dir=SHM)
    try:
        store = Store(root)
        config = QueueConfig(durability=Durability.MEMORY)
        big, small = store.create_queue("big", config), store.create_queue("small", config)
        fill = fill_memory(big, sizes.backlog, sizes.backlog_fill_budget_s)
        fill_memory(small, sizes.small_backlog, sizes.backlog_fill_budget_s)
        store.close()
        print(f"  filled {fill.ops:,} in {fill.seconds:.1f} s ({rate_text(fill.rate)})")
        runs: dict[str, list[dict[str, Any]]] = {"big": [], "small": []}
        for _round in range(REPEATS):
            for name, refill in (("big", 0), ("small", sizes.small_backlog)):
                spec = {
                    "root": root,
                    "name": name,
                    "gets": sizes.backlog_gets,
                    "refill_to": refill,
                    "budget_s": 120.0,
                }
                runs[name].append(run_child(spec))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(name: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[name]))

    big_us, small_us = med("big", "mean_us"), med("small", "mean_us")
    growth = ratio(big_us, small_us)
    rss_index = med("big", "rss_kib_with_index") / 1024
    rss_small = med("small", "rss_kib_with_index") / 1024
    report.row("fill (memory, put_many)", f"{fill.ops:,} msgs", rate_text(fill.rate), "tmpfs")
    report.row(
        "get+ack, big backlog",
        f"{fill.ops:,} msgs",
        f"{big_us:,.1f} us/op",
        f"p50 {med('big', 'p50_us'):.1f}, p99 {med('big', 'p99_us'):.1f} us",
    )
    report.row(
        "get+ack, small backlog",
        f"{sizes.small_backlog:,} msgs",
        f"{small_us:,.1f} us/op",
        f"p50 {med('small', 'p50_us'):.1f}, p99 {med('small', 'p99_us'):.1f} us",
    )
    report.row(
        "index build (first get)",
        f"{fill.ops:,} msgs",
        f"{med('big', 'index_build_s'):.2f} s",
        f"listdir alone {med('big', 'listdir_ready_s'):.2f} s",
    )
    report.row(
        "RSS holding the index",
        f"{fill.ops:,} msgs",
        f"{rss_index:,.0f} MiB",
        f"{rss_small:,.0f} MiB with a 1k index",
    )
    report.target(
        f"get at {fill.ops:,} backlog vs {sizes.small_backlog:,}",
        growth,
        "<= 2",
        growth <= 2,
        "mean get+ack time, big / small, index build excluded",
    )
    report.data["backlog"] = {
        "filesystem": SHM,
        "backlog": fill.ops,
        "fill": fill.to_json(),
        "small_backlog": sizes.small_backlog,
        "runs": runs,
        "median_mean_us_big": big_us,
        "median_mean_us_small": small_us,
        "ratio_big_vs_small": round(growth, 3),
    }


# -- 5: concurrent durable puts --------------------------------------------------------------------
def bench_threads(base: str, sizes: Sizes, report: Report) -> None:
    n = sizes.threads
    print(f"\n[5] durable puts from {n} threads vs 1", flush=True)
    store = Store(os.path.join(base, "dirmq-threads"))
    queue = store.create_queue("threads")
    raw = RawCreate(os.path.join(base, "raw-threads"))
    budget = sizes.put_budget_s

    def put() -> int:
        queue.put(BODY)
        return 1

    bursts: dict[str, Callable[[], Trial]] = {
        "one": lambda: run_threads(put, 1, sizes.burst, budget),
        "many": lambda: run_threads(put, n, sizes.thread_burst, budget),
        "raw_many": lambda: run_threads(raw.put, n, sizes.thread_burst, budget),
    }
    counts = {"one": sizes.thread_ops * 2, "many": sizes.thread_ops * n}
    counts["raw_many"] = counts["many"]
    trials: list[dict[str, Trial]] = []
    try:
        put()
        for _ in range(REPEATS):
            trials.append(interleave(bursts, counts, budget * 2))
    finally:
        raw.close()
        store.close()
    one, many, raw_many = ([t[k] for t in trials] for k in ("one", "many", "raw_many"))
    one_r, many_r, raw_r = median_rate(one), median_rate(many), median_rate(raw_many)
    scale = paired_ratio(trials, "many", "one")
    vs_raw = paired_ratio(trials, "many", "raw_many")
    report.row("concurrent durable put", "dirmq, 1 thread", rate_text(one_r))
    report.row(
        "concurrent durable put",
        f"dirmq, {n} threads",
        rate_text(many_r),
        f"{scale:.1f}x 1 thread (paired; group commit)",
    )
    report.row(
        "concurrent durable put",
        f"raw syscalls, {n} threads",
        rate_text(raw_r),
        f"dirmq is {vs_raw:.2f}x (paired)",
    )
    report.data["concurrent_put"] = {
        "threads": n,
        "dirmq_1_thread": series(one),
        "dirmq_n_threads": series(many),
        "raw_n_threads": series(raw_many),
        "ratio_n_vs_1": round(scale, 2),
        "ratio_dirmq_vs_raw_n_threads": round(vs_raw, 2),
        "ratios_per_trial_n_vs_1": ratios_per_trial(trials, "many", "one"),
    }


# -- driver ----------------------------------------------------------------------------------------


def machine(base: str, versions: dict[str, str]) -> dict[str, Any]:
    return machine_basics() | {
        "sqlite": sqlite3.sqlite_version,
        "peers": versions,
        "disk_dir": base,
        "disk_fs": filesystem_of(base),
        "tmpfs_fs": filesystem_of(SHM) if os.path.isdir(SHM) else "absent",
        "repeats": REPEATS,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small counts, for a smoke run")
    parser.add_argument("--dir", help="where disk-backed queues live (default: a temp dir in /tmp)")
    parser.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    parser.add_argument(
        "--only", default=",".join(SECTIONS), help=f"comma-separated subset of {SECTIONS}"
    )
    parser.add_argument("--child-backlog", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child_backlog:
        print(json.dumps(backlog_child(json.loads(args.child_backlog))))
        return 0
    sections = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = sections - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    sizes = QUICK if args.quick else FULL
    versions = ensure_peers()
    parent = args.dir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    base = tempfile.mkdtemp(prefix="dirmq-bench-", dir=parent)
    report = Report(widths=(26, 22, 18))
    report.data["machine"] = machine(base, versions)
    report.data["mode"] = "quick" if args.quick else "full"
    print(f"dirmq store benchmark ({report.data['mode']}); disk queues in {base}")
    print(f"  {report.data['machine']['disk_fs']}; peers: {versions}")
    started = time.perf_counter()
    try:
        if "put" in sections:
            bench_put(base, sizes, report)
        # Create-mostly sections first: on ext4 without a journal every create gets slower with
        # each inode freed in the last minutes, and the depth section frees thousands (the peers
        # unlink every acked message, dirmq the ones its full @free pool cannot take).
        if "threads" in sections:
            bench_threads(base, sizes, report)
        if "depth" in sections:
            bench_depth(base, sizes, versions, report)
        if "backlog" in sections:
            bench_backlog(sizes, report)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report.data["seconds"] = round(time.perf_counter() - started, 1)
    report.data["table"] = [list(r) for r in report.rows]
    report.data["targets"] = report.targets
    print_summary(report, f"medians of {REPEATS} runs")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report.data, indent=2) + "\n")
    print(f"\nwrote {out} ({report.data['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
