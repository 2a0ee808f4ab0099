"""Every queue's depth read from its state directories' file names, without opening it.

`Queue.stats` counts from the queue's index, which a process builds on first use (a listing of
every state directory, recovery of what crashed processes left) and keeps with inotify watches
for as long as the queue is open. A census of a whole root (a metrics scrape) must not do that
to every queue: it would keep five watches and an index per queue for the process's lifetime.
Here each queue costs four directory listings and nothing stays behind: the names say it all
(layout.py): a ready name is its message id (publish time first), a lease or a delay carries its
deadline or due time. The counts are those `Queue.stats` gives (expired leases and due delays
count as ready), as of the listing: messages move meanwhile, and a census does not promote.

A listing of a deep `@ready` costs about a second per million messages, which a console that
refreshes every 2 s, a sampler and a metrics scrape would pay again and again. A `Census` kept
by such a caller remembers what a listing of `@ready` and `@dead` said (count, oldest id) by
the directory's mtime: a rename in or out changes it, so an unchanged mtime means an unchanged
listing. An mtime ticks coarsely (a jiffy), so a listing is kept only once the mtime it was
taken under is over `SETTLED_S` old: a change after the listing then gives a newer mtime.
`@leased` is listed each time (small, and what it says depends on the clock), and so are the
buckets of `@delayed` whose minute has begun; a bucket of a minute to come is counted again only
once its mtime changed (delays.py).
On a shared filesystem, where another host's renames may not touch our view of an mtime and an
id may show in two states, nothing is kept.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from dirmq.errors import QueueNotFound, storage_error
from dirmq.store import backlog, layout
from dirmq.store.delays import BucketCounts
from dirmq.store.filesystems import resolve_shared
from dirmq.store.ids import id_time_us
from dirmq.store.layout import ID_LENGTH, parse_entry
from dirmq.store.message import QueueStats
from dirmq.store.names import queue_path

SETTLED_S = 2.0


@dataclass(frozen=True, slots=True)
class QueueDepth:
    name: str
    stats: QueueStats


@dataclass(frozen=True, slots=True)
class _Summary:
    """What a listing of a directory of ready-style names said: how many, the least id."""

    count: int
    oldest: str


@dataclass(frozen=True, slots=True)
class _Kept:
    mtime_ns: int
    summary: _Summary


class Census:
    """Depths of a root's queues, counted from their directories' names (thread-safe).
    `keep`: remember settled listings of @ready and @dead between calls (see the module)."""

    def __init__(
        self, root: str | os.PathLike[str], shared: bool | None = None, *, keep: bool = True
    ) -> None:
        self.root = os.path.abspath(os.fspath(root))
        self.dedupe = resolve_shared(shared, self.root)
        self.keep = keep and not self.dedupe
        self.listings = 0  # directories listed (for tests: a kept listing is not listed again)
        self._kept: dict[str, _Kept] = {}
        self._delay_counts: dict[str, BucketCounts] = {}  # by queue directory
        self._lock = threading.Lock()

    def depths(self) -> Iterator[QueueDepth]:
        """The depth of every queue, in no particular order; a queue deleted meanwhile is left
        out."""
        seen: set[str] = set()
        for name, path in queue_dirs(self.root):
            try:
                yield QueueDepth(name, self.depth(path))
            except FileNotFoundError:
                continue  # deleted while we looked
            except OSError as exc:
                raise storage_error(exc, f"counting the messages of queue {name!r}") from exc
            seen.add(path)
        if self.keep:
            with self._lock:  # forget deleted queues' listings
                for directory in [d for d in self._kept if os.path.dirname(d) not in seen]:
                    del self._kept[directory]
                for directory in [d for d in self._delay_counts if d not in seen]:
                    del self._delay_counts[directory]

    def depth(self, path: str) -> QueueStats:
        """What `maintenance.stats` counts, from one listing (or a kept one) of each state
        directory. Names that are not the store's are left out, as the index leaves them out."""
        now_ms = time.time_ns() // 1_000_000
        # A listing on a shared filesystem may show a file another host is renaming under both
        # names (docs/FORMAT.md, "Filesystems"): there each id counts once, leased before ready.
        leased = self._list(path, layout.LEASED)
        leased_ids = {name[:ID_LENGTH] for name in leased} if self.dedupe else set()
        ready_summary = self._summary(path, layout.READY, leased_ids)
        ready, oldest = ready_summary.count, ready_summary.oldest
        for bucket in backlog.bucket_dirs(path):  # behind @ready, newer than all of it
            behind = self._summary(path, bucket, leased_ids)
            ready += behind.count
            oldest = oldest or behind.oldest
        in_flight = 0
        counted: set[str] = set()
        for name in leased:
            entry = parse_entry(name)
            if entry is None or entry.at_ms is None:
                continue
            if self.dedupe:
                if entry.message_id in counted:
                    continue
                counted.add(entry.message_id)
            if entry.at_ms > now_ms:
                in_flight += 1
            else:  # expired: any get takes it back first
                ready += 1
                if not oldest or entry.message_id < oldest:
                    oldest = entry.message_id
        # @delayed's buckets (delays.py): those of minutes to come counted by a stat while
        # their mtime holds (kept), the begun ones listed (what they say depends on the clock).
        if self.keep:
            with self._lock:
                counts = self._delay_counts.setdefault(path, BucketCounts())
        else:
            counts = BucketCounts()
        self.listings += 1
        delayed, due = counts.count(path, now_ms)
        ready += len(due)
        dead = self._summary(path, layout.DEAD, set()).count
        age = None if not oldest else max(0.0, time.time() - id_time_us(oldest) / 1e6)
        return QueueStats(ready, in_flight, delayed, dead, age)

    def _summary(self, path: str, state: str, leased_ids: set[str]) -> _Summary:
        directory = f"{path}/{state}"
        mtime_ns = 0
        if self.keep:
            try:
                mtime_ns = os.stat(directory).st_mtime_ns
            except FileNotFoundError:
                mtime_ns = 0  # missing: _list says whether the queue is gone
            with self._lock:
                kept = self._kept.get(directory)
            if kept is not None and mtime_ns and kept.mtime_ns == mtime_ns:
                return kept.summary
        if state == layout.DEAD:  # every name there is one dead letter
            summary = _Summary(len(self._list(path, state)), "")
        else:
            summary = _ready_summary(self._list(path, state), leased_ids)
        if self.keep and mtime_ns and time.time_ns() - mtime_ns > SETTLED_S * 1e9:
            with self._lock:
                self._kept[directory] = _Kept(mtime_ns, summary)
        return summary

    def _list(self, path: str, state: str) -> list[str]:
        self.listings += 1
        try:
            return os.listdir(f"{path}/{state}")
        except FileNotFoundError:
            if not os.path.exists(f"{path}/{layout.CONFIG_FILE}"):
                raise  # the queue is gone
            return []  # a state directory missing (fsck recreates it): nothing in that state


