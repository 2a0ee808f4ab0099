"""The backlog: where a deep queue keeps the messages behind its head, so that opening it, and
every get, costs what a short queue's does.

    <queue>/@backlog/<epoch>/<second>/<ready name>
        epoch:  the first 6 digits of the message id (10^10 microseconds, about 2.8 hours)
        second: the next 4 digits (the id's second): a bucket holds one second of publishes

A message is published into @ready while @ready holds fewer than `SPILL_AT` messages and the
backlog is empty; otherwise into the bucket of its id's second (`spill`). A consumer whose
@ready runs below `REFILL_BELOW` moves the oldest `REFILL_CHUNK` messages of the backlog into
@ready, in id order, one rename each (`refill`), and removes the buckets it empties; a get in
no group, with nothing ready at all, leases the oldest straight from their bucket (`claim`:
one rename a message, not two, and no event of @ready in any process). So @ready
stays about `SPILL_AT` long whatever the depth, and a process that opens a queue lists @ready
and the backlog's epochs: O(head), not O(depth). ext4 never shrinks a directory, so a flat
@ready that once held a million names would scan slowly for ever; buckets are removed instead.

FIFO holds: every message in the backlog is newer than every message published into @ready
(spilling starts only behind a full @ready and goes on while anything is in the backlog), and a
refill takes the oldest bucket first (bucket names are the ids' own digits). Messages returned to
@ready (nack, expiry, due delays) are older than the backlog, as in a queue without one.

Priorities (FORMAT.md "Priorities"): the messages of level L > 0 have a tree of their own,
`@backlog/p<L>/<epoch>/<second>/`, spilled and refilled by that level's own count in @ready, so
a full @ready of low messages never holds a high one back; level 0 keeps `@backlog/<epoch>/`.
A level's tree goes (`rmdir`) with its last epoch; the index sees `p<L>` come and go.

Why it is long: it is the whole of one layout, which every process must follow alike: where a
publish goes, how a bucket is made durably against a refill that removes it, refills, and the
listings and counts everything else reads the backlog through.

Crash safety: every move is one rename of a complete file (a message is in @ready, or in its
bucket, never in both and never in neither); a bucket this process creates is flushed into its
parent before a message is renamed into it. An empty bucket left by a kill is removed by the
next refill; one a publisher is about to fill is re-made (`PublishRace`, retried once).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import os
import time
from collections.abc import Callable, Iterator

from dirmq.errors import storage_error
from dirmq.store import layout
from dirmq.store.bucketdir import make_bucket_dir
from dirmq.store.filemodes import Access
from dirmq.store.layout import level_of

BACKLOG = layout.BACKLOG
SPILL_AT = 1000  # @ready's length from which new messages go to the backlog
REFILL_BELOW = 500  # a consumer refills @ready when it holds fewer than this
REFILL_CHUNK = 1000  # messages moved by one refill
# A @ready longer than this when a process opens the queue (a root of an earlier version, or
# files written around the store) is cut down to SPILL_AT then: the rest go to the backlog.
MIGRATE_ABOVE = 4 * SPILL_AT
EPOCH_DIGITS = 6
SECOND_DIGITS = 10  # the id's first 10 digits: its second (ids are microseconds, 16 digits)
# A directory entry takes at least this many bytes in every filesystem dirmq runs on (ext4 ~40
# for an id, tmpfs 20, btrfs twice the name): a @ready smaller than SPILL_AT times this holds
# fewer than SPILL_AT names, without listing it.
_MIN_ENTRY_BYTES = 16
_ESTIMATE_FOR_S = 0.5  # a publisher without an index counts @ready at most this often
_PREPARE_ATTEMPTS = 8
SETTLE_S = 1.0  # an emptied epoch or level tree stays this long after its last change


LEVEL_PREFIX = "p"  # @backlog/p<level>: the tree of a priority level above 0
# A move of one backlog message out of its bucket, `(bucket path, name)`: renames it (or
# raises: FileNotFoundError if another process moved it first) and says its new name, or
# refuses it (None: it stays).
Mover = Callable[[str, str], str | None]


def bucket_of(name: str) -> tuple[str, str]:
    """(epoch, second) directory names of the bucket of a ready name (it starts with its id)."""
    return name[:EPOCH_DIGITS], name[EPOCH_DIGITS:SECOND_DIGITS]


def level_root(level: int) -> str:
    """The queue-relative tree of a priority level: `@backlog` (0) or `@backlog/p<level>`."""
    return f"{BACKLOG}/{LEVEL_PREFIX}{level}" if level else BACKLOG


def is_level_dir(name: str) -> bool:
    """Whether an entry of @backlog names a level's tree (`p1` to `p9`)."""
    return len(name) == 2 and name[0] == LEVEL_PREFIX and name[1] in "123456789"


