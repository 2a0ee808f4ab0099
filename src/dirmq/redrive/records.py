"""Where redrive tasks live, so that every process serving a root (and `dirmq redrive`) shares
them: `<root>/@redrive/<source queue, percent-encoded>/`

- `<task id>.json`: the task (status, counts, destination...), rewritten whole (`smallfiles`)
  by the process running it after every batch, and at the end;
- `runner.<generation>`: the hold (`store/holds.py`) of the process that runs the source's
  active task. At most one task of a source is active, and only the holder runs it, writes its
  record or starts another task of the source:
  - *starting* takes the hold (of processes starting at once exactly one gets it), checks that
    no task of the source is active, and writes the new record;
  - the runner renews the hold before and after every batch and every few seconds meanwhile; a
    RUNNING or CANCELLING record whose hold is not alive (its process is gone from this host,
    or it was not renewed for HOLD_TIMEOUT_S) belongs to a process that died: the next process
    to look takes the hold and carries on;
  - a runner that finds its hold taken over (it stalled past the timeout) stops at once and
    writes nothing more: the new holder carries on from the last record;
- `<task id>.cancel`: a cancel asked by any process (`DELETE /{queue}/redrive/{task}`, SQS's
  CancelMessageMoveTask, `dirmq redrive --cancel`); the runner looks for it between chunks.

No `flock` (it silently fails on NFS): `link`, `rename`, `utime` and listings only.

The newest HISTORY records of a source are kept, finished or not; older finished ones go.
Records are not flushed: after a machine crash a task may resume from an earlier cursor, which
moves nothing twice (each move is a rename: what was moved is no longer there, tasks.py).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Protocol
from urllib.parse import quote, unquote

from dirmq.store import holds, layout, smallfiles
from dirmq.store.filemodes import Access
from dirmq.store.holds import Hold

HISTORY = 10  # task records kept per source queue
HOLD_TIMEOUT_S = 30.0  # a runner not renewing its hold for this long is taken over
RUNNER_PREFIX = "runner."
_ACTIVE = ("RUNNING", "CANCELLING")


class TaskLike(Protocol):
    task_id: str
    source: str
    status: str

    def record(self) -> dict[str, object]: ...


class TaskFiles:
    """The move-task files of one root. Thread-safe (calls come from a thread pool)."""

    def __init__(
        self, root: str, *, access: Access, hold_timeout_s: float = HOLD_TIMEOUT_S
    ) -> None:
        self._dir = os.path.join(root, layout.REDRIVE_DIR)
        self._access = access  # the root's: the modes of the files made here
        self._hold_timeout_s = hold_timeout_s
        self._held: dict[str, tuple[str, Hold]] = {}  # source -> (task id, our hold)

    def sources(self) -> list[str]:
        try:
            return sorted(unquote(name) for name in os.listdir(self._dir))
        except FileNotFoundError:
            return []

    def _source_dir(self, source: str) -> str:
        """One directory per source queue, whatever its nesting (`a/b` is `a%2Fb`)."""
        return os.path.join(self._dir, quote(source, safe=""))

    def load(self, source: str) -> list[tuple[dict[str, Any], bool]]:
        """Every record of `source` (and whether its cancellation was asked), newest first."""
        directory = self._source_dir(source)
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return []
        found: list[tuple[dict[str, Any], bool]] = []
        for name in names:
            if not name.endswith(".json"):
                continue
            record = _read_record(os.path.join(directory, name))
            if record is not None:
                cancel = os.path.exists(self._path(source, str(record["task_id"]), ".cancel"))
                found.append((record, cancel))
        found.sort(key=lambda item: int(item[0].get("started_ms", 0)), reverse=True)
        return found

    def create(self, task: TaskLike) -> bool:
        """Record a new task and hold its source, unless another task of the source is active
        or being started (False)."""
        hold = self._take(task.source)
        if hold is None:
            return False  # running somewhere, or another start is under way
        if any(record.get("status") in _ACTIVE for record, _cancel in self.load(task.source)):
            hold.release()  # an orphan that the next look resumes
            return False
        self._held[task.source] = (task.task_id, hold)
        self._write(task)
        self._prune(task.source)
        return True

    def try_own(self, task: TaskLike) -> bool:
        """Take over an active task whose process is gone; False if it is alive or finished."""
        if task.source in self._held:
            return False  # this process runs the source's task, or is starting one
        hold = self._take(task.source)
        if hold is None:
            return False
        record = _read_record(self._path(task.source, task.task_id, ".json"))
        if record is None or record.get("status") not in _ACTIVE:
            hold.release()  # it finished between our reading and our taking the hold
            return False
        self._held[task.source] = (task.task_id, hold)
        return True

    def renew(self, task: TaskLike) -> bool:
        """Renew this process's hold on `task`; False if it was taken over (stop running it)."""
        held = self._held.get(task.source)
        return held is not None and held[0] == task.task_id and held[1].renew()

    def save(self, task: TaskLike) -> bool:
        """Record the task's progress if this process still holds it; False if not."""
        if not self.renew(task):
            return False
        self._write(task)
        return True

    def finish(self, task: TaskLike) -> None:
        """The task has its final status: record it, forget the cancel request, let go. A task
        taken over by another process is left to it untouched."""
        held = self._held.get(task.source)
        if held is None or held[0] != task.task_id:
            return
        del self._held[task.source]
        hold = held[1]
        try:
            if hold.renew():
                self._write(task)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(task.source, task.task_id, ".cancel"))
        finally:
            hold.release()
        self._prune(task.source)

    def release(self, task: TaskLike) -> None:
        """Let go of `task` without finishing it (this process is closing): its record stays
        active, and the next process to look carries on from it."""
        held = self._held.get(task.source)
        if held is not None and held[0] == task.task_id:
            del self._held[task.source]
            held[1].release()

    def request_cancel(self, task: TaskLike) -> None:
        path = self._path(task.source, task.task_id, ".cancel")
        os.close(self._access.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC))

    def cancel_requested(self, task: TaskLike) -> bool:
        return os.path.exists(self._path(task.source, task.task_id, ".cancel"))

    def _path(self, source: str, task_id: str, suffix: str) -> str:
        return os.path.join(self._source_dir(source), task_id + suffix)

    def _take(self, source: str) -> Hold | None:
        directory = self._source_dir(source)
        taken = holds.take(directory, RUNNER_PREFIX, self._hold_timeout_s, access=self._access)
        return taken if isinstance(taken, Hold) else None

    def _write(self, task: TaskLike) -> None:
        data = json.dumps(task.record(), separators=(",", ":")).encode()
        path = self._path(task.source, task.task_id, ".json")
        # Not durable: see the module docstring.
        smallfiles.replace_file(path, data, durable=False, access=self._access)

    def _prune(self, source: str) -> None:
        for record, _cancel in self.load(source)[HISTORY:]:
            if record.get("status") in _ACTIVE:
                continue
            for suffix in (".json", ".cancel", ".lock"):  # .lock: left by flock-based versions
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self._path(source, str(record["task_id"]), suffix))
        smallfiles.remove_stale_temps(self._source_dir(source))


def _read_record(path: str) -> dict[str, Any] | None:
    """The task record at `path`, or None if it vanished (pruned) or is damaged: not a task."""
    try:
        record = json.loads(smallfiles.read_file(path) or b"")
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "task_id" in record else None
