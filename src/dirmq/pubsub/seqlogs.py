"""Sequence logs: `retained/` (mode `future`, kept forever) and `broadcast/` (mode `everyone`,
pruned once nobody may accept an entry any more). Entries are `<seq, 16 digits>`, dense from 1.

Appending links the message file to the next free number with `link(2)`, which fails with
EEXIST instead of replacing: two writers (threads, processes or hosts) never get one number, and
a writer only moves past `n` once `n` exists, so a log has no holes and a reader waiting for
`n + 1` never misses an entry.

Pruning (broadcast only) removes a prefix, never the newest entry, and records the lowest
remaining number in `<log>.floor`. A writer whose idea of the head is older than a pruned range
could re-use a pruned number, so after each link it checks that `n - 1` exists and `n` is not
below the floor, and otherwise withdraws its link and looks for the real head. The newest entry,
once nobody may accept it either, is replaced by an empty file, a tombstone (`bury`): its name
keeps the numbering, its body is not left readable. Readers take a tombstone for a pruned entry.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable

from dirmq.errors import storage_error
from dirmq.pubsub.layout import SEQ_DIGITS, seq_name
from dirmq.store import smallfiles
from dirmq.store.filemodes import Access

_RESCAN_AFTER = 64  # EEXIST in a row: our idea of the head is stale, list the directory


class SeqLog:
    def __init__(self, directory: str, *, prunable: bool, access: Access) -> None:
        self.directory = directory
        self._access = access
        self.prunable = prunable
        self._floor_file = directory + ".floor"
        self._lock = threading.Lock()
        self._head: int | None = None  # highest sequence number known to exist

    def path(self, seq: int) -> str:
        return os.path.join(self.directory, seq_name(seq))

    def head(self) -> int:
        """The highest sequence number in the log (0 if empty), listing it once per process."""
        with self._lock:
            if self._head is None:
                self._head = self.scan()
            return self._head

    def refresh_head(self) -> int:
        """The head, catching up with other writers by probing the next numbers (no listing)."""
        head = self.head()
        while os.path.exists(self.path(head + 1)):
            head += 1
        with self._lock:
            self._head = max(self._head or 0, head)
            return self._head

    def scan(self) -> int:
        last = 0
        for name in os.listdir(self.directory):
            if len(name) == SEQ_DIGITS and name.isdigit():
                last = max(last, int(name))
        return last

    def floor(self) -> int:
        """The lowest sequence number that may still exist (1 unless pruned)."""
        if not self.prunable:
            return 1
        try:
            with open(self._floor_file, "rb") as f:
                return max(1, int(f.read().strip() or b"1"))
        except (FileNotFoundError, ValueError):
            return 1

    def set_floor(self, seq: int) -> None:
        smallfiles.replace_file(
            self._floor_file, str(seq).encode(), durable=False, access=self._access
        )

    def append(self, source: str) -> int:
        """Link `source` into the log at the next free sequence number and return it."""
        with self._lock:
            if self._head is None:
                self._head = self.scan()
            seq = self._head + 1
            misses = 0
            while True:
                target = self.path(seq)
                try:
                    os.link(source, target)
                except FileExistsError:
                    misses += 1
                    seq = self.scan() + 1 if misses % _RESCAN_AFTER == 0 else seq + 1
                    continue
                if self.prunable and self._reused_pruned(seq):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(target)
                    seq = max(self.scan(), self.floor()) + 1
                    continue
                self._head = seq
                return seq

    def bury(self, seq: int, tmp_dir: str) -> bool:
        """Replace entry `seq` by a tombstone (an empty file, made in `tmp_dir` and renamed over
        it: the name stays, the message's file loses this link); True if this call did."""
        tomb = os.path.join(tmp_dir, f"tombstone.{uuid.uuid4().hex}")
        try:
            os.close(self._access.open(tomb))
            os.rename(tomb, self.path(seq))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tomb)
            return False
        return True

    def _reused_pruned(self, seq: int) -> bool:
        if seq < self.floor():
            return True
        return seq > 1 and not os.path.exists(self.path(seq - 1))


def is_tombstone(path: str) -> bool:
    """Whether the log entry at `path` is a tombstone (`SeqLog.bury`): an empty file."""
    try:
        return os.stat(path).st_size == 0
    except FileNotFoundError:
        return False


class LogHead:
    """The highest sequence number of a log as readers should see it, kept current cheaply.

    The directory is listed once; after that appends are found by probing `head + 1` (then
    galloping) with stat(2), since the log is dense. While nothing is appended, a call costs
    that stat plus one of the directory: its mtime moving without an append at the head means
    a deletion or a link past a hole, and only then is the directory listed again. The head
    never goes down: a deleted tail reads as missing entries, not as a shorter log.
    Thread-safe (the server asks from several pool threads).
    """

    def __init__(self, directory: str, known: Callable[[], int] | None = None) -> None:
        self._directory = directory
        self._known = known  # a writer's own idea of the head (the server's SeqLog), if any
        self._lock = threading.Lock()
        self._seen_mtime: int | None = None
        self.head = 0
        self.rescan()

    def rescan(self) -> int:
        with self._lock:
            mtime = self._dir_mtime()  # before listing: a change during the listing shows later
            try:
                names = os.listdir(self._directory)
            except FileNotFoundError:  # nothing was ever appended
                names = []
            except OSError as exc:
                raise storage_error(exc, f"listing {self._directory}") from exc
            found = (int(n) for n in names if len(n) == SEQ_DIGITS and n.isdigit())
            self.head = max(self.head, max(found, default=0))
            self._seen_mtime = mtime
            return self.head

    def current(self) -> int:
        with self._lock:
            mtime = self._dir_mtime()  # before probing: a change meanwhile shows next time
            changed = mtime != self._seen_mtime
            if self._exists(self.head + 1):
                self._advance()
                # Galloping assumes no holes; an entry right after where it stopped means one.
                changed = self._exists(self.head + 2)
            self._seen_mtime = mtime
            if self._known is not None:
                self.head = max(self.head, self._known())
        return self.rescan() if changed else self.head

    def _advance(self) -> None:
        """Move `head` to the last entry, knowing `head + 1` exists: gallop, then bisect."""
        low, step = self.head + 1, 1
        high = low + step
        while self._exists(high):
            low, step = high, step * 2
            high = low + step
        while high - low > 1:
            middle = (low + high) // 2
            if self._exists(middle):
                low = middle
            else:
                high = middle
        self.head = low

    def _exists(self, seq: int) -> bool:
        try:
            os.stat(os.path.join(self._directory, seq_name(seq)))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, f"probing {self._directory}") from exc
        return True

    def _dir_mtime(self) -> int | None:
        try:
            return os.stat(self._directory).st_mtime_ns
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise storage_error(exc, f"probing {self._directory}") from exc
