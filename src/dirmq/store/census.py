"""Every queue's depth read from its state directories' file names, without opening it.

`Queue.stats` counts from the queue's index, which a process builds on first use (a listing of
every state directory, recovery of what crashed processes left) and keeps with inotify watches
for as long as the queue is open. A census of a whole root (a metrics scrape) must not do that
to every queue: it would keep four watches and an index per queue for the process's lifetime.
Here each queue costs four directory listings and nothing stays behind: the names say it all
(layout.py): a ready name is its message id (publish time first), a lease or a delay carries its
deadline or due time. The counts are those `Queue.stats` gives (expired leases and due delays
count as ready), as of the listing: messages move meanwhile, and a census does not promote.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dirmq.errors import QueueNotFound, storage_error
from dirmq.store import layout
from dirmq.store.filesystems import resolve_shared
from dirmq.store.ids import id_time_us
from dirmq.store.layout import ID_LENGTH, parse_entry
from dirmq.store.message import QueueStats
from dirmq.store.names import queue_path


@dataclass(frozen=True, slots=True)
class QueueDepth:
    name: str
    stats: QueueStats


def census(root: str | os.PathLike[str], shared: bool | None = None) -> Iterator[QueueDepth]:
    """The depth of every queue under `root`, in no particular order. A queue deleted while
    the census runs is left out. `shared`: the shared-filesystem mode (None: from the
    filesystem), where an id listed in two states counts once."""
    top = os.path.abspath(os.fspath(root))
    dedupe = resolve_shared(shared, top)
    for name, path in queue_dirs(top):
        try:
            yield QueueDepth(name, _depth(path, dedupe))
        except FileNotFoundError:
            continue  # deleted while we looked
        except OSError as exc:
            raise storage_error(exc, f"counting the messages of queue {name!r}") from exc


def queue_depth(root: str | os.PathLike[str], name: str, shared: bool | None = None) -> QueueStats:
    """The depth of queue `name` (QueueNotFound if there is none), as `census` reads it."""
    path = queue_path(os.path.abspath(os.fspath(root)), name)
    dedupe = resolve_shared(shared, path)
    if not os.path.exists(os.path.join(path, layout.CONFIG_FILE)):
        raise QueueNotFound.missing(name)
    try:
        return _depth(path, dedupe)
    except FileNotFoundError:
        raise QueueNotFound.missing(name) from None
    except OSError as exc:
        raise storage_error(exc, f"counting the messages of queue {name!r}") from exc


def queue_dirs(root: str) -> Iterator[tuple[str, str]]:
    """(name, path) of every queue directory under `root`, as `Store.list_queues` finds them:
    a directory holding @queue.json; `@` directories are the store's own, never queues."""
    pending = [(root, "")]
    while pending:
        path, name = pending.pop()
        is_queue = False
        try:
            with os.scandir(path) as entries:
                for entry in entries:
                    child = entry.name
                    if child[0] == "@":
                        is_queue = is_queue or child == layout.CONFIG_FILE
                    elif entry.is_dir(follow_symlinks=False):
                        pending.append((entry.path, f"{name}/{child}" if name else child))
        except (FileNotFoundError, NotADirectoryError):
            continue  # deleted while we walked
        if is_queue and name:
            yield name, path


def _depth(path: str, dedupe: bool) -> QueueStats:
    """What `maintenance.stats` counts, from one listing of each state directory. Names that
    are not the store's are left out, as the index leaves them out."""
    now_ms = time.time_ns() // 1_000_000
    # A listing on a shared filesystem may show a file another host is renaming under both
    # names (docs/FORMAT.md, "Filesystems"): there each id counts once, leased before ready.
    leased = _listing(path, layout.LEASED)
    leased_ids = {name[:ID_LENGTH] for name in leased} if dedupe else set()
    ready = 0
    oldest = ""  # the least message id ready, or whose lease has expired
    for name in _listing(path, layout.READY):
        if leased_ids and name[:ID_LENGTH] in leased_ids:
            continue
        if len(name) == ID_LENGTH:  # a message never received: most of a backlog
            if name[16] == "-" and name[:16].isdigit():
                ready += 1
                if not oldest or name < oldest:
                    oldest = name
        elif (entry := parse_entry(name)) is not None and entry.at_ms is None:
            ready += 1
            if not oldest or entry.message_id < oldest:
                oldest = entry.message_id
    in_flight = 0
    counted: set[str] = set()
    for name in leased:
        entry = parse_entry(name)
        if entry is None or entry.at_ms is None:
            continue
        if dedupe:
            if entry.message_id in counted:
                continue
            counted.add(entry.message_id)
        if entry.at_ms > now_ms:
            in_flight += 1
        else:  # expired: any get takes it back first
            ready += 1
            if not oldest or entry.message_id < oldest:
                oldest = entry.message_id
    delayed = 0
    for name in _listing(path, layout.DELAYED):
        entry = parse_entry(name)
        if entry is None or entry.at_ms is None:
            continue
        if entry.at_ms > now_ms:
            delayed += 1
        else:
            ready += 1
    dead = len(_listing(path, layout.DEAD))
    age = None if not oldest else max(0.0, time.time() - id_time_us(oldest) / 1e6)
    return QueueStats(ready, in_flight, delayed, dead, age)


def _listing(path: str, directory: str) -> list[str]:
    try:
        return os.listdir(f"{path}/{directory}")
    except FileNotFoundError:
        if not os.path.exists(f"{path}/{layout.CONFIG_FILE}"):
            raise  # the queue is gone
        return []  # a state directory missing (fsck recreates it): nothing in that state