def level_dir_level(name: str) -> int:
    return int(name[1])


def tree_key(name: str) -> str:
    """What an index keeps (`QueueIndex.backlog`) for the tree a spilled `name` went into: its
    epoch (level 0) or its level's `p<level>`."""
    level = level_of(name) if "^" in name else 0
    return f"{LEVEL_PREFIX}{level}" if level else name[:EPOCH_DIGITS]


def relative_dir(name: str) -> str:
    """The bucket of `name` as a queue-relative directory, `@backlog/[p<level>/]<epoch>/<second>`
    (the level from the name): what `QueueFiles.path` takes as a state directory for a backlog
    file."""
    epoch, second = bucket_of(name)
    level = level_of(name) if "^" in name else 0
    return f"{level_root(level)}/{epoch}/{second}"


def is_bucket_dir(directory: str) -> bool:
    """Whether a queue-relative directory is a backlog bucket (a ready message's place)."""
    return directory.startswith(f"{BACKLOG}/")


def is_epoch(name: str) -> bool:
    return len(name) == EPOCH_DIGITS and name.isdigit() and name.isascii()


def is_second(name: str) -> bool:
    return len(name) == SECOND_DIGITS - EPOCH_DIGITS and name.isdigit() and name.isascii()


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise storage_error(exc, f"listing {path}") from exc


def levels(queue_dir: str) -> list[int]:
    """The levels that have a tree in the backlog (0 always), highest first: one listing of
    @backlog (its epochs and level trees)."""
    top = os.path.join(queue_dir, BACKLOG)
    found = [level_dir_level(n) for n in _listdir(top) if is_level_dir(n)]
    return [*sorted(found, reverse=True), 0]


def buckets(queue_dir: str, level: int | None = None) -> Iterator[tuple[str, str]]:
    """(queue-relative bucket directory, its path) of every bucket of `level` (None: of
    every level, highest first), oldest first."""
    for each in levels(queue_dir) if level is None else [level]:
        root = level_root(each)
        top = os.path.join(queue_dir, root)
        for epoch in sorted(n for n in _listdir(top) if is_epoch(n)):
            epoch_dir = os.path.join(top, epoch)
            for second in sorted(n for n in _listdir(epoch_dir) if is_second(n)):
                yield f"{root}/{epoch}/{second}", os.path.join(epoch_dir, second)


def bucket_dirs(queue_dir: str) -> list[str]:
    """Every bucket as a queue-relative directory (the epochs and their seconds listed: no
    message)."""
    return [relative for relative, _path in buckets(queue_dir)]


def _level_names(queue_dir: str, level: int) -> Iterator[tuple[str, str]]:
    for relative, path in buckets(queue_dir, level):
        for name in sorted(n for n in _listdir(path) if n[:1] != "."):
            yield relative, name


def names(queue_dir: str) -> Iterator[tuple[str, str]]:
    """(queue-relative bucket directory, name) of every message file in the backlog, in id
    order (the levels' trees merged): for listings that must see every ready message (browse,
    census, fsck, Spark)."""
    trees = [_level_names(queue_dir, level) for level in levels(queue_dir)]
    if len(trees) == 1:
        yield from trees[0]
        return
    yield from heapq.merge(*trees, key=lambda item: item[1][: layout.ID_LENGTH])


