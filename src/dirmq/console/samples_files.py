"""The console's samples on disk: files of the server run's private directory, so that every
worker answers from the same data (`samples.py` writes them, `samples_api.py` reads them).

    <run>/samples/counts/<pid>.json   a worker's per-queue counts (`server/queuecounts.py`),
                                      {queue: [published, delivered, ...]}, replaced whole
    <run>/samples/sampler-<gen>       the hold of the one process that samples (store/holds.py)
    <run>/samples/latest.json         the last sample: every sampled queue's depth, cumulative
                                      counts and rates, and the totals (replaced whole)
    <run>/samples/rings/<sha1>.ring   a queue's last hour (`@total`: every queue's), a fixed
                                      record per sampling slot, written in place

A ring has `slots(interval_s)` records of `RECORD`: the sample's time (whole seconds on the
interval's grid), ready, in flight, delayed, dead, the oldest ready age (NaN: none ready), the
rate of each of `KINDS` per second (NaN: unknown, the queue's first sample), and the time again.
The sample at time t goes to slot (t / interval) % slots: a record whose time is not the one a
reader looks for is a missing point (never written, or an hour old), and a record whose two
times differ was caught half-written (a reader skips it; the next sample rewrites the slot).
A ring is 56 bytes a slot: 20 KB for an hour at 10 s, 1,000 queues 20 MB of /dev/shm at most.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dirmq.server.queuecounts import KINDS
from dirmq.store import smallfiles
from dirmq.store.filemodes import Access

WINDOW_S = 3600  # how far back the rings go
TOTAL = "@total"  # the ring of every queue together (no queue name starts with @)
# 4 bytes a value: an hour of 1,000 queues at 10 s is 20 MB of /dev/shm (8 bytes: 40 MB). Depths
# saturate at 2**32 - 1, a float's 7 digits are what a chart shows, times last until 2106.
RECORD = struct.Struct(f"<I4If{len(KINDS)}fI")
MAX_DEPTH = 2**32 - 1
DEPTHS = ("ready", "in_flight", "delayed", "dead")
RATES = tuple(f"{kind}_per_s" for kind in KINDS)
SERIES = ("t", *DEPTHS, "oldest_ready_age_s", *RATES)  # the names of a series' columns
NAN = float("nan")


def slots(interval_s: int) -> int:
    """Records in a ring: the window at the interval."""
    return -(-WINDOW_S // interval_s)


@dataclass(frozen=True, slots=True)
class Point:
    """One queue (or the totals) in one sample."""

    t: int
    depth: tuple[int, int, int, int]  # as DEPTHS
    oldest_ready_age_s: float | None
    counts: tuple[int, ...]  # cumulative, as KINDS
    rates: tuple[float | None, ...]  # per second since the previous sample, as KINDS

    def pack(self) -> bytes:
        age = NAN if self.oldest_ready_age_s is None else self.oldest_ready_age_s
        rates = (NAN if r is None else r for r in self.rates)
        depth = (min(d, MAX_DEPTH) for d in self.depth)
        return RECORD.pack(self.t, *depth, age, *rates, self.t)

    def as_json(self) -> dict[str, Any]:
        found: dict[str, Any] = dict(zip(DEPTHS, self.depth, strict=True))
        found["oldest_ready_age_s"] = self.oldest_ready_age_s
        found.update(zip(RATES, self.rates, strict=True))
        found["counts"] = list(self.counts)
        return found


def _number(value: float) -> float | None:
    """A stored float32 as the number it stood for (0.3, not 0.30000001192092896)."""
    return None if math.isnan(value) else float(f"{value:.7g}")


class SampleFiles:
    """The samples directory of one server run (see the module docstring)."""

    def __init__(self, run_dir: str, access: Access) -> None:
        self.path = os.path.join(run_dir, "samples")
        self.counts_dir = os.path.join(self.path, "counts")
        self.rings_dir = os.path.join(self.path, "rings")
        self.latest_path = os.path.join(self.path, "latest.json")
        self.access = access
        self._latest: tuple[tuple[int, int], dict[str, Any]] | None = None

    # -- the workers' counts ----------------------------------------------------------------------
    def write_counts(self, pid: int, rows: dict[str, list[int]]) -> None:
        """This worker's counts, replacing its file whole (a reader sees the old or the new)."""
        smallfiles.replace_file(
            os.path.join(self.counts_dir, f"{pid}.json"),
            json.dumps(rows, separators=(",", ":")).encode(),
            durable=False,  # the run's files die with the run: nothing to flush
            access=self.access,
            make_parents=True,
        )

    def summed_counts(self) -> dict[str, list[int]]:
        """Every worker's counts (the dead ones' too: sums never go backwards), by queue."""
        total: dict[str, list[int]] = {}
        for raw in self._counts_files():
            try:
                rows = json.loads(raw)
            except ValueError:
                continue  # not one of ours (a replace is whole: ours always parse)
            for queue, row in rows.items():
                into = total.get(queue)
                if into is None:
                    total[queue] = list(row)
                else:
                    for index, value in enumerate(row):
                        into[index] += value
        return total

    def _counts_files(self) -> Iterator[bytes]:
        try:
            names = os.listdir(self.counts_dir)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".json"):
                raw = smallfiles.read_file(os.path.join(self.counts_dir, name))
                if raw is not None:
                    yield raw

    # -- the rings ---------------------------------------------------------------------------------
    def ring_path(self, queue: str) -> str:
        digest = hashlib.sha1(queue.encode(), usedforsecurity=False).hexdigest()
        return os.path.join(self.rings_dir, f"{digest}.ring")

    def write_points(self, interval_s: int, points: dict[str, Point]) -> None:
        """Each point into its queue's ring, at its time's slot."""
        os.makedirs(self.rings_dir, mode=0o700, exist_ok=True)
        count = slots(interval_s)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC
        for queue, point in points.items():
            fd = os.open(self.ring_path(queue), flags, 0o600)
            try:
                os.pwrite(fd, point.pack(), (point.t // interval_s % count) * RECORD.size)
            finally:
                os.close(fd)

    def read_series(self, queue: str, interval_s: int, end_t: int) -> dict[str, list[Any]]:
        """The last hour of `queue`'s ring up to `end_t`, as SERIES columns: a point for each
        time on the grid, None for what is missing."""
        count = slots(interval_s)
        times = [end_t - (count - 1 - i) * interval_s for i in range(count)]
        columns: dict[str, list[Any]] = {name: [None] * count for name in SERIES}
        columns["t"] = times
        try:
            with open(self.ring_path(queue), "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return columns
        names = SERIES[1:]
        first = times[0]
        whole = raw[: len(raw) // RECORD.size * RECORD.size]  # a ring still growing
        for index, record in enumerate(RECORD.iter_unpack(whole)):
            t = record[0]
            if t != record[-1] or t < first or t > end_t or t // interval_s % count != index:
                continue  # never written, an hour old, or half-written
            at = (t - first) // interval_s
            for name, value in zip(names, record[1:-1], strict=True):
                columns[name][at] = value if isinstance(value, int) else _number(value)
        return columns

    def remove_stale_rings(self, now: float) -> None:
        """Rings of queues not sampled within the window (deleted, or no longer among the
        deepest) go."""
        try:
            entries = list(os.scandir(self.rings_dir))
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                if now - entry.stat().st_mtime > WINDOW_S:
                    os.unlink(entry.path)
            except FileNotFoundError:
                continue

    # -- the last sample ---------------------------------------------------------------------------
    def write_latest(self, latest: dict[str, Any]) -> None:
        smallfiles.replace_file(
            self.latest_path,
            json.dumps(latest, separators=(",", ":")).encode(),
            durable=False,
            access=self.access,
            make_parents=True,
        )

    def latest_version(self) -> tuple[int, int] | None:
        """What identifies the last sample (each is a new file): None before the first."""
        try:
            stat = os.stat(self.latest_path)
        except FileNotFoundError:
            return None
        return (stat.st_ino, stat.st_mtime_ns)

    def read_latest(self) -> tuple[tuple[int, int], dict[str, Any]] | None:
        """(version, the last sample), parsed once per sample in each process; None before the
        first."""
        try:
            fd = os.open(self.latest_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            stat = os.fstat(fd)  # the version of what is read, whatever replaces it meanwhile
            version = (stat.st_ino, stat.st_mtime_ns)
            cached = self._latest
            if cached is not None and cached[0] == version:
                return cached
            with os.fdopen(os.dup(fd), "rb") as f:
                raw = f.read()
        finally:
            os.close(fd)
        try:
            latest = json.loads(raw)
        except ValueError:
            return None
        self._latest = (version, latest)
        return self._latest
