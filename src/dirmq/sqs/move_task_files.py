"""Where SQS message move tasks live, so that every process serving a root shares them:
`<root>/@sqs/move-tasks/<source queue>/`

- `<task id>.json`: the task (status, counts, destination...), rewritten whole (temp file and
  rename) by the process running it after every batch, and at the end;
- `<task id>.lock`: `flock`ed for as long as a process runs the task. A record that says RUNNING
  whose lock is free belongs to a process that died: the next process to look takes the lock
  and carries on;
- `<task id>.cancel`: CancelMessageMoveTask from any process; the runner looks for it;
- `.start`: `flock`ed while a StartMessageMoveTask checks that no task of the source is active
  and writes its record, so two processes cannot both start one.

The newest HISTORY records of a source are kept, finished or not; older finished ones go.
Records are not flushed: after a machine crash a task may resume from an earlier count, which
moves nothing twice (each move is deduplicated at the destination, see move_tasks.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Protocol

from dirmq.store import layout

HISTORY = 10  # task records kept per source queue
_ACTIVE = ("RUNNING", "CANCELLING")


class TaskLike(Protocol):
    task_id: str
    source: str
    status: str

    def record(self) -> dict[str, object]: ...


class TaskFiles:
    def __init__(self, root: str) -> None:
        self._dir = os.path.join(root, layout.SQS_DIR, "move-tasks")
        self._held: dict[str, int] = {}  # task id -> descriptor of its lock, flocked by us

    def sources(self) -> list[str]:
        try:
            return sorted(os.listdir(self._dir))
        except FileNotFoundError:
            return []

    def load(self, source: str) -> list[tuple[dict[str, Any], bool]]:
        """Every record of `source` (and whether its cancellation was asked), newest first."""
        directory = os.path.join(self._dir, source)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        found: list[tuple[dict[str, Any], bool]] = []
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(directory, name), "rb") as f:
                    record = json.loads(f.read())
            except (OSError, ValueError):
                continue  # vanished (pruned) meanwhile, or damaged: not a task
            if isinstance(record, dict) and "task_id" in record:
                cancel = os.path.exists(self._path(source, str(record["task_id"]), ".cancel"))
                found.append((record, cancel))
        found.sort(key=lambda item: int(item[0].get("started_ms", 0)), reverse=True)
        return found

    def create(self, task: TaskLike) -> bool:
        """Record a new task and take its lock, unless another task of its source is active
        (False)."""
        directory = os.path.join(self._dir, task.source)
        os.makedirs(directory, exist_ok=True)
        start = os.open(os.path.join(directory, ".start"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(start, fcntl.LOCK_EX)
            for record, _cancel in self.load(task.source):
                if record.get("status") in _ACTIVE:
                    return False  # running somewhere (or resumed by whoever looked first)
            self.save(task)
            if not self._lock(task):
                raise OSError(f"could not lock the new move task {task.task_id}")
        finally:
            os.close(start)
        self._prune(task.source)
        return True

    def try_own(self, task: TaskLike) -> bool:
        """Take over an active task whose process is gone; False if it is alive or finished."""
        if task.task_id in self._held or not self._lock(task):
            return False
        try:
            with open(self._path(task.source, task.task_id, ".json"), "rb") as f:
                still_active = json.loads(f.read()).get("status") in _ACTIVE
        except (OSError, ValueError):
            still_active = False
        if not still_active:  # it finished between our reading and our locking
            self._unlock(task.task_id)
        return still_active

    def save(self, task: TaskLike) -> None:
        path = self._path(task.source, task.task_id, ".json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(task.record(), separators=(",", ":")).encode())
        os.replace(tmp, path)

    def finish(self, task: TaskLike) -> None:
        """The task has its final status: record it, forget the cancel request, let go."""
        self.save(task)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(task.source, task.task_id, ".cancel"))
        self._unlock(task.task_id)
        self._prune(task.source)

    def request_cancel(self, task: TaskLike) -> None:
        with open(self._path(task.source, task.task_id, ".cancel"), "wb"):
            pass

    def cancel_requested(self, task: TaskLike) -> bool:
        return os.path.exists(self._path(task.source, task.task_id, ".cancel"))

    def _path(self, source: str, task_id: str, suffix: str) -> str:
        return os.path.join(self._dir, source, task_id + suffix)

    def _lock(self, task: TaskLike) -> bool:
        fd = os.open(self._path(task.source, task.task_id, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._held[task.task_id] = fd
        return True

    def _unlock(self, task_id: str) -> None:
        fd = self._held.pop(task_id, None)
        if fd is not None:
            os.close(fd)

    def _prune(self, source: str) -> None:
        for record, _cancel in self.load(source)[HISTORY:]:
            if record.get("status") in _ACTIVE:
                continue
            for suffix in (".json", ".lock", ".cancel"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(source, str(record["task_id"]), suffix))
