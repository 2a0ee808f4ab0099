"""Redrive tasks: a queue's dead messages moved back (store/redrive.py) as a task that can be
paced, watched, cancelled, and resumed by another process after a crash.

A task is planned when it starts: the ids it may move are those dead in its source then, up to
the newest (`until`), filtered by `ids` and `reason`. It then moves them oldest first, a chunk
at a time, and after each chunk records how far it got (`cursor`, `moved`) in its file
(records.py). Every process serving the root sees the same tasks: one task per source is
active at a time, in the process that holds the source's hold; a task whose process died
(SIGKILL, a restart) is taken over by the next process that starts, lists or looks at that
source's tasks, and goes on from its cursor. Each move is one rename, so a message moved just
before a crash is simply not found again: every message is moved exactly once.

`rate_per_s` paces it: a chunk of at most a quarter of a second's worth, each started when the
count moved so far allows. A cancel (from any process: a file) stops it between chunks; what
was moved stays moved.

A runner is a thread: the same code serves the HTTP server (one thread per running task, the
event loop never waits on it) and `dirmq redrive` (in the foreground).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Collection

from dirmq import errors
from dirmq.redrive.model import (
    ACTIVE,
    CANCELLED,
    COMPLETED,
    FAILED,
    RedriveTask,
    check_rate,
)
from dirmq.redrive.records import TaskFiles
from dirmq.store import Store
from dirmq.store.redrive import check_filter

log = logging.getLogger("dirmq.redrive")

CHUNK = 100  # messages per chunk without a rate
MAX_IDS = 10_000  # ids one task may name (the record holds them)
MAX_LEFT_SHOWN = 100  # ids left behind, with why, kept in the record
POLL_S = 0.25  # how often a waiting runner looks for a cancel
RENEW_EVERY_S = 5.0  # the runner's hold, while it waits (records.HOLD_TIMEOUT_S)
ProgressFn = Callable[["RedriveTask"], None]


class Redrives:
    """The redrive tasks of one root as this process sees them: the files (every process's
    tasks) and the runner threads of those this process runs. Thread-safe; its calls block on
    the filesystem (the server makes them from its thread pool)."""

    def __init__(self, store: Store, *, resume: bool = True) -> None:
        """`resume`: take over the tasks of dead processes when it looks at them (a server);
        a short-lived command leaves them to the next server."""
        self.store = store
        self._resume = resume
        self.files = TaskFiles(store.root, access=store.access)
        self._lock = threading.Lock()
        self._running: dict[str, tuple[RedriveTask, threading.Event]] = {}
        self._closed = False

    # -- starting -------------------------------------------------------------------------------
    def start(
        self,
        source: str,
        *,
        ids: Collection[str] | None = None,
        reason: str | None = None,
        to: str | None = None,
        rate_per_s: int | None = None,
        origin: str = "native",
        background: bool = True,
    ) -> RedriveTask:
        """Plan and record a redrive of `source`'s dead messages and run it: on a thread of its
        own (`background`), or not at all yet (the caller runs it: `run`). RedriveBusy if a
        task of `source` is active (in any process); QueueNotFound if `source` or `to` is
        missing; InvalidArgument for a bad filter or rate."""
        if ids is not None:
            ids = list(dict.fromkeys(ids))
            if len(ids) > MAX_IDS:
                raise errors.InvalidArgument(
                    f"{len(ids)} ids in one redrive; at most {MAX_IDS}: split it, or redrive "
                    "by reason or all"
                )
        check_filter(ids, reason)
        rate_per_s = check_rate(rate_per_s)
        queue = self.store.queue(source)  # QueueNotFound
        if to is not None:
            self.store.queue(to)
        self.list(source)  # resumes an orphan, which then counts as the active task
        planned = queue.redrive_plan(ids)
        task = RedriveTask(
            task_id=uuid.uuid4().hex,
            source=source,
            to=to,
            ids=ids,
            reason=reason,
            rate_per_s=rate_per_s,
            to_move=len(planned),
            until=planned[-1].message_id if planned else None,
            started_ms=int(time.time() * 1000),
            origin=origin,
        )
        if not self.files.create(task):
            raise errors.RedriveBusy(
                f"a redrive of queue {source!r} is already running: watch it (GET "
                f"/{source}/redrive) or cancel it first; one runs at a time"
            )
        if background:
            self._launch(task)
        return task

    # -- looking --------------------------------------------------------------------------------
    def list(self, source: str) -> list[RedriveTask]:
        """Every remembered task of `source`, newest first, after taking over orphans."""
        shown = []
        for record, cancel_requested in self.files.load(source):
            task = RedriveTask.from_record(record)
            task.cancel_requested = cancel_requested
            with self._lock:
                mine = self._running.get(task.task_id)
            if mine is not None:
                # A cancel asked through another process shows at once, not only once this
                # runner's next chunk reads the same `.cancel` file.
                mine[0].cancel_requested = mine[0].cancel_requested or cancel_requested
                shown.append(mine[0])
                continue
            resumable = self._resume and not self._closed and task.status in ACTIVE
            if resumable and self.files.try_own(task):
                log.info("resuming redrive %s of queue %r", task.task_id, source)
                self._launch(task)
            shown.append(task)
        return shown

    def get(self, source: str, task_id: str) -> RedriveTask:
        for task in self.list(source):
            if task.task_id == task_id:
                return task
        raise errors.TaskNotFound(f"no redrive task {task_id[:40]!r} of queue {source!r}")

    def cancel(self, source: str, task_id: str) -> RedriveTask:
        """Ask the task to stop after its chunk in progress (any process runs it); the task as
        it was when asked (CANCELLING if it was running), a copy: this process's runner may
        stop, and mark it CANCELLED, before the answer is written."""
        task = self.get(source, task_id)
        asked = copy.deepcopy(task)
        if task.status in ACTIVE:
            self.files.request_cancel(task)
            task.cancel_requested = asked.cancel_requested = True
        return asked

    def resume_all(self) -> None:
        """At start-up: take over the tasks whose process died (a crash, a restart)."""
        for source in self.files.sources():
            with contextlib.suppress(errors.DirmqError, OSError):
                self.list(source)

    def close(self) -> None:
        """Stop this process's runners after their chunk in progress. Their records stay
        RUNNING and their holds go: the next process to look resumes them."""
        with self._lock:
            self._closed = True
            running = list(self._running.values())
        for _task, stop in running:
            stop.set()

    # -- running --------------------------------------------------------------------------------
    def _launch(self, task: RedriveTask) -> None:
        stop = threading.Event()
        with self._lock:
            self._running[task.task_id] = (task, stop)
        thread = threading.Thread(
            target=self.run, args=(task, stop), name=f"redrive-{task.task_id[:8]}", daemon=True
        )
        thread.start()

    def run(
        self,
        task: RedriveTask,
        stop: threading.Event | None = None,
        progress: ProgressFn | None = None,
    ) -> RedriveTask:
        """Run `task` (whose hold this process has) until done, cancelled, failed, or `stop`
        (this process closing: left for another to resume); its final record written."""
        stop = stop or threading.Event()
        with self._lock:
            self._running.setdefault(task.task_id, (task, stop))
        try:
            _Runner(self, task, stop, progress).run()
        finally:
            with self._lock:
                self._running.pop(task.task_id, None)
            if stop.is_set() and task.status in ACTIVE:
                self.files.release(task)
            else:
                with contextlib.suppress(OSError):
                    self.files.finish(task)
        return task


class _Runner:
    def __init__(
        self, tasks: Redrives, task: RedriveTask, stop: threading.Event, progress: ProgressFn | None
    ) -> None:
        self.tasks, self.task, self.stop, self.progress = tasks, task, stop, progress
        self.files = tasks.files
        self.renewed = time.monotonic()
        self.taken_over = False

    def run(self) -> None:
        task = self.task
        try:
            self._move()
        except Exception as exc:
            task.status, task.failure = FAILED, f"{type(exc).__name__}: {exc}"
            task.finished_ms = int(time.time() * 1000)
            log.warning("redrive %s of queue %r failed: %s", task.task_id, task.source, exc)
            return
        if self.taken_over:
            log.warning(
                "redrive %s of queue %r: another process took it over (this one stalled past "
                "its hold's timeout); stopped",
                task.task_id,
                task.source,
            )
            self.stop.set()
            return
        if self.stop.is_set() and not task.cancel_requested:
            return  # closing: resumed by the next process
        task.status = CANCELLED if task.cancel_requested else COMPLETED
        task.finished_ms = int(time.time() * 1000)

    def _move(self) -> None:
        task = self.task
        store = self.tasks.store
        queue = store.queue(task.source)
        if task.to is not None:
            store.queue(task.to)  # QueueNotFound: fail now, not message by message
        planned = queue.redrive_plan(task.ids, after=task.cursor, until=task.until)
        sources = _sources_of(store, task.source)
        sole_source = sources[0] if len(sources) == 1 else None
        chunk = CHUNK if task.rate_per_s is None else max(1, min(CHUNK, task.rate_per_s // 4))
        started, moved_before = time.monotonic(), task.moved
        for start in range(0, len(planned), chunk):
            if task.rate_per_s is not None:
                due = started + (task.moved - moved_before) / task.rate_per_s
                if not self._wait(due - time.monotonic()):
                    return
            elif not self._wait(0):
                return
            if not self.files.renew(task):
                self.taken_over = True
                return
            part = planned[start : start + chunk]
            result = queue.redrive_move(
                part,
                reason=task.reason,
                to=task.to,
                sole_source=sole_source,
                plain_dead=bool(sources),
            )
            task.moved += result.moved
            for message_id, why in result.left.items():
                if len(task.left) < MAX_LEFT_SHOWN:
                    task.left[message_id] = why
            task.cursor = part[-1].message_id
            if not self.files.save(task):  # a process resuming it starts from here
                self.taken_over = True
                return
            if self.progress is not None:
                self.progress(task)

    def _wait(self, seconds: float) -> bool:
        """Wait `seconds` (at least one look for a cancel); False if the task must stop."""
        deadline = time.monotonic() + max(0.0, seconds)
        while True:
            if self.files.cancel_requested(self.task):
                self.task.cancel_requested = True
            if self.task.cancel_requested or self.stop.is_set():
                return False
            if time.monotonic() - self.renewed >= RENEW_EVERY_S:
                self.renewed = time.monotonic()
                if not self.files.renew(self.task):
                    self.taken_over = True
                    return False
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            self.stop.wait(min(remaining, POLL_S))


def _sources_of(store: Store, dlq: str) -> list[str]:
    """The queues whose dead-letter queue is `dlq`: if any, `dlq`'s ready messages without
    provenance are dead letters stored before dirmq kept it (and go back to the one source,
    when there is one)."""
    found = []
    for name in store.list_queues():
        if name == dlq:
            continue
        with contextlib.suppress(errors.DirmqError):
            if store.queue(name).config.dead_letter_queue == dlq:
                found.append(name)
    return found


_REGISTRY: weakref.WeakKeyDictionary[Store, Redrives] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def redrives_of(store: Store) -> Redrives:
    """The redrive tasks of `store`, one object per Store: every door of a server shares it."""
    with _REGISTRY_LOCK:
        tasks = _REGISTRY.get(store)
        if tasks is None:
            tasks = _REGISTRY[store] = Redrives(store)
        return tasks
