"""`dirmq fsck` of a queue's backlog (backlog.py): its shape, and each file in its own bucket.

The message files in the buckets are checked as those of @ready are (fsck_messages.py, with the
bucket as the state directory); this module finds what is particular to the backlog:
entries that are neither epoch (or priority level, `p<level>`) nor second directories (stray,
a notice), and messages outside the bucket their id and level name (refilled out of their FIFO
place: misnamed, and a repair moves each home). One of fsck.py's `QUEUE_CHECKS`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from dirmq.store import backlog, layout
from dirmq.store.filemodes import Access
from dirmq.store.fsck_findings import Finding, Kind, entries, mover


def findings(queue_dir: str, access: Access) -> Iterator[Finding]:
    top = os.path.join(queue_dir, layout.BACKLOG)
    for epoch in entries(top):
        if backlog.is_level_dir(epoch.name) and epoch.is_dir(follow_symlinks=False):
            # A priority level's tree (FORMAT.md "Priorities"): epochs only, and messages of
            # its own level only (a message of another level is moved to its level's tree).
            level_root = backlog.level_root(backlog.level_dir_level(epoch.name))
            for inner in entries(epoch.path):
                if not (backlog.is_epoch(inner.name) and inner.is_dir(follow_symlinks=False)):
                    yield Finding(Kind.STRAY, inner.path, "not a backlog epoch directory", None)
                    continue
                yield from _epoch(queue_dir, access, level_root, inner)
            continue
        if not (backlog.is_epoch(epoch.name) and epoch.is_dir(follow_symlinks=False)):
            detail = "not a backlog epoch or priority level directory"
            yield Finding(Kind.STRAY, epoch.path, detail, None)
            continue
        yield from _epoch(queue_dir, access, layout.BACKLOG, epoch)


def _epoch(queue_dir: str, access: Access, root: str, epoch: os.DirEntry[str]) -> Iterator[Finding]:
    for second in entries(epoch.path):
        if not (backlog.is_second(second.name) and second.is_dir(follow_symlinks=False)):
            yield Finding(Kind.STRAY, second.path, "not a backlog bucket directory", None)
            continue
        relative = f"{root}/{epoch.name}/{second.name}"
        for entry in entries(second.path):
            name = entry.name
            if name[:1] == "." or layout.parse_entry(name) is None:
                continue  # temps and bad names: the message check's
            home = backlog.relative_dir(name)
            if home != relative:
                detail = f"{name!r} is in bucket {relative}, its id's and level's is {home}"
                move = mover(access, entry.path, queue_dir, home)
                yield Finding(Kind.MISNAMED, entry.path, detail, move)
