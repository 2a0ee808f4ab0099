"""What one process knows of @delayed (delays.py): its buckets, the names of those whose
minute has begun, and flat entries of an earlier format to migrate. Kept by the index
(`QueueIndex.delayed`) from the listing of @delayed, its events and those of each loaded
bucket's own watch.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable

from dirmq.store import delays, layout
from dirmq.store.timedset import TimedSet, parse_at, plain_timed


class DelayedSet(TimedSet):
    """@delayed as one process knows it (delays.py): its buckets (minutes, from the listing
    of @delayed and its events), the names of the buckets loaded (those whose minute has
    begun: listed once, then kept by their own watch), and flat entries of an earlier format
    waiting to be migrated. `earliest` is the earliest a loaded name falls due, or a bucket not
    loaded begins, or a loaded one ends (then it is emptied and removed): what a waiting get's
    timer and `due_by` need, without a listing of a bucket before its minute."""

    def __init__(self) -> None:
        super().__init__()
        self.buckets: list[int] = []  # sorted
        self.loaded: set[int] = set()
        self.flat: set[str] = set()
        # Past buckets found holding nothing due but not removable: minute -> when to look
        # again, the earliest due time of a delay left in it (one of a later minute, misnamed),
        # or None (a stray file alone: not until a rescan).
        self.stuck: dict[int, int | None] = {}
        # Called with (minute, True) before a bucket is listed to be loaded, (minute, False)
        # once it is gone (the view's watch of it); False from the first: the bucket is gone.
        self.watch: Callable[[int, bool], bool] | None = None

    def add_bucket(self, minute: int) -> None:
        buckets = self.buckets
        at = bisect.bisect_left(buckets, minute)
        if at == len(buckets) or buckets[at] != minute:
            buckets.insert(at, minute)

    def drop_bucket(self, minute: int) -> None:
        """A bucket was removed: its names go (they moved out before it could go), and its
        watch."""
        buckets = self.buckets
        at = bisect.bisect_left(buckets, minute)
        if at < len(buckets) and buckets[at] == minute:
            del buckets[at]
        self.stuck.pop(minute, None)
        if minute in self.loaded:
            self.loaded.discard(minute)
            for message_id, name in list(self.names.items()):
                if delays.minute_of(parse_at(name)) == minute:
                    self.discard(message_id, name)
            if self.watch is not None:
                self.watch(minute, False)

    def load(self, queue_dir: str, minute: int) -> None:
        """List a bucket whose minute has begun into the index, watched from before the
        listing (nothing arriving in between is missed)."""
        if not os.path.isdir(os.path.join(queue_dir, delays.bucket_dir(minute))) or (
            self.watch is not None and not self.watch(minute, True)
        ):
            self.drop_bucket(minute)  # gone meanwhile, or a file of a bucket's name (fsck's)
            return
        names = delays.bucket_names(queue_dir, minute)  # failing, not loaded: tried again
        self.loaded.add(minute)
        for name in names:
            self.add_name(minute, name)

    def add_name(self, minute: int, name: str) -> None:
        """A name in the bucket of `minute`: kept if that bucket is loaded and the name's due
        time is of it (a misplaced one is delivered once its bucket's minute is over and it is
        due, or moved to its own bucket by `dirmq fsck --repair`)."""
        self.add_bucket(minute)
        if minute not in self.loaded:
            return
        if (timed := plain_timed(name)) is not None:
            if delays.minute_of(timed) == minute:
                self.add_ungrouped(name[: layout.ID_LENGTH], timed, name)
            return
        entry = layout.parse_entry(name)
        if (
            entry is not None
            and entry.at_ms is not None
            and delays.minute_of(entry.at_ms) == minute
        ):
            self.add(entry, name)

    def begun(self, at_ms: int) -> list[int]:
        """The buckets whose minute has begun by `at_ms`, oldest first (stuck ones left out
        until their time to look again)."""
        end = bisect.bisect_right(self.buckets, at_ms // delays.BUCKET_MS)
        stuck = self.stuck
        return [m for m in self.buckets[:end] if m not in stuck or _due(stuck[m], at_ms)]

    def earliest(self) -> tuple[int, str] | None:
        first = self._first()
        if self.flat:
            return 0, ""  # to migrate now
        for minute in self.buckets:
            if minute in self.stuck:
                again = self.stuck[minute]
                if again is not None and (first is None or again < first[0]):
                    first = again, ""
                continue
            if minute in self.loaded:  # its end: then it is emptied and removed
                at = (minute + 1) * delays.BUCKET_MS
            else:
                at = minute * delays.BUCKET_MS
            if first is None or at < first[0]:
                first = at, ""
            if minute not in self.loaded:
                break  # a later bucket begins later still
        return first

    def clear(self) -> None:
        super().clear()
        self.buckets.clear()
        self.loaded.clear()
        self.flat.clear()
        self.stuck.clear()

    def top_event(self, name: str, added: bool) -> None:
        """An entry of @delayed itself came or went: a bucket, or a flat entry."""
        if delays.is_bucket(name):
            if added:
                self.add_bucket(int(name))
            else:
                self.drop_bucket(int(name))
        elif name[:1] != ".":
            if not added:
                self.flat.discard(name)
            elif parse_at(name):
                self.flat.add(name)

    def bucket_event(self, directory: str, name: str, added: bool) -> None:
        """A name came into, or left, a watched bucket (`directory`: `@delayed/<minute>`)."""
        try:
            minute = delays.bucket_minute(directory)
        except ValueError:
            return
        if added:
            self.add_name(minute, name)
        else:
            self.discard(name[: layout.ID_LENGTH], name)


def _due(again: int | None, at_ms: int) -> bool:
    return again is not None and again <= at_ms