def _ready_summary(names: list[str], leased_ids: set[str]) -> _Summary:
    count = 0
    oldest = ""  # the least message id ready
    for name in names:
        if leased_ids and name[:ID_LENGTH] in leased_ids:
            continue
        if len(name) == ID_LENGTH:  # a message never received: most of a backlog
            if name[16] == "-" and name[:16].isdigit():
                count += 1
                if not oldest or name < oldest:
                    oldest = name
        elif (entry := parse_entry(name)) is not None and entry.at_ms is None:
            count += 1
            if not oldest or entry.message_id < oldest:
                oldest = entry.message_id
    return _Summary(count, oldest)


def census(root: str | os.PathLike[str], shared: bool | None = None) -> Iterator[QueueDepth]:
    """The depth of every queue under `root`, listed afresh, in no particular order. A queue
    deleted while the census runs is left out. `shared`: the shared-filesystem mode (None: from
    the filesystem), where an id listed in two states counts once."""
    return Census(root, shared, keep=False).depths()


def queue_depth(root: str | os.PathLike[str], name: str, shared: bool | None = None) -> QueueStats:
    """The depth of queue `name` (QueueNotFound if there is none), as `census` reads it."""
    path = queue_path(os.path.abspath(os.fspath(root)), name)
    if not os.path.exists(os.path.join(path, layout.CONFIG_FILE)):
        raise QueueNotFound.missing(name)
    try:
        return Census(path, shared, keep=False).depth(path)
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
