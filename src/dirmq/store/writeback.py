"""The background flush behind `writeback` durability: what was renamed into place with no
flush (a queue's `writeback` publishes; pub/sub's) is made durable at most a given delay later
(a queue's `writeback_delay_s`) by one `syncfs` for all that was written meanwhile; on a shared
filesystem, where `syncfs` flushes nothing, each held file is `fsync`ed first. A Store's close
and the Spark writer flush at once (`flush_now`). A crash within the delay loses what was not
flushed yet (docs/FORMAT.md, "Durability")."""

from __future__ import annotations

import os
import threading
import time

from dirmq.store import fsio

# At most this many published files' descriptors wait for a shared filesystem's writeback
# flush; one more flushes them all at once (a bound on descriptors, not on the delay).
MAX_HELD_FILES = 1024


class WritebackFlusher:
    """Flushes a filesystem in the background at most `delay_s` after the first dirty write.

    On a shared filesystem `syncfs` flushes nothing (FUSE passes it on only to filesystems that
    ask for it: docs/FORMAT.md, "Filesystems"), so there each published file is flushed itself:
    `hold` keeps a descriptor of it (a duplicate taken before its rename, so a consumer moving
    it meanwhile changes nothing) until the flush fsyncs and closes it."""

    def __init__(self, dir_path: str) -> None:
        self._dir_path = dir_path
        self._cond = threading.Condition()
        self._dirty_deadline: float | None = None
        self._thread: threading.Thread | None = None
        self._held: list[int] = []  # descriptors of files to fsync at the next flush
        self.last_error: OSError | None = None

    def hold(self, fds: list[int], delay_s: float, now: float) -> None:
        """Take `fds` (descriptors of published files, closed by the flush) and flush them
        within `delay_s`; at once when `MAX_HELD_FILES` are waiting."""
        with self._cond:
            self._held.extend(fds)
            full = len(self._held) >= MAX_HELD_FILES
        self.mark_dirty(0.0 if full else delay_s, now)

    def mark_dirty(self, delay_s: float, now: float) -> None:
        with self._cond:
            deadline = now + delay_s
            if self._dirty_deadline is None or deadline < self._dirty_deadline:
                self._dirty_deadline = deadline
                self._cond.notify()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="dirmq-writeback", daemon=True
                )
                self._thread.start()

    def flush_now(self) -> None:
        with self._cond:
            self._dirty_deadline = None
        self._sync()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._dirty_deadline is None:
                    if not self._cond.wait(timeout=5.0):
                        self._thread = None
                        return
                delay = self._dirty_deadline - time.monotonic()
                if delay > 0:
                    self._cond.wait(timeout=delay)
                    continue
                self._dirty_deadline = None
            self._sync()

    def _sync(self) -> None:
        with self._cond:
            held, self._held = self._held, []
        error: OSError | None = None
        for fd in held:
            try:
                os.fsync(fd)
            except OSError as exc:
                error = error or exc
            finally:
                os.close(fd)
        try:
            fd = os.open(self._dir_path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fsio.syncfs(fd)  # by the module: what tests that count flushes wrap
            finally:
                os.close(fd)
        except OSError as exc:
            error = error or exc
        if error is not None:  # reported through stats; the data stays in the page cache
            self.last_error = error