def find(queue_dir: str, message_ids: set[str]) -> dict[str, tuple[str, str]]:
    """(queue-relative bucket directory, name) of each of `message_ids` in the backlog: a
    listing of each one's own bucket (an id names its bucket), not of the backlog."""
    found: dict[str, tuple[str, str]] = {}
    by_bucket: dict[str, set[str]] = {}
    roots = [level_root(level) for level in levels(queue_dir)]
    for message_id in message_ids:
        epoch, second = bucket_of(message_id)
        for root in roots:  # an id does not say its level: its second in each level's tree
            by_bucket.setdefault(f"{root}/{epoch}/{second}", set()).add(message_id)
    for relative, wanted in by_bucket.items():
        for name in _listdir(os.path.join(queue_dir, relative)):
            message_id = name[: layout.ID_LENGTH]
            if message_id in wanted and name[:1] != ".":
                found[message_id] = (relative, name)
    return found


def names_after(queue_dir: str, after: str | None) -> Iterator[tuple[str, str]]:
    """`names`, from the first name past the id `after` (a page of a browse)."""

    def tree(level: int) -> Iterator[tuple[str, str]]:
        root = level_root(level)
        start = None if after is None else f"{root}/{'/'.join(bucket_of(after))}"
        for relative, path in buckets(queue_dir, level):
            if start is not None and relative < start:
                continue
            for name in sorted(n for n in _listdir(path) if n[:1] != "."):
                if after is None or name[: layout.ID_LENGTH] > after:
                    yield relative, name

    trees = [tree(level) for level in levels(queue_dir)]
    if len(trees) == 1:
        yield from trees[0]
        return
    yield from heapq.merge(*trees, key=lambda item: item[1][: layout.ID_LENGTH])


def occupied(queue_dir: str, level: int = 0, level_count: int = 1) -> bool:
    """Whether the tree of `level` holds a message (then a new message of that level goes
    behind it), in a queue of `level_count` priority levels. Empty directories do not count: a
    refill leaves the buckets of the last seconds and an emptied epoch for a while (a publisher
    may be about to fill them). A stat when the tree has no subdirectory at all (the link count
    is 2 plus the subdirectories, on the filesystems that count them); else the oldest buckets
    are looked at until one holds a message (in a deep queue, the first)."""
    del level_count  # each level's tree is looked at alike (level trees are not epochs)
    top = os.path.join(queue_dir, level_root(level))
    try:
        st = os.stat(top)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(exc, f"looking at {top}") from exc
    if st.st_nlink == 2:
        return False
    for epoch in sorted(n for n in _listdir(top) if is_epoch(n)):
        epoch_dir = os.path.join(top, epoch)
        for second in sorted(n for n in _listdir(epoch_dir) if is_second(n)):
            if _holds_message(os.path.join(epoch_dir, second)):
                return True
    return False


def _holds_message(bucket: str) -> bool:
    """Whether `bucket` holds a message: its listing read only up to the first one (a publish
    asks this of the oldest bucket per batch, which in a deep queue holds a second's
    publishes: a whole listing of thousands cost ~13 µs a message of kernel time alone)."""
    try:
        with os.scandir(bucket) as entries:
            return any(entry.name[:1] != "." for entry in entries)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise storage_error(exc, f"listing {bucket}") from exc


class PublishRace(Exception):
    """A bucket was removed between its making and a publish into it (a refill emptied it):
    the publish is tried once more."""


