"""Floors: the store's own syscalls in bare loops, what dirmq's numbers are read against."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import resource
import shutil
import tempfile
import time

from bench.harness import BODY
from bench.harness.load import Trial

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_AT_FDCWD, _AT_SYMLINK_FOLLOW, _AT_EMPTY_PATH = -100, 0x400, 0x1000


class RawPuts:
    """What a batch of puts asks of the filesystem, in a bare loop in this process, no HTTP: per
    message an `O_TMPFILE` open and a write, then `linkat` into place; when durable, one `syncfs`
    before the links and one directory fsync after them per batch (dirmq's writethrough group
    commit). Its rate is the most one core gets from these syscalls here; its CPU time says how
    much of that is the kernel's (e.g. inode allocation)."""

    def __init__(self, directory: str, durable: bool, batch: int = 64) -> None:
        self.tmp = os.path.join(directory, "tmp")
        self.ready = os.path.join(directory, "ready")
        os.makedirs(self.tmp, exist_ok=True)
        os.makedirs(self.ready, exist_ok=True)
        self.durable, self.batch = durable, batch
        self.names = itertools.count()
        self.data = b"Content-Length: 100\n\n" + BODY  # about what dirmq writes

    def _put_batch(self) -> int:
        fds = []
        try:
            for _ in range(self.batch):
                fd = os.open(self.tmp, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                fds.append(fd)
                os.write(fd, self.data)
            if self.durable and _libc.syncfs(fds[0]) != 0:
                raise OSError(ctypes.get_errno(), "syncfs")
            for fd in fds:
                target = os.path.join(self.ready, str(next(self.names))).encode()
                source = f"/proc/self/fd/{fd}".encode()
                if _libc.linkat(_AT_FDCWD, source, _AT_FDCWD, target, _AT_SYMLINK_FOLLOW) != 0:
                    raise OSError(ctypes.get_errno(), "linkat")
        finally:
            for fd in fds:
                os.close(fd)
        if self.durable:
            dir_fd = os.open(self.ready, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return self.batch

    def trial(self, count: int, budget_s: float) -> Trial:
        done = 0
        cpu0 = time.process_time()
        start = time.perf_counter()
        deadline = start + budget_s
        while done < count and time.perf_counter() < deadline:
            done += self._put_batch()
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        if not self.durable:  # on tmpfs, untimed: the next trial starts from an empty directory
            # (not on the disk: on ext4 without a journal, freed inodes slow later allocations)
            shutil.rmtree(self.ready)
            os.makedirs(self.ready)
        return Trial(done, elapsed, cpu, 0.0, {})


def inode_alloc_us(directory: str, count: int = 200) -> dict[str, float]:
    """Mean wall and system-CPU microseconds of one `O_TMPFILE` open (an inode allocation).

    Each probed inode is then linked into `directory` (untimed) and kept until the run ends: an
    inode freed here would be one more "recently deleted" inode for later allocations to skip,
    which is the very cost this measures."""
    os.makedirs(directory, exist_ok=True)
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    names = itertools.count(len(os.listdir(directory)))
    spent_s = spent_sys_s = 0.0
    try:
        for _ in range(count):
            usage0, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            fd = os.open(directory, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
            spent_s += time.perf_counter() - start
            spent_sys_s += resource.getrusage(resource.RUSAGE_SELF).ru_stime - usage0.ru_stime
            try:
                name = str(next(names)).encode()
                if _libc.linkat(fd, b"", dir_fd, name, _AT_EMPTY_PATH) != 0:
                    source = f"/proc/self/fd/{fd}".encode()
                    if _libc.linkat(_AT_FDCWD, source, dir_fd, name, _AT_SYMLINK_FOLLOW) != 0:
                        raise OSError(ctypes.get_errno(), "linkat")
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return {
        "wall_us": round(spent_s / count * 1e6, 1),
        "sys_us": round(spent_sys_s / count * 1e6, 1),
    }


# == the consume floor: a consumed message's syscalls in a bare loop ===========================
def _floor_share(directory: str, names: list[str], pool: str) -> None:
    """One process's share: what the store does for a leased, read and acknowledged message
    whose file is kept for reuse (a drain's acks), and nothing else."""
    ready, leased = os.path.join(directory, "ready"), os.path.join(directory, "leased")
    for name in names:
        os.rename(os.path.join(ready, name), os.path.join(leased, name))
        fd = os.open(os.path.join(leased, name), os.O_RDONLY)
        try:
            os.read(fd, 64 * 1024)
        finally:
            os.close(fd)
        os.rename(os.path.join(leased, name), os.path.join(pool, name))


def consume_floor(
    parent: str, messages: int, processes: int = 2, body_bytes: int = 1024
) -> tuple[float, float]:
    """The consume floor on the servers' filesystem: `messages` files of `body_bytes`, written
    untimed, then per message a rename into `leased/`, an open + read + close and a rename into
    a per-process pool directory, in `processes` processes (one per core, as dirmq's workers);
    (messages/s, seconds). No HTTP, no index, no lock: what no server on this disk beats."""
    import multiprocessing

    directory = tempfile.mkdtemp(prefix="consume-floor-", dir=parent)
    try:
        for sub in ("ready", "leased"):
            os.mkdir(os.path.join(directory, sub))
        body = b"x" * body_bytes
        names = [f"{i:012d}" for i in range(messages)]
        for name in names:
            with open(os.path.join(directory, "ready", name), "wb") as f:
                f.write(body)
        pools = []
        for n in range(processes):
            pools.append(os.path.join(directory, f"pool{n}"))
            os.mkdir(pools[-1])
        context = multiprocessing.get_context("fork")
        workers = [
            context.Process(target=_floor_share, args=(directory, names[n::processes], pools[n]))
            for n in range(processes)
        ]
        began = time.perf_counter()
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        seconds = time.perf_counter() - began
        if any(worker.exitcode for worker in workers):
            raise RuntimeError("a consume floor process failed")
        return messages / seconds, seconds
    finally:
        shutil.rmtree(directory, ignore_errors=True)
