"""Probes of what dirmq's store assumes of a filesystem, between two clients of one directory
(issue 19): run by hand as root from the project root, never collected by pytest.

    .venv/bin/python -m bench.gluster_probe         # sets up GlusterFS (tests/support/gluster.py)
    .venv/bin/python -m bench.gluster_probe --quick         # fewer trials, about a minute
    .venv/bin/python -m bench.gluster_probe --mounts A B    # two existing mounts of one volume

Each probe runs on three subjects: the GlusterFS volume, mounted twice (client A writes through
one mount, client B through the other: two mounts stand for two hosts), and for contrast the
local disk (`/tmp`, ext4 here) and `/dev/shm` (tmpfs), where A and B are the same directory.
It prints a table and writes JSON (default `bench/results/gluster_probe.json`).

What each probe asks (the store's assumptions: docs/FORMAT.md):
- rename-race: A and B rename the same file to different names at once (a claim: get, the
  shared pool of `@free/`). Exactly one may succeed, the other must get ENOENT.
- link-race, symlink-race, excl-race: A and B create the same name at once with `link`
  (small files, holds), `symlink` (capacity slots), `O_CREAT|O_EXCL`: exactly one EEXIST.
- create/rename/unlink seen: how long after A's create (rename, unlink) B's listing shows the
  new name (shows the new name and no longer the old one; no longer shows it), and how long a
  `stat` of the old name still succeeds on B; while A renames, do B's listings ever show both
  names or neither?
- reuse-read: B reads a file, A then overwrites it in place with other bytes of the same length
  and renames it (dirmq's `@free/` reuse), B opens the new name: how often, and how long, B reads
  the old bytes.
- mtime seen: A sets a file's mtime (a hold's heartbeat): how long until B's `stat` shows it.
- inotify: does B's inotify watch see A's create?
- O_TMPFILE + linkat (AT_EMPTY_PATH, /proc/self/fd), fsync/fdatasync/syncfs/directory fsync:
  supported, and the cost of each.
- ops: the cost of create+write 1 KiB+fsync+rename, rename, unlink, listdir of 1000 names.
- statvfs: what the store's space check sees.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import json
import os
import select
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench.harness import RESULTS

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_SYMLINK_FOLLOW = 0x400
_IN_CREATE, _IN_MOVED_TO = 0x100, 0x80

Result = dict[str, Any]


class Pair:
    """One directory seen by two clients: `a` and `b` are its paths through each."""

    def __init__(self, label: str, a: str, b: str) -> None:
        self.label, self.a, self.b = label, a, b
        self.cross = a != b  # False: one local directory, A and B are the same client

    def sub(self, name: str) -> Pair:
        os.mkdir(os.path.join(self.a, name))
        wait_until(lambda: os.path.isdir(os.path.join(self.b, name)), 10)
        return Pair(self.label, os.path.join(self.a, name), os.path.join(self.b, name))


def wait_until(condition: Callable[[], bool], timeout_s: float) -> float | None:
    """Seconds until `condition` holds (busy polling), None if it did not within `timeout_s`."""
    start = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            return None


def write_file(path: str, data: bytes, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def exists(path: str) -> bool:
    try:
        os.stat(path)
        return True
    except FileNotFoundError:
        return False


def missing(path: str) -> bool:
    return not exists(path)


def listed(directory: str, name: str) -> bool:
    return name in os.listdir(directory)


def unlisted(directory: str, name: str) -> bool:
    return name not in os.listdir(directory)


def renamed_in_listing(directory: str, old: str, new: str) -> bool:
    names = os.listdir(directory)
    return new in names and old not in names


def holds(path: str, data: bytes) -> bool:
    return read_file(path) == data


def mtime_is(path: str, stamp: int) -> bool:
    return int(os.stat(path).st_mtime) == stamp


def race(first: Callable[[], None], second: Callable[[], None]) -> tuple[str, str]:
    """Runs both at once (threads released by one barrier); each outcome: "ok" or an errno name."""
    barrier = threading.Barrier(2)
    outcomes = ["", ""]

    def run(i: int, action: Callable[[], None]) -> None:
        barrier.wait()
        try:
            action()
            outcomes[i] = "ok"
        except OSError as exc:
            outcomes[i] = errno.errorcode.get(exc.errno or 0, str(exc.errno))

    threads = [threading.Thread(target=run, args=(i, f)) for i, f in enumerate((first, second))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes[0], outcomes[1]


def tally(outcomes: list[tuple[str, str]], good: set[str]) -> Result:
    counts: dict[str, int] = {}
    for pair in outcomes:
        key = "+".join(sorted(pair))
        counts[key] = counts.get(key, 0) + 1
    wrong = sum(n for k, n in counts.items() if k not in good)
    return {"trials": len(outcomes), "outcomes": counts, "wrong": wrong}


# --- exclusivity ---------------------------------------------------------------------------


def probe_rename_race(p: Pair, trials: int) -> Result:
    d = p.sub("rename-race")
    outcomes, both_targets = [], 0
    for i in range(trials):
        write_file(os.path.join(d.a, f"s{i}"), b"x" * 100)
        wait_until(partial(exists, os.path.join(d.b, f"s{i}")), 5)
        ta, tb = os.path.join(d.a, f"ta{i}"), os.path.join(d.b, f"tb{i}")
        out = race(
            partial(os.rename, os.path.join(d.a, f"s{i}"), ta),
            partial(os.rename, os.path.join(d.b, f"s{i}"), tb),
        )
        outcomes.append(out)
        names = set(os.listdir(d.a)) & {f"ta{i}", f"tb{i}", f"s{i}"}
        if len(names) > 1:
            both_targets += 1
    result = tally(outcomes, {"ENOENT+ok"})
    result["names_after_gt_1"] = both_targets
    return result


def probe_create_race(p: Pair, trials: int, kind: str) -> Result:
    d = p.sub(f"{kind}-race")
    outcomes, disagree = [], 0
    samples: list[str] = []
    for i in range(trials):
        target_a, target_b = os.path.join(d.a, f"t{i}"), os.path.join(d.b, f"t{i}")
        if kind == "link":
            write_file(os.path.join(d.a, f"sa{i}"), b"A")
            write_file(os.path.join(d.b, f"sb{i}"), b"B")
            wait_until(partial(exists, os.path.join(d.a, f"sb{i}")), 5)
            out = race(
                partial(os.link, os.path.join(d.a, f"sa{i}"), target_a),
                partial(os.link, os.path.join(d.b, f"sb{i}"), target_b),
            )
        elif kind == "symlink":
            out = race(partial(os.symlink, "A", target_a), partial(os.symlink, "B", target_b))
        else:
            out = race(partial(write_excl, target_a, b"A"), partial(write_excl, target_b, b"B"))
        outcomes.append(out)
        winner = "A" if out[0] == "ok" else "B"
        time.sleep(0.0)
        seen = (
            (os.readlink(target_a), os.readlink(target_b))
            if kind == "symlink"
            else (read_file(target_a), read_file(target_b))
        )
        if out.count("ok") == 1 and {s if isinstance(s, str) else s.decode() for s in seen} != {
            winner
        }:
            disagree += 1
            if len(samples) < 3:
                samples.append(repr(seen))
    result = tally(outcomes, {"EEXIST+ok"})
    result["content_not_winners"] = disagree
    if samples:
        result["not_winners_seen"] = "; ".join(samples)
    return result


def write_excl(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


# --- visibility ----------------------------------------------------------------------------


def probe_visibility(p: Pair, trials: int) -> Result:
    """Delays (ms) until B sees A's create, rename and unlink, in listings and by stat."""
    d = p.sub("visibility")
    create_list, rename_list, rename_stat_old, unlink_list, unlink_stat = [], [], [], [], []
    timeout = 5.0
    for i in range(trials):
        name, new = f"f{i}", f"g{i}"
        write_file(os.path.join(d.a, name), b"x")
        create_list.append(wait_until(partial(listed, d.b, name), timeout))
        exists(os.path.join(d.b, name))  # B has now looked the name up (its dentry is cached)
        os.rename(os.path.join(d.a, name), os.path.join(d.a, new))
        t0 = time.monotonic()
        rename_list.append(wait_until(partial(renamed_in_listing, d.b, name, new), timeout))
        gone = wait_until(partial(missing, os.path.join(d.b, name)), timeout)
        rename_stat_old.append(None if gone is None else time.monotonic() - t0)
        exists(os.path.join(d.b, new))
        os.unlink(os.path.join(d.a, new))
        t0 = time.monotonic()
        unlink_list.append(wait_until(partial(unlisted, d.b, new), timeout))
        gone = wait_until(partial(missing, os.path.join(d.b, new)), timeout)
        unlink_stat.append(None if gone is None else time.monotonic() - t0)
    return {
        "create_listing_ms": stats(create_list),
        "rename_listing_ms": stats(rename_list),
        "rename_old_name_stat_ms": stats(rename_stat_old),
        "unlink_listing_ms": stats(unlink_list),
        "unlink_stat_ms": stats(unlink_stat),
    }


