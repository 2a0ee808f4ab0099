"""Small files kept beside the messages: the root marker, queue configurations, and the records,
ledgers and markers of the layers above (pub/sub cursors, SQS move tasks and receive attempts,
Spark ledgers). Each is rewritten whole, never edited in place.

Theory of operation. The content is written to a temp file in the same directory,

    <final name>.<32 lowercase hex digits>.tmp

(a fresh random nonce each time: writers in other threads, processes or hosts never share one),
then renamed over the final name (`replace_file`) or linked to it (`create_file`: `link(2)`
refuses an existing name, so of several writers exactly one creates it, with no lock). Readers,
and a crash at any point, see the old content or the new, never a torn file. No `flock`: it
silently fails on NFS.

Durability is the caller's choice, per file:
- `durable=True`: the temp file is fsynced before the rename and the directory after it, so
  once the call returns the new content survives a machine crash;
- `durable=False`: nothing is flushed (records that are rebuilt, or whose loss is harmless).
  A process crash still leaves the old content or the new; a machine crash may also leave
  the old content, or an empty or partial file on filesystems that do not order data before
  the rename: readers of such records must treat a damaged one as absent.

A writer that dies between writing and renaming leaves its temp file behind. Nothing else
creates names of this shape, so any such file older than `STALE_TEMP_S` (no write of a small
file takes that long) is a leftover: the owners' recovery and `dirmq fsck --repair` remove them
(`remove_stale_temps`), and fsck reports them.

Errors are the failing call's `OSError`, raised after the temp file is removed; callers map
them at their boundary (`errors.storage_error`), as the rest of the store does.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

from dirmq.store.filemodes import Access
from dirmq.store.fsio import fsync_dir, write_new_file
from dirmq.store.recovery import older_than

TEMP_SUFFIX = ".tmp"
STALE_TEMP_S = 3600.0
_TEMP_RE = re.compile(r"(.+)\.[0-9a-f]{32}\.tmp")


def temp_path(path: str) -> str:
    """A fresh temp name for a write of `path`, in the same directory."""
    return f"{path}.{uuid.uuid4().hex}{TEMP_SUFFIX}"


def temp_target(name: str) -> str | None:
    """The final name a temp file named `name` was written for, or None if `name` is not a
    temp name of this scheme."""
    match = _TEMP_RE.fullmatch(name)
    return match.group(1) if match else None


def replace_file(
    path: str, data: bytes, *, durable: bool, access: Access, make_parents: bool = False
) -> None:
    """Write `path` with `data`, replacing what was there, all or nothing; a new file with the
    root's `access`. `make_parents`: create missing parent directories (with `access` too;
    otherwise FileNotFoundError)."""
    temp = _write_temp(path, data, durable=durable, access=access, make_parents=make_parents)
    try:
        os.replace(temp, path)
    except BaseException:
        _unlink_quietly(temp)
        raise
    if durable:
        fsync_dir(_directory(path))


def create_file(
    path: str, data: bytes, *, durable: bool, access: Access, make_parents: bool = False
) -> bool:
    """Create `path` with `data` (with the root's `access`) unless the name exists; True if this
    call created it. Of writers racing for one name (threads, processes, hosts) exactly one gets
    True."""
    temp = _write_temp(path, data, durable=durable, access=access, make_parents=make_parents)
    try:
        try:
            os.link(temp, path)
        except FileExistsError:
            # Over NFS a retransmitted LINK whose first reply was lost reports EEXIST although
            # it succeeded: then the temp file has two names.
            if os.lstat(temp).st_nlink < 2:
                return False
    finally:
        _unlink_quietly(temp)
    if durable:
        fsync_dir(_directory(path))
    return True


def read_file(path: str) -> bytes | None:
    """The content of `path`, or None if it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def find_temps(directory: str, *, recursive: bool = False) -> Iterator[str]:
    """Paths of the temp files of this scheme in `directory` (and below it, with `recursive`;
    symlinks are not followed). A directory that vanishes meanwhile yields nothing."""
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            if recursive:
                yield from find_temps(entry.path, recursive=True)
        elif temp_target(entry.name) is not None:
            yield entry.path


def remove_stale_temps(
    directory: str, *, recursive: bool = False, older_than_s: float = STALE_TEMP_S
) -> int:
    """Unlink the temp files in `directory` older than `older_than_s`; returns how many.
    Housekeeping never fails: what cannot be listed or unlinked now (gone already, a disk that
    refuses) is left for the next time."""
    removed = 0
    try:
        for path in find_temps(directory, recursive=recursive):
            if older_than(path, older_than_s):
                try:
                    os.unlink(path)
                    removed += 1
                except OSError:
                    pass
    except OSError:
        pass
    return removed


def _write_temp(
    path: str, data: bytes, *, durable: bool, access: Access, make_parents: bool
) -> str:
    temp = temp_path(path)
    try:
        fd = write_new_file(temp, data, access)
    except FileNotFoundError:
        if not make_parents:
            raise
        access.makedirs(_directory(path))
        fd = write_new_file(temp, data, access)
    try:
        if durable:
            os.fsync(fd)
    except BaseException:
        _unlink_quietly(temp)
        raise
    finally:
        os.close(fd)
    return temp


def _directory(path: str) -> str:
    return os.path.dirname(path) or "."


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
