"""What `fsck` finds, and the run that records it: the one place every check reports to.

A check reports a finding through its `Run`: `add` for one nothing repairs, `fix` for one with a
repair (an action that returns what it did, run only when the run repairs; an `OSError` it
raises is reported, never raised). A check of one part of a queue that needs nothing but the
queue's directory (fsck_backlog.py, fsck_rate.py) yields `Finding`s instead, which `record`
turns into either. The run also holds what the checks learn along the way and share: the
root's access and the holders that lease names carry.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from dirmq.store.filemodes import LEGACY, Access

_PROGRESS_BATCH = 256


class Kind(StrEnum):
    """What kind of problem a `Problem` is."""

    ROOT_MARKER = "root-marker"  # @dirmq.json missing, unparseable or of an unknown format
    TRASH = "trash"  # leftovers of an interrupted queue deletion in <root>/@trash
    BAD_CONFIG = "bad-config"  # @queue.json does not parse or validate
    MISSING_DIR = "missing-dir"  # a state directory of a queue is missing
    BAD_NAME = "bad-name"  # a state-directory file name that does not fit its directory
    MISNAMED = "misnamed"  # an intact message under a name the store cannot use: re-homed
    CORRUPT = "corrupt"  # a message file that does not decode
    UNREADABLE = "unreadable"  # a message file or directory the OS refused to read
    DUPLICATE = "duplicate"  # one message id in several files
    ORPHAN_TMP = "orphan-tmp"  # a temp file no writer will ever rename
    ORPHAN_POOL = "orphan-pool"  # the recycled-file pool of a process that is gone
    LINKED_FREE = "linked-free"  # a recycled file that is also another name's (a message's)
    LEAKED_SLOT = "leaked-slot"  # a capacity token whose message is gone
    UNCONFIGURED = "unconfigured"  # state directories without @queue.json
    BAD_QUEUE_NAME = "bad-queue-name"  # a queue directory whose path is not a valid queue name
    MISSING_DLQ = "missing-dlq"  # notice: the dead-letter queue named in the config is absent
    ACCESS = "access"  # an entry's mode (or group) is not what the root's access gives
    READABLE_FREE = "readable-free"  # a recycled file still holding a retired message's bytes
    STRAY = "stray"  # notice: a file or directory dirmq does not know
    ORPHAN_HOLDER = "orphan-holder"  # notice: another host's holder record no lease names
    STALE_RATE_SLOT = "stale-rate-slot"  # notice: a delivery slot of a past second (flow.py)
    JOURNAL = "journal"  # notice: a commit journal of a dead process or an earlier boot
    FLAT_DELAY = "flat-delay"  # notice: a delay of format 4 outside its bucket (delays.py)
    UNFLUSHED_JOURNAL = "unflushed-journal"  # a journal whose checkpoint's syncfs failed


# Notices do not break an invariant the store relies on: they never make a report not `ok`.
# A dead process's pool is not damage either: the next open of the queue reclaims it.
NOTICE_KINDS = frozenset(
    {
        Kind.STRAY,
        Kind.MISSING_DLQ,
        Kind.ORPHAN_POOL,
        Kind.ORPHAN_HOLDER,
        Kind.STALE_RATE_SLOT,
        Kind.JOURNAL,  # the next open of the root recovers it
        Kind.FLAT_DELAY,  # the next open of the queue moves it into its bucket
    }
)


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding. `queue` is the queue name ("" for the root itself); `path` is absolute."""

    queue: str
    path: str
    kind: Kind
    detail: str
    repaired: bool = False

    @property
    def notice(self) -> bool:
        """True for findings that are reported but need no repair (stray files and the like)."""
        return self.kind in NOTICE_KINDS


@dataclass(frozen=True, slots=True)
class FsckReport:
    """What `fsck` found. `problems` is in discovery order (a tuple: the report is a value)."""

    root: str
    problems: tuple[Problem, ...] = ()
    queues_checked: int = 0
    messages_checked: int = 0  # files with message names read, good or not
    expired_leases: int = 0  # not damage: the next get or sweep requeues them
    due_delayed: int = 0  # not damage: the next get or sweep delivers them
    tmp_in_progress: int = 0  # temp files of live writers, left alone
    corrupt_kept: int = 0  # files already quarantined in @corrupt, kept for inspection

    @property
    def unrepaired(self) -> tuple[Problem, ...]:
        """Problems (not notices) still present after this run."""
        return tuple(p for p in self.problems if not p.repaired and not p.notice)

    @property
    def repaired(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.repaired)

    @property
    def ok(self) -> bool:
        """True when every invariant holds now (nothing found, or everything found repaired)."""
        return not self.unrepaired