def probe_stale_name(p: Pair, trials: int) -> Result:
    """B has looked a name up; A renames the file away; B at once renames (opens, unlinks) the
    old name. On one filesystem each must fail with ENOENT: B acting on a name that is gone
    is a second claim of one message."""
    d = p.sub("stale-name")
    counts = {"rename": 0, "open": 0, "unlink": 0}

    def attempt(i: int, action: str) -> bool:
        old_b = os.path.join(d.b, f"{action}{i}")
        write_file(os.path.join(d.a, f"{action}{i}"), b"x")
        wait_until(lambda: exists(old_b), 5)  # B has the name in its dentry cache
        os.rename(os.path.join(d.a, f"{action}{i}"), os.path.join(d.a, f"{action}{i}.a"))
        try:
            if action == "rename":
                os.rename(old_b, os.path.join(d.b, f"{action}{i}.b"))
            elif action == "open":
                os.close(os.open(old_b, os.O_RDONLY))
            else:
                os.unlink(old_b)
            return True
        except FileNotFoundError:
            return False

    for i in range(trials):
        for action in counts:
            counts[action] += attempt(i, action)
    names = set(os.listdir(d.a))
    return {
        "trials": trials,
        "b_rename_of_gone_name_ok": counts["rename"],
        "both_targets_exist": sum(
            1 for i in range(trials) if {f"rename{i}.a", f"rename{i}.b"} <= names
        ),
        "b_open_of_gone_name_ok": counts["open"],
        "b_unlink_of_gone_name_ok": counts["unlink"],
        "a_target_lost_by_b_unlink": sum(1 for i in range(trials) if f"unlink{i}.a" not in names),
    }


