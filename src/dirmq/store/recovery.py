"""Finding what crashed writers left behind: temps in `@tmp/`, and the shared-filesystem
mode's temps beside their final names in `@ready/`, `@delayed/` and their buckets
(`layout.temp_beside`).

A temp file is an orphan when no live writer will ever publish it: its process (the identity in
its name, judged by `processes.liveness`) is dead, or, when that cannot be told (another host or
pid namespace, another naming) or the writer lives, it is older than `ORPHAN_GRACE_S`.
Unnamed O_TMPFILE inodes never need this: the kernel frees them when their writer dies.
"""

from __future__ import annotations

import os
import time

from dirmq.store import layout
from dirmq.store.processes import Liveness, current, liveness

ORPHAN_GRACE_S = 3600.0


def is_orphan(path: str, name: str) -> bool:
    parsed = layout.parse_tmp(name) or layout.parse_temp_beside(name)
    if parsed is not None:
        writer = parsed[1]
        if writer == current():
            return False
        if liveness(writer) is Liveness.DEAD:
            return True
    # A live writer's temp is old only if it leaked (a writer never takes an hour on one).
    return older_than(path, ORPHAN_GRACE_S)


def older_than(path: str, age_s: float) -> bool:
    """Whether `path` was last changed over `age_s` ago; False if it is gone, or its age
    cannot be read now (a failing disk: it is judged again by the next sweep)."""
    try:
        return time.time() - os.lstat(path).st_mtime > age_s
    except OSError:
        return False


def remove_orphans(tmp_dir: str, beside: bool = False) -> int:
    """Unlink every orphan in `tmp_dir`; returns how many (those that cannot be unlinked
    now, on a read-only or failing disk, are left for the next time). `beside`: `tmp_dir` is a
    message directory, where only `temp_beside` names are temps."""
    try:
        names = os.listdir(tmp_dir)
    except FileNotFoundError:
        return 0
    removed = 0
    for name in names:
        if beside and layout.parse_temp_beside(name) is None:
            continue
        path = os.path.join(tmp_dir, name)
        if is_orphan(path, name):
            try:
                os.unlink(path)
                removed += 1
            except OSError:  # gone already, or the disk refuses writes now: found next time
                pass
    return removed
