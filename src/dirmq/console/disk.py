"""The disk behind the console: free space and inodes of the root's filesystem, and the files
and bytes of each of a queue's state directories."""

from __future__ import annotations

import os
from dataclasses import dataclass

from dirmq.store import backlog, delays, layout

LOW_FRACTION = 0.10  # below this much free space or inodes, the overview warns
LISTED_UP_TO = 10_000  # a state directory with more entries is counted, not measured


@dataclass(frozen=True, slots=True)
class FreeSpace:
    total_bytes: int
    free_bytes: int
    total_inodes: int
    free_inodes: int

    @property
    def low_space(self) -> bool:
        return self.total_bytes > 0 and self.free_bytes < LOW_FRACTION * self.total_bytes

    @property
    def low_inodes(self) -> bool:
        return self.total_inodes > 0 and self.free_inodes < LOW_FRACTION * self.total_inodes


def free_space(root: str) -> FreeSpace:
    """What `statvfs` says of the root's filesystem (space an unprivileged user may use)."""
    found = os.statvfs(root)
    return FreeSpace(
        found.f_blocks * found.f_frsize,
        found.f_bavail * found.f_frsize,
        found.f_files,
        found.f_favail,
    )


@dataclass(frozen=True, slots=True)
class StateDir:
    name: str
    files: int | None  # None: counted in @ready's (a deep queue's backlog)
    size_bytes: int | None  # None: not measured (a deep @ready: its count is the census's)


def disk_of(queue_path: str, ready: int) -> list[StateDir]:
    """Files and bytes of each state directory of a queue. @ready of a deep queue (more than
    `LISTED_UP_TO` ready) is not listed: its count is `ready` (the census's)."""
    found = []
    for name in layout.STATE_DIRS:
        path = os.path.join(queue_path, name)
        if name == layout.READY and ready > LISTED_UP_TO:
            found.append(StateDir(name, ready, None))
            continue
        if name == layout.BACKLOG:
            found.append(_backlog_of(queue_path, ready))
            continue
        files = 0
        total = 0
        # @delayed holds buckets (store/delays.py): their files are what it holds.
        paths = [path]
        if name == layout.DELAYED:
            paths += [os.path.join(path, str(m)) for m in delays.top(queue_path)[0]]
        for each in paths:
            try:
                with os.scandir(each) as entries:
                    for entry in entries:
                        if each == path and entry.is_dir(follow_symlinks=False):
                            continue  # a bucket of @delayed: its files are counted
                        files += 1
                        if files > LISTED_UP_TO:
                            continue  # counted on, no longer measured
                        try:
                            total += entry.stat(follow_symlinks=False).st_size
                        except FileNotFoundError:
                            files -= 1
            except FileNotFoundError:
                pass
        found.append(StateDir(name, files, total if files <= LISTED_UP_TO else None))
    return found


def _backlog_of(queue_path: str, ready: int) -> StateDir:
    """The backlog's message files, bucket by bucket (docs/FORMAT.md, "The backlog"); in a deep
    queue (more than `LISTED_UP_TO` ready) not listed: counted with @ready, in the census's
    `ready`, and shown there."""
    if ready > LISTED_UP_TO:
        return StateDir(layout.BACKLOG, None, None)
    files = total = 0
    for _relative, path in backlog.buckets(queue_path):
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    try:
                        total += entry.stat(follow_symlinks=False).st_size
                        files += 1
                    except FileNotFoundError:
                        continue
        except FileNotFoundError:
            continue
    return StateDir(layout.BACKLOG, files, total)