class Backlog:
    """One queue's backlog, for one process: where a publish goes, and refills."""

    def __init__(self, queue_dir: str, access: Access) -> None:
        self.queue_dir = queue_dir
        self.dir = os.path.join(queue_dir, BACKLOG)
        self.ready_dir = os.path.join(queue_dir, layout.READY)
        self._access = access
        # @ready's length per level as last counted by a publisher without an index
        self._estimate: dict[int, int] = {}
        self._estimated_at = -_ESTIMATE_FOR_S
        self._counted: dict[str, tuple[int, int, str]] = {}  # bucket -> (mtime, count, least)
        # ((level, the id's first SECOND_DIGITS, durable), bucket path) last made or found
        self._made: tuple[tuple[int, str, bool], str] | None = None
        # level -> the path of the message this process spilled last into that level's tree:
        # while it is there the tree holds a message (`room`: one stat, not a walk)
        self._witness: dict[int, str] = {}
        # level -> the bucket this process refills that level from (its path), its names as
        # listed, oldest first, and the index of the first not yet moved (`_move_from`)
        self._cursors: dict[int, tuple[str, list[str], int]] = {}

    # -- publishing ---------------------------------------------------------------------------
    def room(self, ready_count: int | None, level: int = 0, level_count: int = 1) -> int:
        """How many of the next messages of priority `level` published may still go into
        @ready (the rest go to the backlog), in a queue of `level_count` levels. `ready_count`:
        @ready's length at that level if the caller's index knows it."""
        if self._witnessed(level) or occupied(self.queue_dir, level, level_count):
            return 0
        count = self._estimate_ready(level, level_count) if ready_count is None else ready_count
        return max(0, SPILL_AT - count)

    def spilled(self, level: int, path: str) -> None:
        """A message of priority `level` was published into the backlog at `path`."""
        self._witness[level] = path

    def _witnessed(self, level: int) -> bool:
        """Whether the message this process spilled last into the tree of `level` is still
        there (a refill takes the oldest first: in a deep queue the newest stays longest). A
        publish behind the backlog asks this per batch: a stat instead of a stat and four
        listings (`occupied`)."""
        path = self._witness.get(level)
        if path is None:
            return False
        try:
            os.lstat(path)
        except OSError:  # moved on (refilled), or its bucket removed: the walk decides
            self._witness.pop(level, None)
            return False
        return True

    def published_into_ready(self, count: int, level: int = 0) -> None:
        """`count` messages went into @ready since the last estimate (kept without a look)."""
        self._estimate[level] = self._estimate.get(level, 0) + count

    def _estimate_ready(self, level: int, level_count: int) -> int:
        """@ready's length at `level`, up to SPILL_AT, for a publisher without an index: a
        stat, and a bounded count only when the directory is large enough to hold SPILL_AT
        names (of a queue of several levels: each level's, in one listing of @ready)."""
        now = time.monotonic()
        if now - self._estimated_at < _ESTIMATE_FOR_S:
            return self._estimate.get(level, 0)
        self._estimated_at = now
        try:
            size = os.stat(self.ready_dir).st_size
        except OSError:
            size = 0
        self._estimate = {}
        if size < SPILL_AT * _MIN_ENTRY_BYTES:
            return 0
        counted: dict[int, int] = {}
        try:
            with os.scandir(self.ready_dir) as entries:
                for entry in entries:
                    name = entry.name
                    if name[:1] != ".":
                        at = level_of(name) if level_count > 1 and "^" in name else 0
                        counted[at] = counted.get(at, 0) + 1
                        if level_count == 1 and counted[0] >= SPILL_AT:
                            break
        except OSError:
            pass
        self._estimate = counted
        return counted.get(level, 0)

    def prepare(self, name: str, durable: bool, *, again: bool = False) -> str:
        """The bucket directory a new file named `name` goes into, made if missing (each new
        directory flushed into its parent when `durable`): its path. A refill may empty and
        remove a bucket, its epoch or its tree at any instant, also between two steps here:
        made again, up to `_PREPARE_ATTEMPTS` times; FileNotFoundError once the queue is gone.

        The bucket last made or found is taken on trust (a second's publishes share it: no
        mkdir each): a publish whose rename finds it gone calls this `again`, which looks."""
        level = level_of(name) if "^" in name else 0
        key = (level, name[:SECOND_DIGITS], durable)  # one made for memory is no durable one's
        made = self._made
        if made is not None and made[0] == key and not again:
            return made[1]
        epoch, second = bucket_of(name)
        tree = os.path.join(self.queue_dir, level_root(level))
        epoch_dir = os.path.join(tree, epoch)
        bucket = os.path.join(epoch_dir, second)
        for _attempt in range(_PREPARE_ATTEMPTS):
            try:
                if self._make(bucket, epoch_dir, durable):
                    self._made = (key, bucket)
                    return bucket
                self._make(self.dir, self.queue_dir, durable)
                if level:
                    self._make(tree, self.dir, durable)
                self._make(epoch_dir, tree, durable)
            except FileNotFoundError:
                pass  # a directory just made was removed before its flush: again
            if not os.path.isdir(self.queue_dir):
                break
        raise FileNotFoundError(errno.ENOENT, "the queue or its backlog went away", bucket)

    def remake(self, name: str, durable: bool) -> str:
        """`prepare` for a publish whose rename found the bucket of `name` gone: made again
        (PendingFile.make_dir)."""
        return self.prepare(name, durable, again=True)

    def forget(self) -> None:
        """Trust no bucket: the next `prepare` looks (a file written beside its final name,
        in the shared-filesystem mode, found its bucket gone before any rename)."""
        self._made = None

    def _make(self, path: str, parent: str, durable: bool) -> bool:
        return make_bucket_dir(self._access, path, parent, durable, "backlog directory")

    # -- counting -----------------------------------------------------------------------------
    def count(self) -> tuple[int, str]:
        """(messages in the backlog, the least id there or ""): each bucket listed once it has
        settled (its mtime a second old: no rename can still be missing from a listing kept
        by mtime), not at every call: `Queue.stats` of a deep queue costs a stat a bucket."""
        by_level, oldest = self.count_by_level()
        return sum(by_level.values()), oldest

    def count_by_level(self) -> tuple[dict[int, int], str]:
        """`count`, split by priority level ({level: messages}, levels with a tree only)."""
        by_level: dict[int, int] = {}
        oldest = ""
        kept: dict[str, tuple[int, int, str]] = {}
        for relative, path in buckets(self.queue_dir):
            try:
                mtime_ns = os.stat(path).st_mtime_ns
            except FileNotFoundError:
                continue
            counted = self._counted.get(path)
            if counted is None or counted[0] != mtime_ns:
                listed = [n for n in _listdir(path) if n[:1] != "."]
                counted = (mtime_ns, len(listed), min(listed, default="")[: layout.ID_LENGTH])
            if time.time_ns() - mtime_ns > 1e9:
                kept[path] = counted
            tree = relative.split("/", 2)[1]  # an epoch (level 0), or a level's p<level>
            level = level_dir_level(tree) if is_level_dir(tree) else 0
            by_level[level] = by_level.get(level, 0) + counted[1]
            if counted[2] and (not oldest or counted[2] < oldest):  # the levels' trees
                oldest = counted[2]
        self._counted = kept
        return by_level, oldest

    def prune(self) -> None:
        """Remove every empty bucket and epoch (after a purge: an empty bucket would send
        publishes behind it for nothing)."""
        for level in levels(self.queue_dir):
            tree = os.path.join(self.queue_dir, level_root(level))
            for epoch in sorted(n for n in _listdir(tree) if is_epoch(n)):
                epoch_dir = os.path.join(tree, epoch)
                for second in _listdir(epoch_dir):
                    _remove_empty(os.path.join(epoch_dir, second))
                _remove_empty(epoch_dir)
            if level:
                _remove_empty(tree)

    # -- consuming ----------------------------------------------------------------------------
    def refill(self, limit: int = REFILL_CHUNK, level: int = 0) -> list[str]:
        """Move up to `limit` of the oldest backlog messages of priority `level` into @ready
        (one rename each, in id order); the names moved. Buckets emptied are removed (a
        publisher that was about to fill one makes it again), and a level's tree with its last
        epoch. Several processes may refill at once: each file moves once."""
        return self._take_oldest(limit, level, self._into_ready)

    def _into_ready(self, bucket: str, name: str) -> str:
        """A refill's move of `bucket`/`name` into @ready, under the same name."""
        os.rename(f"{bucket}/{name}", f"{self.ready_dir}/{name}")
        return name

    def claim(self, limit: int, lease: Mover) -> list[str]:
        """Lease up to `limit` of the oldest messages of level 0's tree straight from their
        buckets, in id order, as `refill` would move them into @ready: `lease` renames one
        into @leased (files.py) and says its lease name, or refuses it (None: a group's,
        which `refill` brings to @ready, where its group's turn is decided), which ends the
        claim there. The lease names taken. For a get that finds @ready empty: the oldest
        message there is then is the backlog's oldest (docs/FORMAT.md, "The backlog")."""
        return self._take_oldest(limit, 0, lease)

    def _take_oldest(self, limit: int, level: int, move: Mover) -> list[str]:
        """Move up to `limit` of the oldest messages of `level`'s tree by `move`, one at a
        time, oldest first, until it refuses one; their new names. Emptied buckets, epochs and
        level trees removed as `refill` says."""
        moved: list[str] = []
        tree = os.path.join(self.queue_dir, level_root(level))
        for epoch in sorted(n for n in _listdir(tree) if is_epoch(n)):
            epoch_dir = os.path.join(tree, epoch)
            for second in sorted(n for n in _listdir(epoch_dir) if is_second(n)):
                bucket = os.path.join(epoch_dir, second)
                if not self._move_from(bucket, level, limit, moved, move):
                    return moved  # refused: the oldest stays, and what follows it
                if len(moved) >= limit:
                    return moved
                if int(epoch + second) + 1 + SETTLE_S < time.time():
                    _remove_empty(bucket)  # not one a publisher of now may be filling
            _remove_settled(epoch_dir)
        if level:
            _remove_settled(tree)  # the level's last epoch went: its tree goes too
        return moved

    def _move_from(
        self, bucket: str, level: int, limit: int, moved: list[str], move: Mover
    ) -> bool:
        """Move the oldest names of `bucket` by `move`, appending their new names to `moved`,
        until it holds `limit` or the bucket is empty; False if `move` refused a name (it
        stays, the oldest, and nothing after it moves) or failed after a move.

        A bucket holds a second's publishes (tens of thousands when a backlog was loaded
        fast) and a refill takes a thousand: it is listed once and its names kept, oldest
        first, with where the next refill starts (`_cursors`), not listed and sorted at every
        refill (that cost a get of 50 about 15 ms in 20). Every process takes the oldest names
        first, so the names another process moved meanwhile are a run from where ours stopped:
        a rename that finds its name gone looks for the first one still there by bisection
        (a stat each step), not one by one. Once the names kept are used up the bucket is
        listed again (what came into it since, and what a bisection passed over)."""
        cursor = self._cursors.get(level)
        if cursor is not None and cursor[0] == bucket:
            names, at, listed = cursor[1], cursor[2], False
        else:
            names, at, listed = sorted(n for n in _listdir(bucket) if n[:1] != "."), 0, True
        try:
            while len(moved) < limit:
                if at >= len(names):
                    if listed:
                        break
                    names, at, listed = sorted(n for n in _listdir(bucket) if n[:1] != "."), 0, True
                    continue
                try:
                    new = move(bucket, names[at])
                except FileNotFoundError:
                    at = _first_present(bucket, names, at + 1)  # another process's move
                    continue
                except OSError as exc:
                    if moved:
                        return False  # what moved is in place: the caller indexes it
                    raise storage_error(exc, f"moving messages out of {bucket}") from exc
                if new is None:
                    return False
                at += 1
                moved.append(new)
        finally:
            self._cursors[level] = (bucket, names, at)
        return True


def _first_present(bucket: str, names: list[str], start: int) -> int:
    """The index of the first of `names[start:]` still in `bucket`, taking those before it to
    be gone (refills take the oldest first), by bisection; len(names) if none is left."""
    low, high = start, len(names)
    while low < high:
        middle = (low + high) // 2
        try:
            os.lstat(f"{bucket}/{names[middle]}")
        except FileNotFoundError:
            low = middle + 1
        except OSError:
            return middle  # unknown: the rename there says what is wrong
        else:
            high = middle
    return low


def _remove_settled(path: str) -> None:
    """`_remove_empty` of an epoch or a level's tree unchanged for `SETTLE_S`: a publisher
    makes the epoch, then its bucket in it, and an epoch removed in between would fail it."""
    try:
        if time.time() - os.stat(path).st_mtime < SETTLE_S:
            return
    except OSError:
        return
    _remove_empty(path)


def _remove_empty(path: str) -> None:
    """rmdir, quietly: a directory another process filled (ENOTEMPTY) or removed meanwhile stays
    or is gone, and one that cannot be removed costs nothing but a listing at the next refill."""
    with contextlib.suppress(OSError):
        os.rmdir(path)
