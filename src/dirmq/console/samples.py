"""The server's own samples of every queue's depth and rates, the same whichever worker answers:
what the console's charts and overview show (`samples_api.py` serves them).

Every worker runs a `Sampler` thread that wakes at each multiple of the interval (wall clock,
whole seconds: every worker's grid is the same) and

1. writes its per-queue counts (`server/queuecounts.py`: what its broker and Store counted
   since it started) to its own file of the run's directory, if they changed;
2. if it holds the sampler hold (`store/holds.py`, in the run's directory), or can take it,
   waits `settle_s` (for the other workers' step 1) and takes the sample of that grid time: a
   census of the root (`store/census.py`: every queue's depth from its state directories'
   names; no queue opened, no message file read), the sums of every worker's counts file, and
   the rates since the previous sample; the `max_queues` deepest queues and the totals are
   written to their rings and to `latest.json` (`samples_files.py`).

Exactly one process samples: the hold's holder. A holder that dies is replaced at the next tick
by whichever worker looks first (a dead process on this host is seen at once, by its pid and
start time; a hung one once its heartbeat, renewed every tick, is older than `hold_timeout_s`).
Why a hold among the workers rather than the supervisor: with `--workers 1` there is no
supervisor (one code path for every server), and the supervisor is a process that only waits
for its children; a worker already has the Store, the counts and a thread to spare.

The rate of a kind between two samples is the difference of the summed counts over the time
between them; at the first sample of a run the counts started at 0 one interval before. A
sampler that takes over reads the previous sums from `previous.json`, so rates do not restart.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
import threading
import time
from typing import Any

from dirmq.console.samples_files import TOTAL, Point, SampleFiles, slots
from dirmq.errors import InvalidArgument
from dirmq.server.queuecounts import KINDS, QueueCounts
from dirmq.store import holds, smallfiles
from dirmq.store.census import Census, QueueDepth
from dirmq.store.filemodes import Access
from dirmq.store.holds import Hold
from dirmq.store.message import QueueStats

DEFAULT_INTERVAL_S = 10
MIN_INTERVAL_S = 1
MAX_INTERVAL_S = 600  # at least 6 points in the hour the charts show
HOLD_PREFIX = "sampler-"
log = logging.getLogger("dirmq.server")

_ZEROS = (0,) * len(KINDS)


def check_interval(interval_s: float) -> int:
    """`--sample-interval` as whole seconds, or InvalidArgument saying what is accepted."""
    whole = round(interval_s)
    if whole != interval_s or not MIN_INTERVAL_S <= whole <= MAX_INTERVAL_S:
        raise InvalidArgument(
            f"--sample-interval must be whole seconds from {MIN_INTERVAL_S}s to "
            f"{MAX_INTERVAL_S}s (10m), not {interval_s:g}s"
        )
    return whole


def _held(found: QueueDepth) -> int:
    stats = found.stats
    return stats.ready + stats.in_flight + stats.delayed + stats.dead


class Sampler:
    """One per worker (see the module docstring): `start` on the worker, `close` at its end."""

    def __init__(
        self,
        census: Census,
        access: Access,
        queue_counts: QueueCounts,
        run_dir: str,
        *,
        interval_s: int = DEFAULT_INTERVAL_S,
        max_queues: int = 1000,
    ) -> None:
        self.root = census.root
        self._census = census  # kept listings: a settled deep @ready is not listed per sample
        self.interval_s = check_interval(interval_s)
        self.max_queues = max_queues
        self.queue_counts = queue_counts
        self.files = SampleFiles(run_dir, access)
        self.access = access
        # The other workers' counts are written at the grid time: read them a little after.
        self.settle_s = min(0.25 * self.interval_s, 1.0)
        self.hold_timeout_s = max(5.0 * self.interval_s, 30.0)
        self._previous_path = os.path.join(self.files.path, "previous.json")
        self._previous: tuple[int, dict[str, list[int]]] | None = None
        self._written = -1  # the counts' `changes` last written
        self._hold: Hold | None = None
        self._samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dirmq-sampler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop, write this worker's counts a last time, give the hold back."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        try:
            self.flush_counts()
        except OSError:
            pass  # the run's directory is going away with the server
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def _run(self) -> None:
        interval = self.interval_s
        while True:
            t = (int(time.time()) // interval + 1) * interval
            if self._stop.wait(max(0.0, t - time.time())):
                return
            try:
                self.tick(t)
            except Exception:  # a bug or a failing disk must not end the sampling for good
                log.exception("sampling failed")

    def tick(self, t: int) -> None:
        """What every worker does at grid time `t`."""
        self.flush_counts()
        if self._elected() and not self._stop.wait(self.settle_s):
            self.sample(t)

    def flush_counts(self) -> None:
        changes, rows = self.queue_counts.snapshot()
        if changes != self._written:
            self.files.write_counts(os.getpid(), rows)
            self._written = changes

    def _elected(self) -> bool:
        if self._hold is not None:
            if self._hold.renew():
                return True
            log.warning("no longer the sampler (%s)", self._hold.lost)
            self._hold = None
        taken = holds.take(
            self.files.path, HOLD_PREFIX, self.hold_timeout_s, access=self.access, attempts=3
        )
        if not isinstance(taken, Hold):
            return False
        self._hold = taken
        self._previous = None  # whoever sampled before left its sums in previous.json
        log.info("sampling the queues every %d s", self.interval_s)
        return True

    # -- one sample ----------------------------------------------------------------------------
    def sample(self, t: int) -> dict[str, Any]:
        """Take the sample of grid time `t` and write it; the last sample as written."""
        began, cpu_began = time.monotonic(), time.thread_time()
        found = list(self._census.depths())
        counts = self.files.summed_counts()
        previous_t, previous = self._previous or self._load_previous(t)
        if len(found) > self.max_queues:
            chosen = heapq.nsmallest(self.max_queues, found, key=lambda q: (-_held(q), q.name))
        else:
            chosen = found
        elapsed = t - previous_t
        points: dict[str, Point] = {}
        for queue in chosen:
            points[queue.name] = _point(
                t, queue.stats, counts.get(queue.name), previous.get(queue.name), elapsed
            )
        ages = [q.stats.oldest_ready_age_s for q in found]
        totals = QueueStats(
            sum(q.stats.ready for q in found),
            sum(q.stats.in_flight for q in found),
            sum(q.stats.delayed for q in found),
            sum(q.stats.dead for q in found),
            max((age for age in ages if age is not None), default=None),
        )
        total_counts = [sum(column) for column in zip(*counts.values(), strict=True)] or None
        points[TOTAL] = _point(t, totals, total_counts, previous.get(TOTAL), elapsed)
        self.files.write_points(self.interval_s, points)
        counts[TOTAL] = list(total_counts or _ZEROS)
        self._previous = (t, counts)
        smallfiles.replace_file(
            self._previous_path,
            json.dumps({"t": t, "counts": counts}, separators=(",", ":")).encode(),
            durable=False,
            access=self.access,
            make_parents=True,
        )
        total = points.pop(TOTAL)
        latest = {
            "t": t,
            "interval_s": self.interval_s,
            "queues": {name: point.as_json() for name, point in points.items()},
            "total": total.as_json(),
            "queue_count": len(found),
            "omitted": len(found) - len(chosen),
            "sample_s": round(time.monotonic() - began, 6),
            "sample_cpu_s": round(time.thread_time() - cpu_began, 6),
            "sampler_pid": os.getpid(),
        }
        self.files.write_latest(latest)
        self._samples += 1
        if self._samples % slots(self.interval_s) == 0:
            self.files.remove_stale_rings(time.time())
        return latest

    def _load_previous(self, t: int) -> tuple[int, dict[str, list[int]]]:
        """The sums the last sampler left, or (at a run's first sample) zeros an interval
        before `t`: every worker's counts started at 0 when it did."""
        raw = smallfiles.read_file(self._previous_path)
        if raw is not None:
            try:
                data = json.loads(raw)
                return int(data["t"]), dict(data["counts"])
            except (ValueError, KeyError, TypeError):
                pass
        return t - self.interval_s, {}


def _point(
    t: int,
    stats: QueueStats,
    counts: list[int] | None,
    previous: list[int] | None,
    elapsed_s: int,
) -> Point:
    now = tuple(counts) if counts is not None else _ZEROS
    before = tuple(previous) if previous is not None else _ZEROS
    if elapsed_s > 0:
        rates: tuple[float | None, ...] = tuple(
            max(0, a - b) / elapsed_s for a, b in zip(now, before, strict=True)
        )
    else:
        rates = (None,) * len(KINDS)
    return Point(
        t,
        (stats.ready, stats.in_flight, stats.delayed, stats.dead),
        stats.oldest_ready_age_s,
        now,
        rates,
    )