@dataclass(frozen=True, slots=True)
class Finding:
    """What a check of one part of a queue found: `repair` is None for a finding nothing
    repairs (a notice, such as a stray entry), else the action that repairs it."""

    kind: Kind
    path: str
    detail: str
    repair: Callable[[], str] | None


@dataclass(slots=True)
class Counts:
    queues: int = 0
    messages: int = 0
    expired: int = 0
    due: int = 0
    tmp_live: int = 0
    corrupt_kept: int = 0


@dataclass(slots=True)
class Run:
    """One check of the root at `root`: what it found, counted and learnt so far. `repair` is
    turned off by a root of a format whose rules may differ from ours (fsck_root.py)."""

    root: str
    repair: bool
    progress: Callable[[int], None] | None = None
    problems: list[Problem] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    access: Access = field(default_factory=lambda: Access.named(LEGACY))  # until the marker's
    holders_in_use: set[str] = field(default_factory=set)  # holder tokens lease names carry
    _pending: int = 0

    def report(self) -> FsckReport:
        c = self.counts
        return FsckReport(
            root=self.root,
            problems=tuple(self.problems),
            queues_checked=c.queues,
            messages_checked=c.messages,
            expired_leases=c.expired,
            due_delayed=c.due,
            tmp_in_progress=c.tmp_live,
            corrupt_kept=c.corrupt_kept,
        )

    def add(self, queue: str, path: str, kind: Kind, detail: str, repaired: bool = False) -> None:
        self.problems.append(Problem(queue, path, kind, detail, repaired))

    def fix(
        self, queue: str, path: str, kind: Kind, detail: str, action: Callable[[], str]
    ) -> None:
        """Record a problem; with repair, run `action` (it returns what it did) and say so."""
        if not self.repair:
            self.add(queue, path, kind, detail)
            return
        try:
            done = action()
        except OSError as exc:
            self.add(queue, path, kind, f"{detail}; repair failed: {exc.strerror or exc}")
            return
        self.add(queue, path, kind, f"{detail}; {done}", repaired=True)

    def record(self, queue: str, finding: Finding) -> None:
        """A `Finding` of queue `queue`, added or fixed as its `repair` says."""
        if finding.repair is None:
            self.add(queue, finding.path, finding.kind, finding.detail)
        else:
            self.fix(queue, finding.path, finding.kind, finding.detail, finding.repair)

    def tick(self) -> None:
        self._pending += 1
        if self._pending >= _PROGRESS_BATCH:
            self.flush_progress()

    def flush_progress(self) -> None:
        if self.progress is not None and self._pending:
            self.progress(self._pending)
        self._pending = 0


def scandir(path: str) -> Iterator[os.DirEntry[str]]:
    """Entries of `path`, streamed (never a full list of a large directory); none if absent."""
    try:
        with os.scandir(path) as it:
            yield from it
    except FileNotFoundError:
        return


def entries(path: str) -> list[os.DirEntry[str]]:
    """Entries of a bucket tree's directory, as a list (none if absent or not a directory)."""
    try:
        with os.scandir(path) as found:
            return list(found)
    except (FileNotFoundError, NotADirectoryError):
        return []


# -- repairs more than one check makes -----------------------------------------------------------
def mover(access: Access, path: str, queue_dir: str, home: str) -> Callable[[], str]:
    """The repair that renames the message at `path` into its bucket `home` (queue-relative,
    made if missing); never over a file of that name."""

    def move() -> str:
        access.makedirs(os.path.join(queue_dir, home))
        target = os.path.join(queue_dir, home, os.path.basename(path))
        if os.path.lexists(target):
            raise FileExistsError(0, f"{target} already exists")
        os.rename(path, target)
        return f"moved to {home}"

    return move


def unlinker(path: str) -> Callable[[], str]:
    """The repair that removes `path` (already gone is as good)."""

    def action() -> str:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return "removed"

    return action


def set_aside(path: str) -> str:
    """Move `path` to `<path>.bad-<UTC time>` for a human to read (the checks ignore it)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = f"{path}.bad-{stamp}"
    n = 1
    while os.path.lexists(target):
        n += 1
        target = f"{path}.bad-{stamp}-{n}"
    os.rename(path, target)
    return f"moved aside to {os.path.basename(target)}"
