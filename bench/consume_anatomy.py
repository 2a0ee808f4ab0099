"""Where a consumed message's CPU goes in the store, as user and system time, one process, no HTTP.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python -m bench.consume_anatomy                 # 3 rounds of 20,000 messages
    .venv/bin/python -m bench.consume_anatomy --messages 5000 --rounds 1 --json /tmp/a.json

Four subjects drain the same kind of backlog (1 KiB bodies, published by `put_many`, so the
files are what a real queue holds), in rounds, in turn:

- **syscalls**: the per-message syscalls of a consumed message as dirmq makes them, in a bare
  loop: a rename into @leased, an open + read + close, a rename into a pool directory, then the
  blanking (lstat, open, pwrite of zeros, close), with inotify watching @ready and @leased and
  its events read (not decoded) every 50 messages;
- **design floor**: the least Python dirmq's design needs on top: a heap pop of the oldest id, the
  lease name, the renames, the read and its checksum, a `Message`, the index's dicts and lease
  heap, the blanking, and every inotify echo decoded and looked up, in batches of 50;
- **library, batches of 50**: `Queue.get(max_count=50)` + `Queue.ack_each`;
- **library, one at a time**: `Queue.get()` + `Queue.ack_each` of its one receipt.

User and system time come from `os.times()` around each drain (the fill is untimed). The table
gives medians over the rounds; the JSON (`bench/results/consume_anatomy.json`) every round.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import dirmq
from bench.harness import RESULTS
from dirmq.store import layout
from dirmq.store.codec import _BARE_HEAD_RE
from dirmq.store.message import Message
from dirmq.store.watch import _MASK, _libc, add_watch

BODY = b"x" * 1024
BATCH = 50
_EVENT = struct.Struct("iIII")
_ZEROS = bytes(65536)


def fill(root: str, name: str, count: int) -> str:
    """A fresh queue `name` holding `count` messages; its directory."""
    with dirmq.Store(root) as store:
        store.create_queue(name)
        queue = store.queue(name)
        for start in range(0, count, 500):
            queue.put_many([BODY] * min(500, count - start))
    return os.path.join(root, name)


def _inotify(directories: list[str]) -> int:
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise OSError("inotify_init1 failed")
    for directory in directories:
        add_watch(fd, directory, _MASK)
    return fd


def _blank(name: str, pool_fd: int) -> None:
    size = os.lstat(name, dir_fd=pool_fd).st_size
    fd = os.open(name, os.O_WRONLY, dir_fd=pool_fd)
    try:
        os.pwrite(fd, _ZEROS[:size], 0)
    finally:
        os.close(fd)


def drain_syscalls(queue_dir: str) -> int:
    ready, leased = f"{queue_dir}/{layout.READY}/", f"{queue_dir}/{layout.LEASED}/"
    pool = f"{queue_dir}/{layout.FREE}/anatomy-syscalls"
    os.mkdir(pool)
    names = sorted(os.listdir(ready))
    watch = _inotify([ready, leased])
    pool_fd = os.open(pool, os.O_RDONLY)
    try:
        for i, name in enumerate(names):
            lease = f"{name}.1.0"
            os.rename(ready + name, leased + lease)
            fd = os.open(leased + lease, os.O_RDONLY)
            try:
                os.read(fd, 65536)
            finally:
                os.close(fd)
            os.rename(leased + lease, f"{pool}/{name}")
            _blank(name, pool_fd)
            if i % BATCH == 0:
                _read_events(watch)
    finally:
        os.close(pool_fd)
        os.close(watch)
    return len(names)


def _read_events(watch: int) -> list[bytes]:
    chunks = []
    try:
        while chunk := os.read(watch, 65536):
            chunks.append(chunk)
            if len(chunk) < 4096:
                break
    except BlockingIOError:
        pass
    return chunks


def drain_design_floor(queue_dir: str) -> int:
    ready_dir, leased_dir = f"{queue_dir}/{layout.READY}/", f"{queue_dir}/{layout.LEASED}/"
    pool = f"{queue_dir}/{layout.FREE}/anatomy-floor"
    os.mkdir(pool)
    names = sorted(os.listdir(ready_dir))
    ready = {name: name for name in names}
    heap = list(names)
    heapq.heapify(heap)
    leased: dict[str, str] = {}
    deadlines: list[tuple[int, str, str]] = []
    watch = _inotify([ready_dir, leased_dir])
    pool_fd = os.open(pool, os.O_RDONLY)
    done = 0
    try:
        while heap:
            _take_echoes(watch, ready, leased)
            deadline = int(time.time() * 1000) + 30_000
            got = []
            while heap and len(got) < BATCH:
                message_id = heapq.heappop(heap)
                name = ready.pop(message_id)
                lease = f"{message_id}.1.{deadline}"
                os.rename(ready_dir + name, leased_dir + lease)
                leased[message_id] = lease
                heapq.heappush(deadlines, (deadline, message_id, lease))
                fd = os.open(leased_dir + lease, os.O_RDONLY)
                try:
                    data = os.read(fd, 65536)
                finally:
                    os.close(fd)
                head = _BARE_HEAD_RE.match(data)
                assert head is not None
                body = data[head.end() :]
                if int(head[1]) != len(body) or int(head[2], 16) != zlib.crc32(body):
                    raise RuntimeError(f"{name}: damaged")
                got.append(
                    Message(
                        id=message_id,
                        body=body,
                        headers={},
                        receive_count=1,
                        published_at_s=int(message_id[:16]) / 1e6,
                        receipt=f"{message_id}.1",
                        lease_deadline_s=deadline / 1000,
                        state="leased",
                    )
                )
            _take_echoes(watch, ready, leased)
            retired = []
            for message in got:
                message_id = (message.receipt or "").rpartition(".")[0]
                os.rename(leased_dir + leased.pop(message_id), f"{pool}/{message_id}")
                retired.append(message_id)
            for message_id in retired:
                _blank(message_id, pool_fd)
            done += len(got)
    finally:
        os.close(pool_fd)
        os.close(watch)
    return done


def _take_echoes(watch: int, ready: dict[str, str], leased: dict[str, str]) -> None:
    """Decode every pending event and look its name up, as an index takes in the echoes of its
    own renames (each a no-op)."""
    for data in _read_events(watch):
        offset = 0
        while offset < len(data):
            _wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
            offset += _EVENT.size
            name = data[offset : offset + length].rstrip(b"\0").decode()
            offset += length
            known = leased if mask & 0x80 else ready  # IN_MOVED_TO: the lease's directory
            known.get(name[: layout.ID_LENGTH])


def _drain_library(root: str, name: str, size: int) -> int:
    done = 0
    with dirmq.Store(root) as store:
        queue = store.queue(name)
        while got := queue.get(max_count=size):
            queue.ack_each([m.receipt or "" for m in got])
            done += len(got)
    return done


SUBJECTS: dict[str, Callable[[str, str], int]] = {
    "syscalls": lambda root, name: drain_syscalls(os.path.join(root, name)),
    "design floor": lambda root, name: drain_design_floor(os.path.join(root, name)),
    "library, batches of 50": lambda root, name: _drain_library(root, name, BATCH),
    "library, one at a time": lambda root, name: _drain_library(root, name, 1),
}


def measure(parent: str, subject: str, messages: int) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="consume-anatomy-", dir=parent)
    try:
        fill(root, "q", messages)
        before, began = os.times(), time.perf_counter()
        done = SUBJECTS[subject](root, "q")
        after, seconds = os.times(), time.perf_counter() - began
        if done != messages:
            raise RuntimeError(f"{subject}: drained {done} of {messages}")
        return {
            "user_us": (after.user - before.user) / done * 1e6,
            "system_us": (after.system - before.system) / done * 1e6,
            "per_s": done / seconds,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=20_000, help="backlog per drain")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the queues live")
    parser.add_argument("--json", default=str(RESULTS / "consume_anatomy.json"))
    args = parser.parse_args()
    if args.messages < 1 or args.rounds < 1:
        raise SystemExit("--messages and --rounds must be positive")
    rounds: dict[str, list[dict[str, float]]] = {s: [] for s in SUBJECTS}
    for number in range(args.rounds):
        for subject in SUBJECTS:
            result = measure(args.dir, subject, args.messages)
            rounds[subject].append(result)
            print(
                f"round {number + 1}: {subject:<24} user {result['user_us']:6.1f} µs  "
                f"system {result['system_us']:6.1f} µs  ({result['per_s']:,.0f} msg/s)",
                flush=True,
            )
    print(f"\n{'per consumed message (median)':<30} {'user µs':>8} {'system µs':>10}")
    medians = {}
    for subject, results in rounds.items():
        user = statistics.median(r["user_us"] for r in results)
        system = statistics.median(r["system_us"] for r in results)
        medians[subject] = {"user_us": round(user, 1), "system_us": round(system, 1)}
        print(f"{subject:<30} {user:>8.1f} {system:>10.1f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {"messages": args.messages, "rounds": rounds, "medians": medians, "dir": args.dir},
            indent=2,
        )
    )
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
