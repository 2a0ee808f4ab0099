"""Running schedules: each tick published exactly once, whoever runs them and however they die.

Theory of operation. Any number of runners (every `dirmq serve` worker, library processes) may
run the schedules of one root at once; they share nothing but the files (records.py). A runner's
step, for each schedule that is not paused:

1. Unfinished claims (a claim without `.done`). The newest generation's claimer is asked after
   (store/processes.py's one rule): this very process retries its own publish (a queue that was
   full, a disk error); a dead one's claim is taken over by making the next generation
   (`<tick>.c<gen+1>`, an exclusive link: one taker wins) and publishing. A claimer on another
   host cannot be seen: its claim is taken over once it is `STALE_CLAIM_S` old (the hosts'
   clocks must agree; were it still publishing, the store's dedup keeps one copy of the two).
2. Due ticks. The ticks after the newest record (or the floor, or the schedule's last change:
   a new, changed or resumed schedule never publishes ticks from before) up to now. Those more
   than `late_s` late were missed (no runner was alive, or all were stopped): `skip` claims the
   latest of them as a skip (publishing nothing), `once` claims it as one message standing for
   them all (`X-Schedule-Missed: n`). The others are claimed one by one, each by generation 0.
3. Clean-up: finished ticks beyond the newest `KEEP_TICKS` are removed, the floor raised first.

Publishing a claimed tick goes through the queue's ordinary `put`, with a dedup id derived from
(schedule, tick), then `.done` is recorded. A runner killed between its claim and `.done` is
replaced by a taker that first looks for that dedup record (ignoring its age) and publishes only
if there is none: the tick is published once whether the claimer died before its put or after.
The one window left is the store's own, between a message's link into the queue and its dedup
record (store/dedup.py: microseconds; a kill exactly there gives one extra copy).

A claim is checked after it is made, against a view that may be stale (a runner stopped between
its listing and its claim, for longer than the clean-up keeps records): a generation-0 claim at
or below the floor, a claim of a tick that is done, or a taker's claim whose previous generation
is gone, is withdrawn. The clean-up raises the floor before it removes records, so one of these
checks always sees it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType

from dirmq.errors import (
    DirmqError,
    InvalidArgument,
    MessageTooLarge,
    QueueFull,
    QueueNotFound,
)
from dirmq.schedules.model import MISSED_HEADER, NAME_HEADER, TICK_HEADER, Schedule, iso_utc
from dirmq.schedules.records import ScheduleFiles, TickRecords, read_record
from dirmq.store import Store
from dirmq.store.layout import DEDUP
from dirmq.store.names import queue_path
from dirmq.store.processes import (
    Liveness,
    ProcessIdentity,
    current,
    liveness,
    parse_token,
)

log = logging.getLogger("dirmq.schedules")

LATE_S = 5.0  # a tick published later than this after its time counts as missed
KEEP_TICKS = 32  # finished ticks kept per schedule (the last tick's record among them)
STEP_MAX_S = 1.0  # how long a runner sleeps at most: schedules put meanwhile are seen by then
PUT_TIMEOUT_S = 5.0  # a full queue: the claim stays, the put is tried again at the next step
STEP_THREADS = 8  # schedules stepped at once (each tick's writes are durable: they batch)
STALE_CLAIM_S = 60.0  # a claim by a process on another host, unfinished this long: taken over

# Claims this process is publishing now: two runners in one process share one identity, so
# neither may take the other's claim for a retry of its own.
_inflight: set[tuple[str, str, int]] = set()
_inflight_lock = threading.Lock()

# Called with ("claimed" | "published", schedule name, tick) as a tick moves on: a test's way
# to stop a runner at the instant between a claim and its publish (tests/test_schedules_*.py).
Hook = Callable[[str, str, int], None]
hook: Hook | None = None


def dedup_id(name: str, tick_ms: int) -> str:
    return f"@schedule/{name}/{tick_ms}"


class Scheduler:
    """Runs the schedules of `store`'s root: `step()` once, or `start()` a thread that steps
    until `stop()` (or use it as a context manager)."""

    def __init__(
        self, store: Store, *, late_s: float = LATE_S, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.files = ScheduleFiles(store.root, store.access)
        self.late_ms = round(late_s * 1000)
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> Scheduler:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dirmq-schedules", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float | None = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> Scheduler:
        return self.start()

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                wait_s = self.step()
            except Exception:  # a runner outlives any one failure: logged, tried next step
                log.exception("schedules: a step failed")
                wait_s = STEP_MAX_S
            self._stop.wait(wait_s)

    # -- one step -----------------------------------------------------------------------------
    def step(self) -> float:
        """Publish what is due now; returns how long to sleep until the next tick (at most
        `STEP_MAX_S`). Schedules are stepped on up to `STEP_THREADS` threads: their durable
        writes then share the store's group commit instead of waiting for one another."""
        due: list[Schedule] = []
        for name in self.files.names():
            try:
                schedule = self.files.read(name)
            except DirmqError as exc:  # deleted meanwhile, or a damaged file (fsck says)
                log.debug("schedules: %s skipped: %s", name, exc)
                continue
            if not schedule.paused:
                due.append(schedule)
        if len(due) > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(STEP_THREADS, thread_name_prefix="dirmq-tick")
            next_ticks = list(self._pool.map(self._step_safely, due))
        else:
            next_ticks = [self._step_safely(schedule) for schedule in due]
        now_ms = self._now_ms()
        wait_ms = STEP_MAX_S * 1000
        for next_ms in next_ticks:
            if next_ms is not None:
                wait_ms = min(wait_ms, max(next_ms - now_ms, 10))
        return wait_ms / 1000

    def _step_safely(self, schedule: Schedule) -> int | None:
        """`_step_one`, then the schedule's next tick; None (logged) if it failed."""
        try:
            self._step_one(schedule)
            return schedule.next_tick_ms(self._now_ms())
        except DirmqError as exc:
            log.warning("schedules: %s: %s", schedule.name, exc)
            return None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def _step_one(self, schedule: Schedule) -> None:
        name = schedule.name
        records = self.files.ticks(name)
        for tick, tick_records in sorted(records.items()):
            if tick_records.done is None and tick_records.claims:
                self._resume(schedule, tick, tick_records)
        floor = self.files.floor(name)
        anchor = max(max(records, default=0), floor, int(schedule.updated_s * 1000))
        now_ms = self._now_ms()
        due, count = schedule.ticks_through(anchor, now_ms)
        on_time = [tick for tick in due if tick >= now_ms - self.late_ms]
        missed = count - len(on_time)
        if missed:
            latest = due[len(due) - len(on_time) - 1]
            kind = "once" if schedule.missed == "once" else "skip"
            if self._claim(name, latest, 0, kind, missed) and kind == "once":
                self._publish(schedule, latest, "once", missed)
        for tick in on_time:
            if self._claim(name, tick, 0, "tick", 0):
                self._publish(schedule, tick, "tick", 0)
        if len(records) > 2 * KEEP_TICKS:
            self._clean(name, records)

    def _resume(self, schedule: Schedule, tick: int, records: TickRecords) -> None:
        first = read_record(records.claims.get(min(records.claims)))
        kind = first.get("kind", "tick")
        if kind == "skip":
            return  # a skip claim is finished as it stands
        kind = kind if kind in ("tick", "once") else "tick"
        missed = first.get("missed", 0)
        missed = missed if isinstance(missed, int) else 0
        top = records.top
        owner_text = read_record(records.claims[top]).get("by")
        owner = parse_token(owner_text) if isinstance(owner_text, str) else None
        if owner == current():
            self._publish(schedule, tick, str(kind), missed)  # our own: a retry
        elif self._abandoned(owner, records.claims[top]) and self._claim(
            schedule.name, tick, top + 1, str(kind), missed
        ):
            log.info("schedules: %s: tick %s taken over from %s", schedule.name, tick, owner)
            self._publish(schedule, tick, str(kind), missed)

    def _abandoned(self, owner: ProcessIdentity | None, claim: str) -> bool:
        """Whether a claim by `owner` may be taken over: its process is dead (or the record is
        damaged), or it runs where liveness cannot be seen (another host) and its claim is
        older than `STALE_CLAIM_S` (a live claimer finishes, or fails its put, long before)."""
        if owner is None:
            return True
        alive = liveness(owner)
        if alive is Liveness.DEAD:
            return True
        if alive is Liveness.UNKNOWN:
            try:
                return self.clock() - os.stat(claim).st_mtime > STALE_CLAIM_S
            except FileNotFoundError:
                return False
        return False

    def _claim(self, name: str, tick: int, generation: int, kind: str, missed: int) -> bool:
        """Make generation `generation` of tick `tick`'s claim; True if this process now owns
        the tick (checked against a stale view: see the module docstring)."""
        path = self.files.claim_path(name, tick, generation)
        record = {"by": current().token(), "at_s": time.time(), "kind": kind, "missed": missed}
        if not self.files.create(path, record):
            return False
        if generation == 0:
            valid = tick > self.files.floor(name)
        else:
            valid = os.path.exists(self.files.claim_path(name, tick, generation - 1))
        if valid and not os.path.exists(self.files.done_path(name, tick)):
            if hook is not None:
                hook("claimed", name, tick)
            return True
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return False

    def _publish(self, schedule: Schedule, tick: int, kind: str, missed: int) -> None:
        key = (self.files.base, schedule.name, tick)
        with _inflight_lock:
            if key in _inflight:
                return
            _inflight.add(key)
        try:
            self._publish_claimed(schedule, tick, kind, missed)
        finally:
            with _inflight_lock:
                _inflight.discard(key)

    def _publish_claimed(self, schedule: Schedule, tick: int, kind: str, missed: int) -> None:
        name = schedule.name
        key = dedup_id(name, tick)
        done: dict[str, object] = {"by": current().token(), "kind": kind}
        message_id = _published(self.store.root, schedule.queue, key)
        if message_id is None:
            headers = dict(schedule.headers)
            headers[NAME_HEADER] = name
            headers[TICK_HEADER] = iso_utc(tick)
            if kind == "once":
                headers[MISSED_HEADER] = str(missed)
            try:
                queue = self.store.queue(schedule.queue)
                message_id = queue.put(
                    schedule.body, headers, dedup_id=key, timeout_s=PUT_TIMEOUT_S
                )
            except QueueNotFound:
                done["error"] = f"queue {schedule.queue!r} does not exist"
                log.warning("schedules: %s: tick %s lost: %s", name, tick, done["error"])
            except (MessageTooLarge, InvalidArgument) as exc:  # the queue's limits changed
                done["error"] = str(exc)
                log.warning("schedules: %s: tick %s lost: %s", name, tick, exc)
            except QueueFull:
                log.warning(
                    "schedules: %s: queue %s is full: tick %s waits", name, schedule.queue, tick
                )
                return  # the claim stays ours: tried again at the next step
            if hook is not None:
                hook("published", name, tick)
        if message_id is not None:
            done["message_id"] = message_id
        done["at_s"] = time.time()
        self.files.create(self.files.done_path(name, tick), done)

    def _clean(self, name: str, records: dict[int, TickRecords]) -> None:
        finished = [
            tick
            for tick, tick_records in sorted(records.items())
            if tick_records.done is not None
            or read_record(tick_records.claims.get(0)).get("kind") == "skip"
        ]
        old = finished[:-KEEP_TICKS]
        if not old:
            return
        self.files.raise_floor(name, old[-1])  # first: a stale claimer then sees it
        for tick in old:
            tick_records = records[tick]
            paths = [tick_records.claims[g] for g in sorted(tick_records.claims)]
            for path in [*paths, tick_records.done]:
                if path is not None:
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass


def _published(root: str, queue: str, key: str) -> str | None:
    """The id of the message published with dedup id `key`, whatever its age (store/dedup.py's
    record: `@dedup/<sha256 of the id, 40 hex digits>`, a symlink to the message id)."""
    path = os.path.join(
        queue_path(root, queue), DEDUP, hashlib.sha256(key.encode()).hexdigest()[:40]
    )
    try:
        return os.readlink(path)
    except OSError:
        return None


def run_schedules(store: Store, *, late_s: float = LATE_S) -> Scheduler:
    """Start running the root's schedules on a background thread of this process; the
    Scheduler returned stops with `stop()` (or use it in a `with`)."""
    return Scheduler(store, late_s=late_s).start()