def probe_rename_atomic_view(p: Pair, seconds: float, same_client: bool = False) -> Result:
    """A renames one file back and forth between two names; B (or A itself) lists the directory
    meanwhile."""
    d = p.sub("atomic-view-same" if same_client else "atomic-view")
    if same_client:
        d = Pair(d.label, d.a, d.a)
    write_file(os.path.join(d.a, "x"), b"x")
    wait_until(lambda: exists(os.path.join(d.b, "x")), 5)
    stop = threading.Event()
    renames = [0]

    def flip() -> None:
        names = ("x", "y")
        while not stop.is_set():
            src, dst = names[renames[0] % 2], names[(renames[0] + 1) % 2]
            os.rename(os.path.join(d.a, src), os.path.join(d.a, dst))
            renames[0] += 1

    counts = {"one": 0, "both": 0, "neither": 0}
    flipper = threading.Thread(target=flip)
    flipper.start()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen = {"x", "y"} & set(os.listdir(d.b))
        counts[{0: "neither", 1: "one", 2: "both"}[len(seen)]] += 1
    stop.set()
    flipper.join()
    return {"renames": renames[0], "listings": counts}


def probe_reuse_read(p: Pair, trials: int) -> Result:
    """dirmq's `@free/` reuse between clients: B has read a file; A overwrites it in place with
    other bytes of the same length and renames it; B opens it by the new name at once."""
    d = p.sub("reuse")
    size = 4096
    stale_first, stale_ms, never = 0, [], 0
    stale_fd_first = 0
    for i in range(trials):
        old, new = bytes([65 + i % 26]) * size, bytes([97 + i % 26]) * size
        write_file(os.path.join(d.a, f"m{i}"), old, sync=True)
        wait_until(partial(exists, os.path.join(d.b, f"m{i}")), 5)
        assert read_file(os.path.join(d.b, f"m{i}")) == old  # B's page cache holds the old bytes
        held = os.open(os.path.join(d.b, f"m{i}"), os.O_RDONLY)
        # A: overwrite in place (no truncate), flush, rename to a new name (a new message id)
        fd = os.open(os.path.join(d.a, f"m{i}"), os.O_WRONLY)
        os.write(fd, new)
        os.fsync(fd)
        os.close(fd)
        os.rename(os.path.join(d.a, f"m{i}"), os.path.join(d.a, f"n{i}"))
        t0 = time.monotonic()
        if os.pread(held, size, 0) != new:
            stale_fd_first += 1
        got = None
        while got is None and time.monotonic() - t0 < 5:
            with contextlib.suppress(FileNotFoundError):
                got = read_file(os.path.join(d.b, f"n{i}"))
        if got != new:
            stale_first += 1
            seen = wait_until(partial(holds, os.path.join(d.b, f"n{i}"), new), 10)
            if seen is None:
                never += 1
            else:
                stale_ms.append(time.monotonic() - t0)
        os.close(held)
    return {
        "trials": trials,
        "stale_on_first_open": stale_first,
        "stale_for_ms": stats(stale_ms),
        "never_fresh_in_10s": never,
        "held_fd_stale": stale_fd_first,
    }


