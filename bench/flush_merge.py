"""What sharing `syncfs` across processes would give durable publishing: a bare-loop experiment.

Run by hand from the project root (never collected by pytest):

    .venv/bin/python bench/flush_merge.py                 # on /tmp, ~90 s
    .venv/bin/python bench/flush_merge.py --dir /srv/q --seconds 5 --rounds 3

Each worker process loops over batches: per message an `O_TMPFILE` open and a write, then one
`syncfs` per batch, `linkat` of every file into place and one directory fsync (what one dirmq
worker's writethrough group commit asks of the filesystem). With `shared`, the processes share
the `syncfs`: under an `flock`, a process skips its own when one that started after its writes
has finished (a counter of calls started and finished, in a small file on /dev/shm). The
configurations alternate within each round; the table gives every round's rate, and JSON goes to
`bench/results/flush_merge.json`. Every loop stops after `--seconds`.

Finding (session 7, docs/benchmarks-http.md): with two processes the shared mode never skips a
`syncfs` (its syncfs/s equals the batches/s), since the other process's flush is always already
under way when a process finishes its writes; the differences between the modes are noise.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import fcntl
import json
import mmap
import multiprocessing
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "flush_merge.json"
DATA = b"Content-Length: 100\n\n" + b"x" * 100  # about what dirmq writes for a 100 B body
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_AT_FDCWD, _AT_SYMLINK_FOLLOW = -100, 0x400
CONFIGS = [(1, 64, False), (2, 32, False), (2, 32, True), (2, 16, False), (2, 16, True)]


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _shared_syncfs(fd: int, counters: mmap.mmap, lock_fd: int) -> bool:
    """syncfs unless one that started after this process's writes has finished meanwhile;
    True if this call ran one."""
    seen = struct.unpack_from("q", counters, 0)[0]  # calls started before our writes ended
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        started, finished = struct.unpack_from("qq", counters, 0)
        if finished > seen:
            return False
        struct.pack_into("q", counters, 0, started + 1)
        _check(_libc.syncfs(fd), "syncfs")
        struct.pack_into("q", counters, 8, started + 1)  # only a flush that succeeded counts
        return True
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)


def _worker(
    directory: str, batch: int, shared: bool, seconds: float, control: str, out: Any
) -> None:
    tmp, ready = os.path.join(directory, "tmp"), os.path.join(directory, "ready")
    lock_fd = os.open(control, os.O_RDWR)
    counters = mmap.mmap(lock_fd, 16)
    written = flushes = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        fds = []
        try:
            for _ in range(batch):
                fd = os.open(tmp, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                fds.append(fd)
                os.write(fd, DATA)
            if shared:
                flushes += _shared_syncfs(fds[0], counters, lock_fd)
            else:
                _check(_libc.syncfs(fds[0]), "syncfs")
                flushes += 1
            for fd in fds:
                target = f"{ready}/{os.getpid()}-{written}".encode()
                source = f"/proc/self/fd/{fd}".encode()
                _check(
                    _libc.linkat(_AT_FDCWD, source, _AT_FDCWD, target, _AT_SYMLINK_FOLLOW), "linkat"
                )
                written += 1
        finally:
            for fd in fds:
                os.close(fd)
        dir_fd = os.open(ready, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    counters.close()
    os.close(lock_fd)
    out.put((written, flushes))


def trial(where: str, processes: int, batch: int, shared: bool, seconds: float) -> dict[str, Any]:
    base = tempfile.mkdtemp(prefix="dirmq-flush-merge-", dir=where)
    with tempfile.NamedTemporaryFile(
        prefix="dirmq-flush-merge-", dir="/dev/shm", delete=False
    ) as f:
        f.write(b"\0" * 16)  # syncfs calls started, finished
        control = f.name
    try:
        os.makedirs(os.path.join(base, "tmp"))
        os.makedirs(os.path.join(base, "ready"))
        context = multiprocessing.get_context("spawn")
        out = context.Queue()
        workers = [
            context.Process(target=_worker, args=(base, batch, shared, seconds, control, out))
            for _ in range(processes)
        ]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        results = [out.get(timeout=seconds + 60) for _ in workers]
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - started
    finally:
        shutil.rmtree(base, ignore_errors=True)
        os.unlink(control)
    written = sum(r[0] for r in results)
    return {"msgs_per_s": written / elapsed, "syncfs_per_s": sum(r[1] for r in results) / elapsed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="filesystem under test")
    parser.add_argument("--seconds", type=float, default=8.0, help="per trial")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=str(DEFAULT_JSON))
    args = parser.parse_args(argv)
    rows: dict[str, list[dict[str, Any]]] = {}
    for n in range(args.rounds):
        for processes, batch, shared in CONFIGS:
            name = f"{processes} x {batch}, {'shared' if shared else 'separate'} syncfs"
            result = trial(args.dir, processes, batch, shared, args.seconds)
            rows.setdefault(name, []).append(result)
            print(f"  round {n + 1} {name}: {result['msgs_per_s']:,.0f} msg/s", flush=True)
    print(f"\n{'processes x batch, flushes':34} {'msg/s per round':>30} {'syncfs/s':>10}")
    for name, results in rows.items():
        rates = " / ".join(f"{r['msgs_per_s']:,.0f}" for r in results)
        flushes = results[-1]["syncfs_per_s"]
        print(f"{name:34} {rates:>30} {flushes:>10,.0f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"dir": args.dir, "seconds": args.seconds, "results": rows}, indent=2)
    )
    print(f"JSON written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
