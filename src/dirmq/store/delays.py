"""Delayed messages in buckets of their due minute, so that opening a queue reads the bucket
names, not every delayed message (root format 5; docs/FORMAT.md, "Delayed messages").

    <queue>/@delayed/<minute>/<id>.<count>.<due_ms>[^<level>][~<tag>]
        minute: due_ms // 60,000 in decimal (no padding): a bucket holds one minute of due times

A process knows the buckets (it lists @delayed and watches it: a bucket made or removed) and
the names of only the buckets whose minute has begun ("loaded": listed once, then kept by a
watch of their own). A bucket not loaded falls due no earlier than its minute's start, which is
all the index needs of it until then. So an open lists @delayed (one entry per minute in which
something is due: at most 525,600 for delays spread over the longest, a year; a few dozen for
the usual ones) and no bucket before its minute. A minute, not a second: a second's buckets
would make @delayed as long as the spread of due times in seconds (86,400 for a day's delays);
an hour's would load a whole hour of due messages when its first one falls due.

A bucket whose minute is over ("past") holds only due messages: it is listed, emptied into
@ready and removed (`rmdir`: one a writer filled meanwhile is not empty and stays, and is
listed again). A writer whose rename into a bucket fails with ENOENT (its minute passed and a
consumer removed it just then) makes it again and renames once more, as a backlog bucket's.

Flat entries of @delayed (`<id>.<count>.<due_ms>`, the layout of format 4 and earlier) are
still delivered: a process that sees one (an open of a root of an earlier format, or a process
of version 4 beside this one) moves it into its bucket (`migrate`), one rename each: a kill at
any instant leaves each message flat or in its bucket, never both or neither.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator

from dirmq.errors import storage_error
from dirmq.store import layout
from dirmq.store.bucketdir import make_bucket_dir
from dirmq.store.filemodes import Access
from dirmq.store.fsio import fsync_dir
from dirmq.store.layout import parse_entry

DELAYED = layout.DELAYED
BUCKET_MS = 60_000  # one minute of due times a bucket
_BUCKET_DIGITS = 11  # due_ms has at most 15 digits (bounds.py): its minute at most 11
_PREPARE_ATTEMPTS = 8


def minute_of(due_ms: int) -> int:
    return due_ms // BUCKET_MS


def is_bucket(name: str) -> bool:
    """Whether an entry of @delayed names a bucket (a minute: digits, no padding)."""
    return (
        0 < len(name) <= _BUCKET_DIGITS
        and name.isdigit()
        and name.isascii()
        and (name[0] != "0" or name == "0")
    )


def bucket_dir(minute: int) -> str:
    """The queue-relative directory of a bucket: `@delayed/<minute>` (what
    `QueueFiles.path` takes as a state directory)."""
    return f"{DELAYED}/{minute}"


def due_of(name: str) -> int | None:
    """The due time in a delayed name, or None if it is not one."""
    entry = parse_entry(name)
    return None if entry is None else entry.at_ms


def relative_dir(name: str) -> str:
    """The bucket of a delayed `name` as a queue-relative directory (from its due time)."""
    due = due_of(name)
    assert due is not None, name
    return bucket_dir(minute_of(due))


def is_bucket_dir(directory: str) -> bool:
    """Whether a queue-relative directory is a delay bucket (`@delayed/<minute>`)."""
    return directory.startswith(f"{DELAYED}/")


def bucket_minute(directory: str) -> int:
    return int(directory[len(DELAYED) + 1 :])


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise storage_error(exc, f"listing {path}") from exc


def top(queue_dir: str) -> tuple[list[int], list[str]]:
    """One listing of @delayed: (its buckets' minutes, oldest first; its flat entries: names of
    an earlier format, to migrate). Other entries (temps, strays, a file of a bucket's name:
    fsck's) are in neither."""
    minutes: list[int] = []
    flat: list[str] = []
    path = os.path.join(queue_dir, DELAYED)
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                name = entry.name
                if is_bucket(name):
                    if entry.is_dir(follow_symlinks=False):
                        minutes.append(int(name))
                elif name[:1] != "." and due_of(name) is not None:
                    flat.append(name)
    except (FileNotFoundError, NotADirectoryError):
        return [], []
    except OSError as exc:
        raise storage_error(exc, f"listing {path}") from exc
    minutes.sort()
    return minutes, flat


def bucket_names(queue_dir: str, minute: int) -> list[str]:
    """The names of one bucket (temps beside their final names left out)."""
    return [n for n in _listdir(os.path.join(queue_dir, DELAYED, str(minute))) if n[:1] != "."]


def names(queue_dir: str) -> Iterator[tuple[str, str]]:
    """(queue-relative directory, name) of every delayed message: the buckets in due order
    (each bucket's names by name), then flat entries not migrated yet. For what must see them
    all (browse, purge, fsck, the Spark snapshot): O(delayed messages)."""
    minutes, flat = top(queue_dir)
    for minute in minutes:
        relative = bucket_dir(minute)
        for name in sorted(bucket_names(queue_dir, minute)):
            yield relative, name
    for name in sorted(flat):
        yield DELAYED, name


def find(queue_dir: str, message_ids: set[str]) -> dict[str, tuple[str, str]]:
    """(queue-relative directory, name) of each of `message_ids` that is delayed: an id does
    not say its due time, so every bucket is listed (a lookup by id that missed the index)."""
    found: dict[str, tuple[str, str]] = {}
    for relative, name in names(queue_dir):
        message_id = name[: layout.ID_LENGTH]
        if message_id in message_ids and message_id not in found:
            found[message_id] = (relative, name)
    return found


class BucketCounts:
    """Delayed messages counted by bucket, a bucket still to come listed again only once its
    mtime changed (stats of a queue of a million delays cost a stat a bucket, as the
    backlog's)."""

    def __init__(self) -> None:
        self._counted: dict[int, tuple[int, int]] = {}  # minute -> (mtime_ns, names)

    def count(self, queue_dir: str, at_ms: int) -> tuple[int, list[str]]:
        """(delayed messages not due by `at_ms`, the names of those due): a listing of every
        bucket whose minute has begun and of flat entries; a bucket still to come counted by
        its names, listed again only once its mtime changed."""
        waiting = 0
        due: list[str] = []
        minutes, flat = top(queue_dir)
        kept: dict[int, tuple[int, int]] = {}
        for minute in minutes:
            path = os.path.join(queue_dir, DELAYED, str(minute))
            if minute * BUCKET_MS > at_ms:
                try:
                    mtime_ns = os.stat(path).st_mtime_ns
                except FileNotFoundError:
                    continue
                counted = self._counted.get(minute)
                if counted is None or counted[0] != mtime_ns:
                    counted = (mtime_ns, len(bucket_names(queue_dir, minute)))
                if time_settled(mtime_ns):
                    kept[minute] = counted
                waiting += counted[1]
                continue
            for name in bucket_names(queue_dir, minute):
                at = due_of(name)
                if at is not None and at <= at_ms:
                    due.append(name)
                elif at is not None:
                    waiting += 1
        for name in flat:
            at = due_of(name)
            if at is not None and at <= at_ms:
                due.append(name)
            elif at is not None:
                waiting += 1
        self._counted = kept
        return waiting, due


def time_settled(mtime_ns: int) -> bool:
    """Whether a directory's mtime is a second old: a listing kept by it misses no rename."""
    return time.time_ns() - mtime_ns > 1_000_000_000


class DelayBuckets:
    """Where this process puts delayed messages: the bucket of a due time, made if missing
    (each new directory flushed into its parent when durable). The bucket made or found last
    is trusted (a minute's delays share it: no mkdir each); a publish whose rename finds it
    gone calls `remake`, which looks."""

    def __init__(self, queue_dir: str, access: Access) -> None:
        self.queue_dir = queue_dir
        self.dir = os.path.join(queue_dir, DELAYED)
        self._access = access
        self._made: tuple[tuple[int, bool], str] | None = None  # ((minute, durable), path)

    def prepare(self, due_ms: int, durable: bool, *, again: bool = False) -> str:
        """The path of the bucket of `due_ms`, made if missing. A consumer may remove a past
        bucket at any instant: made again, up to `_PREPARE_ATTEMPTS` times; FileNotFoundError
        once the queue is gone."""
        minute = minute_of(due_ms)
        key = (minute, durable)
        made = self._made
        if made is not None and made[0] == key and not again:
            return made[1]
        bucket = os.path.join(self.dir, str(minute))
        for _attempt in range(_PREPARE_ATTEMPTS):
            try:
                if self._make(bucket, self.dir, durable):
                    self._made = (key, bucket)
                    return bucket
                self._make(self.dir, self.queue_dir, durable)  # @delayed itself went
            except FileNotFoundError:
                pass
            if not os.path.isdir(self.queue_dir):
                break
        raise FileNotFoundError(errno.ENOENT, "the queue or its @delayed went away", bucket)

    def remake(self, due_ms: int, durable: bool) -> str:
        """`prepare` for a publish whose rename found the bucket gone (PendingFile.make_dir)."""
        return self.prepare(due_ms, durable, again=True)

    def forget(self) -> None:
        """Trust no bucket: the next `prepare` looks (a file written beside its final name,
        in the shared-filesystem mode, found its bucket gone before any rename)."""
        self._made = None

    def _make(self, path: str, parent: str, durable: bool) -> bool:
        return make_bucket_dir(self._access, path, parent, durable, "delay bucket")

    def migrate(self, flat: list[str], durable: bool) -> list[str]:
        """Move flat entries of @delayed (an earlier format's) into their buckets, one rename
        each; the names moved (one another process moved first is skipped). Each bucket is
        made (and flushed) before a name goes into it, and flushed after, with @delayed."""
        moved: list[str] = []
        touched: set[str] = set()
        for name in flat:
            due = due_of(name)
            if due is None:
                continue
            try:
                bucket = self.prepare(due, durable)
            except FileNotFoundError:
                break  # the queue went away meanwhile
            try:
                os.rename(os.path.join(self.dir, name), os.path.join(bucket, name))
            except FileNotFoundError:
                if os.path.isdir(bucket):
                    continue  # moved (or delivered) by another process
                try:
                    bucket = self.remake(due, durable)
                    os.rename(os.path.join(self.dir, name), os.path.join(bucket, name))
                except FileNotFoundError:
                    continue
            except OSError as exc:
                raise storage_error(exc, f"moving {name} into its delay bucket") from exc
            touched.add(bucket)
            moved.append(name)
        if durable and touched:
            try:
                for path in [*touched, self.dir]:
                    with contextlib.suppress(FileNotFoundError):  # emptied and removed since
                        fsync_dir(path)
            except OSError as exc:
                raise storage_error(exc, f"flushing {self.dir}") from exc
        return moved


def remove_empty(queue_dir: str, minute: int) -> bool:
    """rmdir a bucket, quietly: one a writer filled meanwhile (ENOTEMPTY) stays; True if it is
    gone (removed now or before)."""
    try:
        os.rmdir(os.path.join(queue_dir, DELAYED, str(minute)))
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