def probe_mtime(p: Pair, trials: int) -> Result:
    d = p.sub("mtime")
    path_a, path_b = os.path.join(d.a, "hold"), os.path.join(d.b, "hold")
    write_file(path_a, b"{}")
    wait_until(lambda: exists(path_b), 5)
    delays = []
    for i in range(trials):
        os.stat(path_b)  # B has the attributes cached
        stamp = 1_000_000_000 + i * 10
        os.utime(path_a, (stamp, stamp))
        delays.append(wait_until(partial(mtime_is, path_b, stamp), 5))
    return {"mtime_seen_ms": stats(delays)}


def probe_inotify(p: Pair) -> Result:
    d = p.sub("inotify")
    fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return {"error": os.strerror(ctypes.get_errno())}
    try:
        if _libc.inotify_add_watch(fd, d.b.encode(), _IN_CREATE | _IN_MOVED_TO) < 0:
            return {"error": os.strerror(ctypes.get_errno())}
        write_file(os.path.join(d.a, "new"), b"x")
        ready, _, _ = select.select([fd], [], [], 2.0)
        events = 0
        if ready:
            buf = os.read(fd, 4096)
            offset = 0
            while offset + 16 <= len(buf):
                events += 1
                offset += 16 + struct.unpack_from("iIII", buf, offset)[3]
        return {"event_within_2s": bool(ready), "events": events}
    finally:
        os.close(fd)


# --- support and cost ----------------------------------------------------------------------


