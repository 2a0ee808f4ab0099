"""Floors: the store's own syscalls in bare loops, what dirmq's numbers are read against."""

from __future__ import annotations

import ctypes
import ctypes.util
import itertools
import os
import resource
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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


# == the durable publish floors: groups of durable creates in bare loops ========================
# How a group's files are made durable before they are linked into ready/ and how the links are
# made durable after (issue 37's floors; what each costs on a disk is in docs/benchmarks.md):
#   syncfs       one syncfs for the data (one fsync for a group of one), links, one fsync of
#                ready/: dirmq's writethrough group commit
#   syncfs2      one syncfs for the data, links, a second syncfs (not a directory fsync)
#   fsync-each   an fsync per file, one after another, links, one fsync of ready/
#   fdatasync-threads  an fdatasync per file, all at once from a thread each (concurrent
#                flushes a filesystem with a journal merges into one commit), links, fsync ready/
#   pipelined    one syncfs per group that flushes this group's data and the previous group's
#                links at once (a group's 201 then waits for the next group's flush)
#   named-1      named temps in tmp/, one syncfs (data, inodes and the temps' names), links into
#                ready/, answered: a crash before the links are durable leaves the temps, which a
#                recovery would have to link (a format change); the previous group's temps are
#                unlinked after the next syncfs
#   append       not a dirmq design: the group's bodies appended to one file and one fdatasync,
#                what Redis's `appendfsync always` does per event-loop iteration
#   journal      a per-process commit journal (a proposed format change, issue 37): the
#                group's files appended to one journal file as records and one fdatasync, then
#                per file an O_TMPFILE create, write and linkat into ready/ with no fsync of
#                file or directory; a checkpoint thread syncfs-es once a second (and truncates
#                the journal) while it runs
PUBLISH_FLUSHES = (
    "syncfs",
    "syncfs2",
    "fsync-each",
    "fdatasync-threads",
    "pipelined",
    "named-1",
    "append",
    "journal",
)
_flush_threads: list[ThreadPoolExecutor] = []


def _flush_pool() -> ThreadPoolExecutor:
    if not _flush_threads:
        _flush_threads.append(ThreadPoolExecutor(64, thread_name_prefix="floor-fdatasync"))
    return _flush_threads[0]


def _checked(code: int, what: str) -> None:
    if code != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _link_all(fds: list[int], ready: str, tag: str) -> None:
    for n, fd in enumerate(fds):
        target = f"{ready}/{tag}-{n}".encode()
        source = b"/proc/self/fd/%d" % fd
        _checked(_libc.linkat(_AT_FDCWD, source, _AT_FDCWD, target, _AT_SYMLINK_FOLLOW), "linkat")


def _durable_groups(
    directory: str, data: bytes, group: int, groups: int, worker: int, flush: str = "syncfs"
) -> None:
    """`groups` durable groups of `group` files, made durable as `flush` says (above)."""
    ready = os.path.join(directory, "ready")
    tmp = os.path.join(directory, "tmp")
    ready_fd = os.open(ready, os.O_RDONLY | os.O_DIRECTORY)
    appended = os.open(f"{directory}/append-{worker}", os.O_CREAT | os.O_WRONLY | os.O_APPEND)
    named: list[str] = []  # named-1: the previous group's temps, unlinked after the next flush
    try:
        for g in range(groups):
            tag = f"{worker}-{g}"
            if flush in ("append", "journal"):
                os.write(appended, data * group)
                os.fdatasync(appended)
                if flush == "append":
                    continue
            if flush == "named-1":
                previous, named = named, [f"{tmp}/{tag}-{n}" for n in range(group)]
                for path in named:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                    os.write(fd, data)
                    os.close(fd)
                _checked(_libc.syncfs(ready_fd), "syncfs")
                for n, path in enumerate(named):
                    os.link(path, f"{ready}/{tag}-{n}")
                for path in previous:
                    os.unlink(path)
                continue
            fds = []
            try:
                for _ in range(group):
                    fd = os.open(tmp, os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o644)
                    fds.append(fd)
                    os.write(fd, data)
                if flush == "journal":
                    pass  # durable in the journal already
                elif flush == "fsync-each":
                    for fd in fds:
                        os.fsync(fd)
                elif flush == "fdatasync-threads":
                    list(_flush_pool().map(os.fdatasync, fds))
                elif len(fds) == 1 and flush != "pipelined":
                    os.fsync(fds[0])
                else:
                    _checked(_libc.syncfs(fds[0]), "syncfs")
                _link_all(fds, ready, tag)
            finally:
                for fd in fds:
                    os.close(fd)
            if flush == "syncfs2":
                _checked(_libc.syncfs(ready_fd), "syncfs")
            elif flush not in ("pipelined", "journal"):
                os.fsync(ready_fd)
        if flush == "pipelined":  # the last group's links
            os.fsync(ready_fd)
        for path in named:
            os.unlink(path)
    finally:
        os.close(ready_fd)
        os.close(appended)


def _checkpoints(directory: str, lines: int, done: threading.Event) -> None:
    """The journal floor's checkpoint: once a second, a syncfs (every file linked before it is
    then durable), then the journals cut back (what the store does with a new segment)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        while not done.wait(1.0):
            _checked(_libc.syncfs(fd), "syncfs")
            for worker in range(lines):
                os.truncate(f"{directory}/append-{worker}", 0)
    finally:
        os.close(fd)


def publish_floor(
    parent: str,
    messages: int,
    publishers: int,
    lines: int = 1,
    body_bytes: int = 1024,
    flush: str = "syncfs",
) -> tuple[float, float]:
    """The durable publish floor on the servers' filesystem for `publishers` concurrent
    publishers, each with one message in flight: `lines` threads (the groups a server has in
    flight at once) each commit groups of `publishers // lines` files, `_durable_groups`' calls
    and nothing else (no HTTP, no index, no headers, no checksum); (messages/s, seconds).

    `lines=1` is today's arrangement of one queue (one group commits while the next gathers);
    `lines=2` shows what overlapping two groups' flushes would gain. `flush`: how a group is
    made durable (PUBLISH_FLUSHES). The files stay until the caller removes `parent` (a mass
    unlink here would slow the next trial's creates)."""
    if flush not in PUBLISH_FLUSHES:
        raise ValueError(f"flush must be one of {', '.join(PUBLISH_FLUSHES)}, not {flush!r}")
    directory = tempfile.mkdtemp(prefix="publish-floor-", dir=parent)
    for sub in ("ready", "tmp"):
        os.mkdir(os.path.join(directory, sub))
    data = b"Content-Length: %d\n\n" % body_bytes + b"x" * body_bytes  # about what dirmq writes
    group = max(1, publishers // lines)
    groups = max(1, messages // (group * lines))
    errors: list[BaseException] = []

    def work(worker: int) -> None:
        try:
            _durable_groups(directory, data, group, groups, worker, flush)
        except BaseException as exc:  # reported by the caller, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(lines)]
    done = threading.Event()
    if flush == "journal":
        threads.append(threading.Thread(target=_checkpoints, args=(directory, lines, done)))
    os.sync()  # as before every trial: no other writes in this one's flushes
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads[:lines]:
        thread.join()
    seconds = time.perf_counter() - began
    done.set()
    for thread in threads[lines:]:
        thread.join()
    if errors:
        raise errors[0]
    return group * groups * lines / seconds, seconds
