"""Which subscriptions are attached right now, for `everyone` fan-out.

An attached subscription has `present/<name>`, whose mtime its session refreshes every third of
the presence timeout; a file older than the timeout, or whose process is dead
(`processes.liveness` of the identity in it), belongs to a session that died (the sweeper
removes it). Publishers cache the list and re-read it when the directory changes (an attach or
detach anywhere changes its mtime) or after `MAX_CACHE_S`, which is how stale sessions drop out.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass

from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.model import Filter
from dirmq.store.processes import Liveness, current, liveness, parse_token

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
        seen = self._look(os.path.join(self._paths.present, name))
        return seen is not None and seen[0]

    def _look(self, path: str) -> tuple[bool, str] | None:
        """(fresh, owner) of a presence file, None if there is none."""
        try:
            age = time.time() - os.stat(path).st_mtime
            with open(path, encoding="utf-8", errors="replace") as f:
                owner = f.read()
        except FileNotFoundError:
            return None
        return age <= self.timeout_s and not _owner_died(owner), owner

    def remove_stale(self, name: str) -> bool:
        """Remove `present/<name>` if it is stale; True when none is left. Never removes a fresh
        one that replaced the stale one meanwhile: there is no compare-and-unlink, so the file is
        first renamed to a unique name (atomic: one process gets it), then checked to be the very
        session judged stale, and put back otherwise."""
        path = os.path.join(self._paths.present, name)
        seen = self._look(path)
        if seen is None:
            return True
        fresh, owner = seen
        if fresh:
            return False
        aside = os.path.join(self._paths.tmp, f"present.{uuid.uuid4().hex}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return True  # another process removed it first
        try:
            taken = self._look(aside)
            if taken is not None and (taken[0] or taken[1] != owner):
                # Not the stale session: it was replaced by a fresh one, or refreshed by its
                # owner after all. Back where it was, unless a newer one is there already.
                with contextlib.suppress(FileExistsError):
                    os.link(aside, path)
                return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(aside)
        self.invalidate()
        return True


def new_session() -> str:
    """What a session writes in its presence file: its process's identity and a random token."""
    return f"{current().token()} {uuid.uuid4().hex}"


def _owner_died(owner: str) -> bool:
    """True when the session's process is dead for sure (`processes.liveness`): a killed server
    restarts and its subscribers re-attach at once, without waiting for the presence timeout.
    An earlier version's "<host name> <pid> <token>" says too little: its heartbeat decides."""
    parts = owner.split()
    process = parse_token(parts[0]) if len(parts) == 2 else None
    return process is not None and liveness(process) is Liveness.DEAD
