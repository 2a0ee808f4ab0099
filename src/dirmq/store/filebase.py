"""A queue's files at rest: where its state directories are, the parts kept beside them
(backlog, recycled-file pool, capacity slots, dedup records), and reading and locating its
messages without moving them. The base of `files.QueueFiles`, whose subclasses add the
transitions (settling.py: out of a lease and the primitives; files.py: claims).
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

from dirmq.errors import CorruptMessage, storage_error
from dirmq.store import backlog as backlog_files
from dirmq.store import delays, layout
from dirmq.store.backlog import Backlog
from dirmq.store.capacity import Slots
from dirmq.store.claimtokens import ClaimTokens
from dirmq.store.context import QueueContext
from dirmq.store.dedup import Dedup
from dirmq.store.delays import BucketCounts, DelayBuckets
from dirmq.store.layout import parse_entry
from dirmq.store.message import Message
from dirmq.store.pool import FilePool
from dirmq.store.reading import read_message, stored_message
from dirmq.store.recovery import remove_orphans


class _StateDirs(dict[str, str]):
    """The paths of a queue's state directories by name (`layout.STATE_DIRS`), each joined at
    its first use: a long poll on each of thousands of idle queues opens each on the server's
    event loop, and uses four of the ten. `get` tells only those used so far."""

    __slots__ = ("_prefix",)

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self._prefix = prefix

    def __missing__(self, directory: str) -> str:
        if directory not in layout.STATE_DIRS:
            raise KeyError(directory)
        path = self[directory] = self._prefix + directory
        return path


class QueueFileBase:
    """A queue's files at rest (settling.py and files.py add the transitions)."""

    def __init__(self, context: QueueContext, name: str, path: str) -> None:
        self.name = name
        self.dir = _StateDirs(path if path.endswith(os.sep) else path + os.sep)
        self.queue_dir = path
        self._context = context
        self.access = context.access  # the modes of every file written here
        self.context = context
        self.quarantined = 0  # corrupt files this process set aside
        # The shared-filesystem mode's claim tokens (claimtokens.py); None on a local disk.
        self.tokens = ClaimTokens(self.dir[layout.TMP], context.access) if context.shared else None

    # The parts below are made at first use: a long poll on each of thousands of idle queues
    # opens each (on the server's event loop) and uses none of them until a message comes, and
    # every object a queue keeps is walked by the cyclic GC. (Python 3.12's cached_property
    # takes no lock: two threads' first uses may each make one, and either is right, as each
    # part keeps only caches; the process's own pool is shared by directory, ownpool.py.)
    @functools.cached_property
    def backlog(self) -> Backlog:
        return Backlog(self.queue_dir, self.access)

    @functools.cached_property
    def delay_buckets(self) -> DelayBuckets:
        return DelayBuckets(self.queue_dir, self.access)

    @functools.cached_property
    def delay_counts(self) -> BucketCounts:
        return BucketCounts()

    @functools.cached_property
    def pool(self) -> FilePool:
        return FilePool(
            self.dir[layout.FREE],
            self.access,
            shared=self._context.shared,
            tmp_dir=self.dir[layout.TMP],
        )

    @functools.cached_property
    def slots(self) -> Slots:
        return Slots(self.name, self.dir[layout.SLOTS])

    @functools.cached_property
    def dedup(self) -> Dedup:
        return Dedup(self.dir[layout.DEDUP], self.access)

    def remove_orphans(self) -> int:
        """Unlink the temps no live writer will publish (recovery.py): in @tmp, and in the
        shared-filesystem mode also those beside their final names in @ready and @delayed."""
        removed = remove_orphans(self.dir[layout.TMP])
        if self._context.shared:
            for directory in (layout.READY, layout.DELAYED):
                removed += remove_orphans(self.dir[directory], beside=True)
            for bucket in backlog_files.bucket_dirs(self.queue_dir):
                removed += remove_orphans(f"{self.queue_dir}/{bucket}", beside=True)
            for minute in delays.top(self.queue_dir)[0]:
                removed += remove_orphans(self.path(delays.bucket_dir(minute), ""), beside=True)
        return removed

    def path(self, directory: str, name: str) -> str:
        """`directory`: a state directory, a backlog bucket (`@backlog/<epoch>/<second>`,
        backlog.relative_dir) or a delay bucket (`@delayed/<minute>`, delays.relative_dir)."""
        base = self.dir.get(directory) or f"{self.queue_dir}/{directory}"
        return f"{base}/{name}"  # names hold no "/": no os.path.join needed

    # -- reading ------------------------------------------------------------------------------
    def read(self, directory: str, name: str, *, corrupt_ok: bool = True) -> Message | None:
        """The message stored as `directory/name`, without changing its state; None if it is
        gone, or corrupt (CorruptMessage instead when not `corrupt_ok`: a read by id must not
        pass a damaged message off as absent). StorageError if it cannot be read."""
        entry = parse_entry(name)
        if entry is None:
            return None
        try:
            decoded = read_message(self.path(directory, name), entry.message_id)
        except FileNotFoundError:
            return None
        except CorruptMessage:
            if corrupt_ok:
                return None
            raise
        except OSError as exc:
            raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
        message = stored_message(entry, directory, decoded)
        if directory == layout.LEASED and (holders := self._context.holders) is not None:
            return replace(message, holder=holders.describe(entry.holder))
        return message

    def locate_listed(self, message_ids: set[str]) -> dict[str, tuple[str, str]]:
        """(state directory, file name) of each of `message_ids` found by listing the state
        directories, not through an index."""
        found: dict[str, tuple[str, str]] = {}
        for directory in (layout.LEASED, layout.READY, layout.DEAD):
            try:
                names = os.listdir(self.dir[directory])
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise storage_error(exc, f"listing {directory} of queue {self.name!r}") from exc
            for name in names:
                message_id = name[: layout.ID_LENGTH]
                if message_id in message_ids and message_id not in found:
                    entry = parse_entry(name)
                    if entry is not None and entry.message_id == message_id:
                        found[message_id] = (directory, name)
        if missing := message_ids - found.keys():
            found.update(backlog_files.find(self.queue_dir, missing))
        if missing := message_ids - found.keys():
            found.update(delays.find(self.queue_dir, missing))
        return found

    def dead_names(self, message_id: str) -> list[str]:
        """Names in @dead for `message_id` (a scan of @dead: only for lookups by id that missed)."""
        try:
            return [n for n in os.listdir(self.dir[layout.DEAD]) if n.startswith(message_id)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, f"listing @dead of queue {self.name!r}") from exc
