"""Which subscriptions are attached right now, for `everyone` fan-out.

An attached subscription has `present/<name>`, whose mtime its session refreshes every third of
the presence timeout; a file older than the timeout belongs to a session that died (the sweeper
removes it). Publishers cache the list and re-read it when the directory changes (an attach or
detach anywhere changes its mtime) or after `MAX_CACHE_S`, which is how stale sessions drop out.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.model import Filter

MAX_CACHE_S = 1.0


@dataclass(frozen=True, slots=True)
class Attached:
    name: str
    filter: Filter
    attached_ms: int


def read_subscription(paths: PubSubPaths, name: str) -> tuple[Filter, int] | None:
    try:
        with open(paths.subscription_file(name), "rb") as f:
            data = json.load(f)
        return Filter.from_json(data["filter"]), int(data["attached_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class PresenceIndex:
    def __init__(self, paths: PubSubPaths, timeout_s: float) -> None:
        self._paths = paths
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._stamp: int | None = None
        self._read_at = 0.0
        self._attached: list[Attached] = []

    def invalidate(self) -> None:
        with self._lock:
            self._stamp = None

    def attached(self) -> list[Attached]:
        now = time.monotonic()
        stamp = os.stat(self._paths.present).st_mtime_ns
        with self._lock:
            if stamp == self._stamp and now - self._read_at < MAX_CACHE_S:
                return self._attached
        fresh: list[Attached] = []
        for name in sorted(os.listdir(self._paths.present)):
            if not self.is_fresh(name):
                continue
            found = read_subscription(self._paths, name)
            if found is not None:
                fresh.append(Attached(name, *found))
        with self._lock:
            self._stamp, self._read_at, self._attached = stamp, now, fresh
        return fresh

    def is_fresh(self, name: str) -> bool:
        """Attached: refreshed within the timeout by a session that is not known to be dead."""
        path = os.path.join(self._paths.present, name)
        try:
            age = time.time() - os.stat(path).st_mtime
            with open(path, encoding="utf-8") as f:
                owner = f.read()
        except FileNotFoundError:
            return False
        return age <= self.timeout_s and not _owner_died(owner)


def new_session() -> str:
    """What a session writes in its presence file: host, pid and a random token."""
    return f"{socket.gethostname()} {os.getpid()} {uuid.uuid4().hex}"


def _owner_died(owner: str) -> bool:
    """True when the session was on this host and its process is gone (a killed server restarts
    and its subscribers re-attach at once, without waiting for the presence timeout)."""
    parts = owner.split()
    if len(parts) != 3 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    try:
        os.kill(int(parts[1]), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
