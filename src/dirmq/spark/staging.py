"""The staging directories of writes (`<stateDir>/staging/`, see writing.py): removed so that
nothing can reappear in them, and removed once stale (left by crashed drivers)."""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid

from dirmq.errors import storage_error


def discard_tree(path: str, attempts: int = 5) -> None:
    """Remove a directory tree so that nothing can reappear under `path` afterwards unless
    someone creates the directory again: it is first renamed to a private name (a task that
    opens a file under `path` later finds nothing), then removed. A file created while the
    rename ran (its lookup started before) lands in the renamed tree: removing is retried."""
    private = f"{path}.{uuid.uuid4().hex}.discarded"
    try:
        os.rename(path, private)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise storage_error(exc, f"removing {path}") from exc
    for _ in range(attempts):
        shutil.rmtree(private, ignore_errors=True)
        if not os.path.lexists(private):
            return
    busy = OSError(errno.ENOTEMPTY, f"files keep appearing in {private}")
    raise storage_error(busy, f"removing {path}")


def remove_stale(directory: str, older_than_s: float) -> int:
    """Remove entries of `directory` not modified for `older_than_s` (leftovers of crashed
    drivers); returns how many were removed."""
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError:
        return 0
    cutoff = time.time() - older_than_s
    removed = 0
    for entry in entries:
        try:
            if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:
            pass
    return removed
