"""`dirmq fsck` of a queue's @delayed (delays.py): its shape, and each delay in its own bucket.

The message files of @delayed and of its buckets are checked by fsck_messages.py (names, times
and decoding, as any delayed message's); this module finds what is particular to the buckets:
entries of @delayed that are neither a bucket nor a message file (stray, a notice), flat
entries of format 4 (a notice: the next open moves them into their buckets, and so does a
repair), anything in a bucket that is not a file (stray), and delays in a bucket other than the
one of their due minute (misnamed: a get would deliver one late, or, in a bucket of the past,
keep it there until its own time; a repair moves each home), and delays in a directory whose
name is not a minute (misnamed: no process lists it; moved home, the directory removed). One
of fsck.py's `QUEUE_CHECKS`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator

from dirmq.store import delays, layout
from dirmq.store.bounds import MAX_DURATION_S
from dirmq.store.filemodes import Access
from dirmq.store.fsck_findings import Finding, Kind, entries, mover

# Further ahead than this, a delay's time cannot stand: fsck_messages.py re-homes it.
_LONGEST_MS = int(MAX_DURATION_S * 1000) + 86_400_000


def _standing(name: str) -> bool:
    """Whether `name` is a delay whose time can stand (the message check judges the rest)."""
    due = delays.due_of(name)
    return due is not None and due <= time.time_ns() // 1_000_000 + _LONGEST_MS


def findings(queue_dir: str, access: Access) -> Iterator[Finding]:
    for entry in entries(os.path.join(queue_dir, layout.DELAYED)):
        name = entry.name
        if delays.is_bucket(name) and entry.is_dir(follow_symlinks=False):
            yield from _bucket(queue_dir, access, entry)
            continue
        if entry.is_dir(follow_symlinks=False):
            yield from _not_a_bucket(queue_dir, access, entry)
            continue
        if name[:1] == ".":
            continue  # temps beside their final names: the message check's
        if not _standing(name):
            continue  # a bad name or time: the message check re-homes it
        home = delays.relative_dir(name)
        detail = f"a delay of format 4, outside its bucket ({home}): the next open moves it"
        yield Finding(
            Kind.FLAT_DELAY, entry.path, detail, mover(access, entry.path, queue_dir, home)
        )


def _bucket(queue_dir: str, access: Access, bucket: os.DirEntry[str]) -> Iterator[Finding]:
    relative = f"{layout.DELAYED}/{bucket.name}"
    for entry in entries(bucket.path):
        name = entry.name
        if name[:1] == "." or entry.is_dir(follow_symlinks=False):
            if entry.is_dir(follow_symlinks=False):
                yield Finding(Kind.STRAY, entry.path, "a directory in a delay bucket", None)
            continue
        if not _standing(name):
            continue  # a bad name or time: the message check's
        home = delays.relative_dir(name)
        if home != relative:
            detail = f"{name!r} is in bucket {relative}, its due time's is {home}"
            yield Finding(
                Kind.MISNAMED, entry.path, detail, mover(access, entry.path, queue_dir, home)
            )


def _not_a_bucket(queue_dir: str, access: Access, directory: os.DirEntry[str]) -> Iterator[Finding]:
    """A directory of @delayed whose name is not a minute (`0123`, `12x`): no process lists it,
    so delays in it would never be delivered. Each is moved home (misnamed), then the
    directory removed if that emptied it; without delays it is a stray (a notice)."""
    homed = False
    for entry in entries(directory.path):
        name = entry.name
        if name[:1] == "." or not entry.is_file(follow_symlinks=False) or not _standing(name):
            continue
        homed = True
        home = delays.relative_dir(name)
        detail = f"{name!r} is in {directory.name!r}, not a delay bucket; its bucket is {home}"
        yield Finding(Kind.MISNAMED, entry.path, detail, mover(access, entry.path, queue_dir, home))
    detail = "not a delay bucket directory"
    yield Finding(Kind.STRAY, directory.path, detail, _remover(directory.path) if homed else None)


def _remover(path: str) -> Callable[[], str]:
    def remove() -> str:
        try:
            os.rmdir(path)
        except OSError:
            return "kept: it holds other entries"
        return "removed once its delays were moved home"

    return remove