def timed(action: Callable[[], object], repeats: int) -> float:
    """Median seconds of `action` over `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        action()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def probe_tmpfile(p: Pair) -> Result:
    d = p.sub("tmpfile")
    out: Result = {}
    try:
        fd = os.open(d.a, os.O_TMPFILE | os.O_WRONLY, 0o644)
    except OSError as exc:
        return {"O_TMPFILE": errno.errorcode.get(exc.errno or 0, "?")}
    out["O_TMPFILE"] = "ok"
    try:
        os.write(fd, b"tmpfile")
        rc = _libc.linkat(fd, b"", _AT_FDCWD, os.path.join(d.a, "e").encode(), _AT_EMPTY_PATH)
        out["linkat_AT_EMPTY_PATH"] = (
            "ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
        )
        proc = f"/proc/self/fd/{fd}".encode()
        rc = _libc.linkat(
            _AT_FDCWD, proc, _AT_FDCWD, os.path.join(d.a, "p").encode(), _AT_SYMLINK_FOLLOW
        )
        out["linkat_proc_fd"] = "ok" if rc == 0 else errno.errorcode.get(ctypes.get_errno(), "?")
        name = "p" if rc == 0 else "e"
        if out.get(f"linkat_{'proc_fd' if name == 'p' else 'AT_EMPTY_PATH'}") == "ok":
            seen = wait_until(lambda: exists(os.path.join(d.b, name)), 5)
            out["b_reads_linked"] = (
                seen is not None and read_file(os.path.join(d.b, name)) == b"tmpfile"
            )
    finally:
        os.close(fd)
    return out


def probe_sync(p: Pair, repeats: int) -> Result:
    d = p.sub("sync")
    out: Result = {}
    fd = os.open(os.path.join(d.a, "f"), os.O_WRONLY | os.O_CREAT, 0o644)
    dfd = os.open(d.a, os.O_RDONLY | os.O_DIRECTORY)
    try:

        def write_then(flush: Callable[[int], object]) -> Callable[[], None]:
            def step() -> None:
                os.pwrite(fd, b"y" * 1024, 0)
                flush(fd)

            return step

        def syncfs(f: int) -> None:
            if _libc.syncfs(f) != 0:
                raise OSError(ctypes.get_errno(), "syncfs")

        for label, flush in (
            ("write_1KiB_ms", lambda f: None),
            ("write+fsync_ms", os.fsync),
            ("write+fdatasync_ms", os.fdatasync),
            ("write+syncfs_ms", syncfs),
        ):
            try:
                out[label] = round(timed(write_then(flush), repeats) * 1e3, 3)
            except OSError as exc:
                out[label] = errno.errorcode.get(exc.errno or 0, "?")
        try:
            out["dir_fsync_ms"] = round(timed(lambda: os.fsync(dfd), repeats) * 1e3, 3)
        except OSError as exc:
            out["dir_fsync_ms"] = errno.errorcode.get(exc.errno or 0, "?")
    finally:
        os.close(fd)
        os.close(dfd)
    return out


def probe_ops(p: Pair, count: int) -> Result:
    d = p.sub("ops")
    data = b"z" * 1024
    t0 = time.perf_counter()
    for i in range(count):
        tmp = os.path.join(d.a, f"t{i}.tmp")
        write_file(tmp, data, sync=True)
        os.rename(tmp, os.path.join(d.a, f"r{i}"))
    put = (time.perf_counter() - t0) / count
    t0 = time.perf_counter()
    for i in range(count):
        os.rename(os.path.join(d.a, f"r{i}"), os.path.join(d.a, f"l{i}"))
    rename = (time.perf_counter() - t0) / count
    t0 = time.perf_counter()
    for i in range(count):
        os.unlink(os.path.join(d.a, f"l{i}"))
    unlink = (time.perf_counter() - t0) / count
    listing = p.sub("ops-list")
    for i in range(1000):
        write_file(os.path.join(listing.a, f"{i:016d}"), b"")
    listdir = timed(lambda: os.listdir(listing.b), 5)
    scandir_stat = timed(lambda: [e.stat() for e in os.scandir(listing.b)], 3)
    return {
        "create+write+fsync+rename_ms": round(put * 1e3, 3),
        "rename_ms": round(rename * 1e3, 3),
        "unlink_ms": round(unlink * 1e3, 3),
        "listdir_1000_ms": round(listdir * 1e3, 3),
        "scandir+stat_1000_ms": round(scandir_stat * 1e3, 3),
    }


def probe_statvfs(p: Pair) -> Result:
    st = os.statvfs(p.b)
    return {
        "f_bsize": st.f_bsize,
        "free_space_pct": round(100 * st.f_bavail / st.f_blocks, 1) if st.f_blocks else None,
        "f_files": st.f_files,
        "free_inodes_pct": round(100 * st.f_favail / st.f_files, 1) if st.f_files else None,
        "f_namemax": st.f_namemax,
    }


def stats(delays: Sequence[float | None]) -> Result:
    seen = [x * 1e3 for x in delays if x is not None]
    return {
        "n": len(delays),
        "never": len(delays) - len(seen),
        "median": round(statistics.median(seen), 2) if seen else None,
        "max": round(max(seen), 2) if seen else None,
        "over_10ms": sum(1 for x in seen if x > 10),
    }


def run_probes(pair: Pair, quick: bool) -> Result:
    n = 20 if quick else 200
    results: Result = {}
    probes: list[tuple[str, Callable[[], Result]]] = [
        ("rename-race", lambda: probe_rename_race(pair, n)),
        ("link-race", lambda: probe_create_race(pair, n, "link")),
        ("symlink-race", lambda: probe_create_race(pair, n, "symlink")),
        ("excl-race", lambda: probe_create_race(pair, n, "excl")),
        ("visibility", lambda: probe_visibility(pair, n // 4)),
        ("stale-name", lambda: probe_stale_name(pair, n // 4)),
        ("rename-view", lambda: probe_rename_atomic_view(pair, 1.0 if quick else 5.0)),
        (
            "rename-view-same-client",
            lambda: probe_rename_atomic_view(pair, 1.0 if quick else 5.0, same_client=True),
        ),
        ("reuse-read", lambda: probe_reuse_read(pair, n // 4)),
        ("mtime", lambda: probe_mtime(pair, n // 4)),
        ("inotify", lambda: probe_inotify(pair)),
        ("tmpfile", lambda: probe_tmpfile(pair)),
        ("sync", lambda: probe_sync(pair, 20 if quick else 100)),
        ("ops", lambda: probe_ops(pair, 50 if quick else 300)),
        ("statvfs", lambda: probe_statvfs(pair)),
    ]
    for name, probe in probes:
        t0 = time.monotonic()
        try:
            results[name] = probe()
        except Exception as exc:  # a probe that breaks is a finding, not the end of the run
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  {pair.label:10} {name:14} {time.monotonic() - t0:6.1f} s", file=sys.stderr)
    return results


def flatten(result: Result, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in result.items():
        if isinstance(value, dict) and not (set(value) >= {"n", "median"}):
            flat.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, dict):
            flat[prefix + key] = (
                f"med {value['median']} max {value['max']} >10ms {value['over_10ms']}"
                + (f" never {value['never']}" if value["never"] else "")
            )
        else:
            flat[prefix + key] = value
    return flat


def print_table(all_results: dict[str, Result]) -> None:
    labels = list(all_results)
    rows: dict[str, dict[str, Any]] = {}
    for label, results in all_results.items():
        for key, value in flatten(results).items():
            rows.setdefault(key, {})[label] = value
    width = max(len(k) for k in rows)
    print(f"{'probe':{width}} | " + " | ".join(f"{lab:30}" for lab in labels))
    for key, row in rows.items():
        print(f"{key:{width}} | " + " | ".join(f"{row.get(lab, '')!s:30}" for lab in labels))


@contextmanager
def local_pair(label: str, parent: str) -> Iterator[Pair]:
    with tempfile.TemporaryDirectory(prefix="dirmq-probe-", dir=parent) as d:
        yield Pair(label, d, d)


@contextmanager
def gluster_pair(label: str, mounts: list[str] | None) -> Iterator[tuple[Pair, Result]]:
    """`glusterfs`: the volume as created (Debian's defaults); `glusterfs-nocache`: with the
    client caches off (tests/support/gluster.py's NO_CACHE_* options)."""
    if mounts:
        a = tempfile.mkdtemp(prefix="dirmq-probe-", dir=mounts[0])
        yield Pair(label, a, os.path.join(mounts[1], os.path.basename(a))), {}
        return
    from tests.support import gluster

    nocache = label == "glusterfs-nocache"
    with gluster.running_volume(
        volume_options=gluster.NO_CACHE_VOLUME_OPTIONS if nocache else None,
        mount_options=gluster.NO_CACHE_MOUNT_OPTIONS if nocache else (),
    ) as volume:
        yield Pair(label, volume.mounts[0], volume.mounts[1]), volume.timings


SUBJECTS = ["glusterfs", "glusterfs-nocache", "ext4", "tmpfs"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer trials")
    parser.add_argument("--mounts", nargs=2, metavar="DIR", help="two mounts of one volume")
    parser.add_argument("--only", choices=SUBJECTS, action="append", help="repeatable")
    parser.add_argument("--out", default=str(RESULTS / "gluster_probe.json"))
    args = parser.parse_args()
    subjects = args.only or (["glusterfs"] if args.mounts else SUBJECTS)
    all_results: dict[str, Result] = {}
    meta: Result = {"uname": os.uname().release, "quick": args.quick}
    for label in ("glusterfs", "glusterfs-nocache"):
        if label in subjects:
            t0 = time.monotonic()
            with gluster_pair(label, args.mounts) as (pair, timings):
                all_results[label] = run_probes(pair, args.quick)
            meta[f"{label}_timings_s"] = {k: round(v, 2) for k, v in timings.items()}
            meta[f"{label}_total_s"] = round(time.monotonic() - t0, 1)
    for label, parent in (("ext4", tempfile.gettempdir()), ("tmpfs", "/dev/shm")):
        if label in subjects:
            with local_pair(label, parent) as pair:
                all_results[label] = run_probes(pair, args.quick)
    print_table(all_results)
    print(json.dumps(meta))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": meta, "results": all_results}, indent=2))
    print(f"written: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
