"""prometheus-client's multiprocess mode, one private directory per server run.

With `--workers N` each worker is its own process: counters kept in its memory would answer a
scrape with whichever worker took the connection (7, 3, 7, ...). In multiprocess mode every
metric value lives in a file of its process (`counter_<pid>.db`, ... : an mmap that an increment
writes through), and a scrape in any worker reads every file through `MultiProcessCollector`
and adds them up. A worker that dies leaves its files: its counts still count, so counters
never go backwards when it is replaced; `process_dead` drops only its live gauges. One worker
is served the same way (one code path).

prometheus-client picks the class of every value (in memory, or in such a file) from the
environment when `prometheus_client.values` is first imported, which is long before `serve`
runs. So `MetricsFiles.create` sets the class itself (`values.ValueClass`, the module attribute
every metric reads when it makes a value), before any metric is made, and `Metrics` refuses to
start on any other class.

The directory is made per run (mode 0700, empty, `dirmq-metrics.<process>.*` in /dev/shm, with
the server's identity (store/processes.py): the files are written at every request, memory is
where they belong; else the temp directory), removed when the server exits; one that a killed
server left behind is removed by the next start once that process is dead (`liveness`; an
earlier version's `dirmq-metrics-<pid>-*` names too little to tell, and is left alone).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from prometheus_client import values
from prometheus_client.multiprocess import mark_process_dead

from dirmq.store.processes import Liveness, current, liveness, parse_token

ENVIRONMENT = "PROMETHEUS_MULTIPROC_DIR"
_PREFIX = "dirmq-metrics."  # not an earlier version's "dirmq-metrics-<pid>-": it would judge us
_LEFT_BEHIND = re.compile(r"dirmq-metrics\.([0-9a-f.]+)\.")

_pid = os.getpid()  # not a getpid(2) per increment: prometheus-client asks at every one


def _after_fork() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_after_fork)


def _process_id() -> int:
    return _pid


class MetricsFiles:
    """The directory of one server run's metric files; `create` makes it and switches
    prometheus-client to it for this process and every worker it forks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.value_class: type | None = None
        self._previous: tuple[type, str | None] | None = None

    @classmethod
    def create(cls, parent: str | None = None) -> MetricsFiles:
        """A new empty directory (0700) under `parent` (default: /dev/shm, or where that
        cannot be written the temp directory), active in this process."""
        prefix = f"{_PREFIX}{current().token()}."
        if parent is not None:
            path = tempfile.mkdtemp(prefix=prefix, dir=parent)
        else:
            try:
                parent = _default_parent()
                path = tempfile.mkdtemp(prefix=prefix, dir=parent)
            except OSError:  # /dev/shm full or read-only
                parent = tempfile.gettempdir()
                path = tempfile.mkdtemp(prefix=prefix, dir=parent)
        _remove_left_behind(parent, keep=path)
        files = cls(path)
        files.activate()
        return files

    def activate(self) -> None:
        """Every metric made from now on in this process (and in its forks) keeps its values
        in this directory."""
        if self._previous is None:
            self._previous = (values.ValueClass, os.environ.get(ENVIRONMENT))
        os.environ[ENVIRONMENT] = self.path  # for anything that reads it (mark_process_dead)
        self.value_class = values.MultiProcessValue(_process_id)  # type: ignore[no-untyped-call]
        values.ValueClass = self.value_class

    @property
    def active(self) -> bool:
        return self.value_class is not None and values.ValueClass is self.value_class

    def process_dead(self, pid: int) -> None:
        """A worker died: its live gauges (attached subscriptions) stop counting; its counters
        and histograms stay, so totals never go backwards."""
        mark_process_dead(pid, self.path)  # type: ignore[no-untyped-call]

    def remove(self) -> None:
        """At exit: the files go, and this process's metrics are in memory again."""
        if self._previous is not None:
            value_class, environment = self._previous
            if values.ValueClass is self.value_class:
                values.ValueClass = value_class
            if environment is None:
                os.environ.pop(ENVIRONMENT, None)
            else:
                os.environ[ENVIRONMENT] = environment
            self._previous = None
        self.value_class = None
        close_files = getattr(values, "close_all_multiprocess_files", None)  # 0.21 on
        if close_files is not None:
            close_files()
        shutil.rmtree(self.path, ignore_errors=True)

    def __enter__(self) -> MetricsFiles:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.remove()


def _default_parent() -> str:
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK):
        return shm
    return tempfile.gettempdir()


def _remove_left_behind(parent: str, keep: str) -> None:
    """The directories of our servers that were killed before they could remove theirs."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for entry in entries:
        match = _LEFT_BEHIND.match(entry.name)
        owner = parse_token(match.group(1)) if match else None
        if owner is None or entry.path == keep or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
        except OSError:
            continue  # gone meanwhile
        if liveness(owner) is Liveness.DEAD:
            shutil.rmtree(entry.path, ignore_errors=True)
