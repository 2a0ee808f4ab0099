"""Small files the Spark layer keeps (ledgers, markers, staged rows), written so that a crash
leaves either the old content or the new, never a torn file: temp name, fsync, rename or link,
fsync of the directory. No locks: `link` refuses an existing name, which is how two task attempts
racing to record the same thing agree on one winner.
"""

from __future__ import annotations

import errno
import os
import shutil
import time
import uuid

from dirmq.errors import storage_error
from dirmq.store.fsio import fsync_dir, write_new_file


def _tmp_path(path: str) -> str:
    return f"{path}.{uuid.uuid4().hex}.tmp"


def _write_synced(tmp: str, data: bytes) -> None:
    fd = write_new_file(tmp, data)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: str, data: bytes) -> None:
    """Write `path` atomically and durably, replacing what was there."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = _tmp_path(path)
        _write_synced(tmp, data)
        os.replace(tmp, path)
        fsync_dir(os.path.dirname(path))
    except OSError as exc:
        raise storage_error(exc, f"writing {path}") from exc


def create_file(path: str, data: bytes) -> bool:
    """Create `path` durably with `data` unless it exists; True if this call created it."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = _tmp_path(path)
        _write_synced(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        fsync_dir(os.path.dirname(path))
        return True
    except OSError as exc:
        raise storage_error(exc, f"creating {path}") from exc


def read_file(path: str) -> bytes | None:
    """The content of `path`, or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise storage_error(exc, f"reading {path}") from exc


def remove_tree(path: str) -> None:
    """Remove a directory tree; a tree already gone is fine."""
    shutil.rmtree(path, ignore_errors=True)


def discard_tree(path: str, attempts: int = 5) -> None:
    """Remove a directory tree so that nothing can reappear under `path` afterwards unless
    someone creates the directory again: it is first renamed to a private name (a task that
    opens a file under `path` later finds nothing), then removed. A file created while the
    rename ran (its lookup started before) lands in the renamed tree: removing is retried."""
    private = _tmp_path(path) + ".discarded"
    try:
        os.rename(path, private)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise storage_error(exc, f"removing {path}") from exc
    for _ in range(attempts):
        remove_tree(private)
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
                    remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
                removed += 1
        except FileNotFoundError:
            pass
    return removed
