"""What the overview shows of each queue's flow settings (issue 36): paused, priority levels,
delivery rate limit, default time to live. They live in the queue's `@queue.json`, which the
census does not read; reading 1,000 of them at every refresh would be 1,000 opens every 2 s.
A `FlagsCache` (one per worker, beside the census) keeps what each file said by its inode and
mtime: the file is replaced whole on every change (store/config.py), so an unchanged (inode,
mtime) means unchanged settings, and a refresh costs one `stat` a queue. Every queue's flags
are known, not only the shown page's, so "paused only" filters the whole root.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from dirmq.errors import ConfigError
from dirmq.store import QueueConfig, layout
from dirmq.store.names import queue_path


@dataclass(frozen=True, slots=True)
class QueueFlags:
    paused: bool = False
    priority_levels: int = 1
    delivery_rate_per_s: float | None = None
    message_ttl_s: float | None = None
    ttl_action: str = "dead-letter"
    unreadable: bool = False  # the file does not parse (fsck says why): shown, not hidden

    @classmethod
    def of(cls, config: QueueConfig) -> QueueFlags:
        return cls(
            paused=config.paused,
            priority_levels=config.priority_levels,
            delivery_rate_per_s=config.delivery_rate_per_s,
            message_ttl_s=config.message_ttl_s,
            ttl_action=config.ttl_action,
        )


PLAIN = QueueFlags()


class FlagsCache:
    """Each queue's `QueueFlags`, read again only when its `@queue.json` changed (thread-safe:
    the views run on the broker's pool)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.reads = 0  # files read (for tests: an unchanged file is not read again)
        self._kept: dict[str, tuple[tuple[int, int, int], QueueFlags]] = {}
        self._lock = threading.Lock()

    def flags(self, name: str) -> QueueFlags:
        path = os.path.join(queue_path(self.root, name), layout.CONFIG_FILE)
        try:
            st = os.stat(path)
        except OSError:  # deleted meanwhile: the census leaves it out next time
            return PLAIN
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        with self._lock:
            kept = self._kept.get(name)
        if kept is not None and kept[0] == stamp:
            return kept[1]
        try:
            with open(path, "rb") as file:
                found = QueueFlags.of(QueueConfig.loads(file.read()))
        except ConfigError:
            found = QueueFlags(unreadable=True)
        except OSError:
            return PLAIN
        with self._lock:
            self.reads += 1
            self._kept[name] = (stamp, found)
        return found

    def forget_except(self, names: set[str]) -> None:
        """Drop what is kept of queues no longer in the root."""
        with self._lock:
            for name in [n for n in self._kept if n not in names]:
                del self._kept[name]
