"""Check, and optionally repair, every invariant of the on-disk format under one root.

Theory of operation. fsck walks the root with `os.scandir` (never following symlinks), and checks
each queue directory it meets (a directory holding `@queue.json`) one file at a time: a message
file is read, decoded (length and CRC) and dropped before the next is read, so memory grows with
the number of ids (for the duplicate and capacity checks), never with the bodies. It takes no lock
and is safe next to live processes: a file that disappears mid-check was moved by a normal
transition and is skipped, and the two checks that a concurrent transition could fool (duplicate
ids, leaked capacity slots) are confirmed by a second look before anything is reported or removed.

Invariants, and what `repair=True` does about each (see `Kind`):

    root marker @dirmq.json present, a JSON object with "format": 2   recreate (bad one moved aside)
    ... and of format 1 or 2 (another: its rules may differ)          report; repair nothing at all
    @trash empty (an interrupted queue deletion)                      empty it
    @pubsub, @spark, @sqs, @redrive at the root (the upper layers',   known: left to their layers
      FORMAT.md), @fsck (the last check's record, fsckrecord.py)
    @holders: no record of another host's process that no lease      unlink
      names, an hour old (a notice; this host's dead ones: sweep)
    @queue.json parses and validates                                  move aside, rewrite it with
                                                                      bad settings reset to default
    every state directory exists                                      mkdir
    names in @ready/@dead carry no time, @leased/@delayed do          rename to the canonical name
    names in state directories parse, times within the store's bounds  re-home (below)
    every message file decodes (Content-Length, Body-CRC32), and its  move to @corrupt
      Dirmq-Id (if any) is the id in its name
    one file per message id across @ready/@leased/@delayed/@dead      keep one copy (see below)
    no orphaned temp file in @tmp (dead writer, or older than 1 h)     unlink
      nor beside its final name in @ready or @delayed (the
      shared-filesystem mode's temps: layout.temp_beside)
    no temp file of a small-file write (smallfiles.py) older than     unlink
      1 h: beside @dirmq.json and @queue.json, anywhere under @sqs,
      @spark, @redrive and @fsck (@pubsub's check looks at its own)
    no capacity slot pointing at an absent message (older than 60 s)  unlink
    no file in @free sharing its inode with another name              unlink the @free name
    the recycled-file pool of a dead process in @free (pool.py)       blank files back to @free,
      (a notice: the next open reclaims it; its files not blanked       the others unlinked
      yet, acknowledged messages its reaper had not reached, are
      counted in the detail and never reused)
    state directories without @queue.json (crashed create/delete)     remove when empty, else report
    stray unknown files                                               report only (a notice)
    every file and directory has the modes of the root's access      chmod (and chgrp, in a group
      (filemodes.py: private 0600/0700, group 0660/2770 in the root's  root)
      group; nothing is checked in a root made before the setting)
    no file in the shared pool of @free holds data (a retired file   unlink
      is blanked: one that is not was retired by an earlier version)

Which copy of a duplicated id is kept: the most advanced one, in the order
leased > ready > delayed > dead, then the higher receive count, then the later time. A leased copy
is kept first because a consumer holds its receipt: keeping it lets that consumer's ack settle the
message, while keeping a ready copy would deliver it a second time. Live states beat @dead so a
message that can still be delivered is never dropped (delivery is at-least-once). Among copies in
one state, a well-formed name beats a malformed one. Only copies that decode compete.

A file whose name the store cannot use (it does not parse, or holds a lease deadline or due time
further ahead than the longest duration the store accepts, `bounds.MAX_DURATION_S`) is never
set aside for its name alone: if it decodes and names its message (`Dirmq-Id`, else the id its
name starts with), it is re-homed under a valid name (`misnamed`), keeping its state, receive
count and time where they can stand, else made ready (a lease or delay whose time cannot stand
is due now). Only a file that does not decode, or names no message at all, goes to @corrupt.

Expired leases and due delays are not damage (any get or sweep promotes them); they are counted.
Files named `@queue.json.bad-*` are left by an earlier repair for a human to read, and are ignored.

Why it is long: every invariant of FORMAT.md is checked here, each with its repair, in one pass
over the root; the checks share the walk, the report and the repair rules (what is re-homed, what
is quarantined), which must not drift apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from functools import partial

from dirmq.errors import ConfigError, CorruptMessage, InvalidArgument, InvalidName, storage_error
from dirmq.store import backlog, codec, fsck_backlog, fsck_rate, layout, smallfiles
from dirmq.store.bounds import AT_MS_DIGITS, MAX_DURATION_S, MAX_RECEIVE_COUNT
from dirmq.store.capacity import LEAK_GRACE_S
from dirmq.store.config import QueueConfig
from dirmq.store.filemodes import GROUP, LEGACY, Access, conform, inferred_access, mismatches
from dirmq.store.holders import is_record_name, orphan_record
from dirmq.store.ids import ID_PATTERN, is_id
from dirmq.store.layout import Entry, parse_entry
from dirmq.store.marker import READABLE_ROOT_FORMATS, root_marker_bytes
from dirmq.store.names import validate_queue_name
from dirmq.store.pool import DEFAULT_POOL_FILES, Owner, is_blank, pool_owner, reclaim_pool
from dirmq.store.processes import Liveness, liveness
from dirmq.store.recovery import ORPHAN_GRACE_S, is_orphan, older_than

# Message states in the order a duplicate is kept (first = kept first), and their name shapes.
_MESSAGE_DIRS = (layout.LEASED, layout.READY, layout.DELAYED, layout.DEAD)
_TIMED = frozenset({layout.LEASED, layout.DELAYED})
_LIVE = frozenset({layout.READY, layout.LEASED, layout.DELAYED})  # hold a capacity slot
_PROGRESS_BATCH = 256
# No lease or delay the store makes is further ahead than its longest duration; a day more
# leaves room for another host's clock running ahead of ours.
_LONGEST_MS = int(MAX_DURATION_S * 1000) + 86_400_000
_LONGEST_DAYS = _LONGEST_MS // 86_400_000


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


# Notices do not break an invariant the store relies on: they never make a report not `ok`.
# A dead process's pool is not damage either: the next open of the queue reclaims it.
NOTICE_KINDS = frozenset(
    {Kind.STRAY, Kind.MISSING_DLQ, Kind.ORPHAN_POOL, Kind.ORPHAN_HOLDER, Kind.STALE_RATE_SLOT}
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


def fsck(
    store_root: str | os.PathLike[str],
    *,
    repair: bool,
    progress: Callable[[int], None] | None = None,
) -> FsckReport:
    """Check every queue under `store_root`; with `repair`, fix what can be fixed safely.

    Without `repair` nothing on disk is changed. With it, no message that decodes is ever deleted
    unless another copy of the same id is kept, and nothing that cannot be repaired without
    guessing (an unknown root format, a queue directory holding messages but no configuration) is
    touched. `progress` receives increments of entries examined. Raises `InvalidArgument` if
    `store_root` is not a directory, `StorageError` if it cannot be read at all.
    """
    root = os.path.abspath(os.fspath(store_root))
    if not os.path.isdir(root):
        raise InvalidArgument(f"{root} is not a directory")
    checker = _Checker(root, repair, progress)
    try:
        checker.check_format()
        checker.walk(root, "")
        checker.check_holders()
        checker.check_root()
        checker.check_access()
    except OSError as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise storage_error(exc, f"checking {root}") from exc
    finally:
        checker.flush_progress()
    return checker.report()


@dataclass(slots=True)
class _Counts:
    queues: int = 0
    messages: int = 0
    expired: int = 0
    due: int = 0
    tmp_live: int = 0
    corrupt_kept: int = 0


@dataclass(slots=True)
class _QueueScan:
    """Per-queue bookkeeping: where each id was seen, which ids occur twice, live temp ids."""

    path: str
    name: str
    seen: dict[str, str] = field(default_factory=dict)  # id -> state dir (first copy)
    duplicates: set[str] = field(default_factory=set)
    tmp_ids: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)  # state dirs absent after the dir check
    corrupt_ids: set[str] = field(default_factory=set)  # corrupt, still in place (report only)
    quarantined: set[str] = field(default_factory=set)  # corrupt, moved to @corrupt by repair
    rehomed: set[str] = field(default_factory=set)  # paths of files re-homed by repair

    buckets: list[str] = field(default_factory=list)  # the backlog's (queue-relative)

    def dir(self, state: str) -> str:
        return os.path.join(self.path, state)

    def message_dirs(self) -> list[str]:
        """The state directories that hold messages, then the backlog's buckets."""
        return [*(d for d in _MESSAGE_DIRS if d not in self.missing), *self.buckets]


class _Checker:
    def __init__(self, root: str, repair: bool, progress: Callable[[int], None] | None) -> None:
        self.root = root
        self.repair = repair
        self.problems: list[Problem] = []
        self.counts = _Counts()
        self._progress = progress
        self._pending = 0
        self.access = Access.named(LEGACY)  # until check_format has read the marker
        self.holders_in_use: set[str] = set()  # holder tokens the lease names carry

    # -- bookkeeping -----------------------------------------------------------------------------
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

    def tick(self) -> None:
        self._pending += 1
        if self._pending >= _PROGRESS_BATCH:
            self.flush_progress()

    def flush_progress(self) -> None:
        if self._progress is not None and self._pending:
            self._progress(self._pending)
        self._pending = 0

    # -- the root ----------------------------------------------------------------------------------
    def check_format(self) -> None:
        """Before anything else: a root of a newer format is checked, never repaired; the
        root's access (what modes new entries get), from the marker or, where it has none
        that can be read, from the root directory's own mode."""
        data = _read_marker(self.root)
        marker = os.path.join(self.root, layout.ROOT_MARKER)
        try:
            self.access = (
                Access.from_marker(data) if isinstance(data, dict) else inferred_access(self.root)
            )
        except ConfigError as exc:
            self.access = inferred_access(self.root)
            self.fix("", marker, Kind.ROOT_MARKER, str(exc), self._write_marker)
        found = data.get("format") if isinstance(data, dict) else None
        if isinstance(found, int) and found not in READABLE_ROOT_FORMATS:
            # Its rules may differ from ours: "repairing" it could destroy what it means.
            self.repair = False
            detail = f"unsupported root format {found}: checked, nothing repaired"
            self.add("", marker, Kind.ROOT_MARKER, detail)

    def check_root(self) -> None:
        """After the walk: the root marker is missing or broken (format mismatch is done)."""
        marker = os.path.join(self.root, layout.ROOT_MARKER)
        data = _read_marker(self.root)
        if data is _MISSING:
            detail = f"{layout.ROOT_MARKER} is missing"
            if self.counts.queues == 0 and _has_entries(self.root):
                # Refuse to stamp an arbitrary, non-empty directory as a dirmq root.
                self.add(
                    "", marker, Kind.ROOT_MARKER, f"{detail}, and no queue either: not a root?"
                )
                return
            self.fix("", marker, Kind.ROOT_MARKER, detail, self._write_marker)
        elif not isinstance(data, dict) or not isinstance(data.get("format"), int):
            self.fix(
                "",
                marker,
                Kind.ROOT_MARKER,
                f"{layout.ROOT_MARKER} is not a JSON object with a format number",
                lambda: self._set_aside(marker) + "; " + self._write_marker(),
            )

    def _write_marker(self) -> str:
        marker = os.path.join(self.root, layout.ROOT_MARKER)
        data = root_marker_bytes(self.access)
        smallfiles.replace_file(marker, data, durable=True, access=self.access)
        return f"wrote a fresh {layout.ROOT_MARKER} ({self.access.name} access)"

    def check_access(self) -> None:
        """Every entry has the modes (and group) the root's access gives new ones: one more
        walk of the whole root, upper layers' directories included (+30% to a check of 30,000
        small messages). Not in a directory without a marker: it may be no root at all."""
        if not isinstance(_read_marker(self.root), dict):
            return
        gid = os.stat(self.root).st_gid if self.access.name == GROUP else None
        for path, st, problem in mismatches(self.root, self.access, gid):
            self.tick()
            self.fix("", path, Kind.ACCESS, problem, partial(_conform, path, st, self.access, gid))

    def _set_aside(self, path: str) -> str:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = f"{path}.bad-{stamp}"
        n = 1
        while os.path.lexists(target):
            n += 1
            target = f"{path}.bad-{stamp}-{n}"
        os.rename(path, target)
        return f"moved aside to {os.path.basename(target)}"

    def _check_trash(self, path: str) -> None:
        try:
            leftovers = sorted(os.listdir(path))
        except NotADirectoryError:
            self.add("", path, Kind.STRAY, "expected a directory")
            return
        if not leftovers:
            return

        def empty() -> str:
            for entry in leftovers:
                target = os.path.join(path, entry)
                if os.path.isdir(target) and not os.path.islink(target):
                    shutil.rmtree(target)
                else:
                    os.unlink(target)
            return "emptied"

        detail = f"{len(leftovers)} leftover(s) of an interrupted queue deletion"
        self.fix("", path, Kind.TRASH, detail, empty)

    # -- the walk ----------------------------------------------------------------------------------
    def walk(self, path: str, name: str) -> None:
        """Check the directory `path` (queue `name`, or "" for the root) and everything below."""
        with os.scandir(path) as it:
            entries = sorted(it, key=lambda e: e.name)
        names = {e.name for e in entries}
        is_queue = bool(name) and layout.CONFIG_FILE in names
        if is_queue:
            try:
                validate_queue_name(name)
            except InvalidName as exc:
                self.add(name, path, Kind.BAD_QUEUE_NAME, f"{exc}; the store cannot open it")
                return
            self.check_queue(path, name)
        elif name and names & set(layout.STATE_DIRS):
            self.check_unconfigured(path, name, sorted(names & set(layout.STATE_DIRS)))
        for entry in entries:
            child = entry.name
            if child.startswith("@"):
                self._check_reserved(name, entry)
            elif entry.is_dir(follow_symlinks=False):
                self.walk(entry.path, f"{name}/{child}" if name else child)
            elif not child.startswith(".nfs"):  # NFS "silly rename" files come and go
                self.add(name, entry.path, Kind.STRAY, "unknown file")

    def _check_reserved(self, name: str, entry: os.DirEntry[str]) -> None:
        child = entry.name
        if not name:
            if child == layout.ROOT_MARKER or child.startswith(f"{layout.ROOT_MARKER}.bad-"):
                return
            if child == layout.ROOT_TRASH:
                self._check_trash(entry.path)
                return
            if child == layout.HOLDERS_DIR:
                return  # after the walk, once every lease's holder is known (check_holders)
            if child in layout.ROOT_UPPER_DIRS:
                if not entry.is_dir(follow_symlinks=False):
                    self.add(name, entry.path, Kind.STRAY, "expected a directory")
                elif child != layout.PUBSUB_DIR:  # pub/sub's own check looks at its files
                    for temp in smallfiles.find_temps(entry.path, recursive=True):
                        self._check_small_temp(name, temp)
                return  # otherwise an upper layer's (`dirmq fsck` checks @pubsub too)
            if smallfiles.temp_target(child) == layout.ROOT_MARKER:
                self._check_small_temp(name, entry.path)
                return
        elif child in layout.STATE_DIRS or child == layout.RATE:
            return  # checked with the queue, or reported as unconfigured
        elif child == layout.CONFIG_FILE or child.startswith(f"{layout.CONFIG_FILE}.bad-"):
            return
        elif smallfiles.temp_target(child) == layout.CONFIG_FILE:
            self._check_small_temp(name, entry.path)
            return
        self.add(name, entry.path, Kind.STRAY, "unknown entry (names starting '@' are reserved)")

    def _check_small_temp(self, name: str, path: str) -> None:
        """A temp file of a small-file write (smallfiles.py): a crash leftover once it is old
        (a young one may be a write in progress)."""
        if not older_than(path, smallfiles.STALE_TEMP_S):
            return
        target = smallfiles.temp_target(os.path.basename(path))
        detail = f"temp file of an unfinished write of {target}"
        self.fix(name, path, Kind.ORPHAN_TMP, detail, _unlink(path))

    def check_holders(self) -> None:
        """@holders (holders.py): another host's record that no lease names an hour after it
        was written is a notice (`orphan-holder`), removed by a repair (one of a process gone
        from this host is no damage: a sweep removes it); a leftover temp as any small
        file's; anything else is stray."""
        directory = os.path.join(self.root, layout.HOLDERS_DIR)
        for entry in _scandir(directory):
            if smallfiles.temp_target(entry.name) is not None:
                self._check_small_temp("", entry.path)
            elif not is_record_name(entry.name):
                self.add("", entry.path, Kind.STRAY, "not a holder record")
            elif (detail := orphan_record(entry.path, self.holders_in_use)) is not None:
                self.fix("", entry.path, Kind.ORPHAN_HOLDER, detail, _unlink(entry.path))

    def check_unconfigured(self, path: str, name: str, state_dirs: list[str]) -> None:
        """State directories without @queue.json: a create or delete that crashed midway."""
        messages = 0
        for state in state_dirs:
            try:
                messages += sum(1 for _ in _scandir(os.path.join(path, state)))
            except NotADirectoryError:
                messages += 1
        if messages:
            # Inventing a configuration would be guessing; `dirmq create NAME` adopts the files.
            detail = (
                f"state directories without {layout.CONFIG_FILE} hold {messages} file(s); "
                f"'dirmq create {name}' adopts them, or remove the directories"
            )
            self.add(name, path, Kind.UNCONFIGURED, detail)
            return

        def remove() -> str:
            for state in state_dirs:
                os.rmdir(os.path.join(path, state))
            return "removed the empty state directories"

        detail = f"empty state directories without {layout.CONFIG_FILE} (a crashed create/delete)"
        self.fix(name, path, Kind.UNCONFIGURED, detail, remove)

    # -- one queue ---------------------------------------------------------------------------------
    def check_queue(self, path: str, name: str) -> None:
        self.counts.queues += 1
        scan = _QueueScan(path, name)
        self._check_config(scan)
        self._check_dirs(scan)
        self._check_tmp(scan)
        for state in _MESSAGE_DIRS:
            if state not in scan.missing:
                self._check_messages(scan, state)
        scan.buckets = backlog.bucket_dirs(path)
        for bucket in scan.buckets:  # ready messages behind @ready: checked as @ready's are
            self._check_messages(scan, bucket)
        for found in fsck_backlog.findings(path, self.access):
            if found.move_home is None:
                self.add(scan.name, found.path, Kind.STRAY, found.detail)
            else:
                self.fix(scan.name, found.path, Kind.MISNAMED, found.detail, found.move_home)
        for slot in fsck_rate.findings(path):  # delivery slots (flow.py)
            if slot.remove is None:
                self.add(scan.name, slot.path, Kind.STRAY, slot.detail)
            else:
                self.fix(scan.name, slot.path, Kind.STALE_RATE_SLOT, slot.detail, slot.remove)
        if scan.duplicates:
            self._resolve_duplicates(scan)
        self._check_slots(scan)
        if layout.FREE not in scan.missing:
            self._check_free(scan)
        if layout.CORRUPT not in scan.missing:
            self.counts.corrupt_kept += sum(1 for _ in _scandir(scan.dir(layout.CORRUPT)))

    def _check_config(self, scan: _QueueScan) -> None:
        config_path = os.path.join(scan.path, layout.CONFIG_FILE)
        try:
            with open(config_path, "rb") as f:
                config = QueueConfig.loads(f.read())
        except FileNotFoundError:
            return  # deleted while we looked: the queue is going away
        except ValueError as exc:  # ConfigError, and what the loader lets through (bad UTF-8)

            def replace() -> str:
                salvaged, reset = _salvage_config(config_path)
                aside = self._set_aside(config_path)
                smallfiles.replace_file(
                    config_path, salvaged.dumps(), durable=True, access=self.access
                )
                if reset is None:
                    return f"{aside} and wrote the default configuration: review it"
                return f"{aside}; kept the other settings, reset {', '.join(reset)} to default"

            self.fix(scan.name, config_path, Kind.BAD_CONFIG, str(exc), replace)
            return
        dlq = config.dead_letter_queue
        if dlq and not os.path.exists(os.path.join(self.root, *dlq.split("/"), layout.CONFIG_FILE)):
            detail = f"dead-letter queue {dlq!r} does not exist: dead messages stay in @dead"
            self.add(scan.name, config_path, Kind.MISSING_DLQ, detail)

    def _check_dirs(self, scan: _QueueScan) -> None:
        for state in layout.STATE_DIRS:
            directory = scan.dir(state)
            if os.path.isdir(directory) or (
                state == layout.BACKLOG and not os.path.lexists(directory)
            ):
                continue  # a queue made before the backlog gets it when next opened
            if os.path.lexists(directory):
                # Something else has the name: moving it aside would be guessing what it is.
                self.add(scan.name, directory, Kind.MISSING_DIR, "exists but is not a directory")
                scan.missing.add(state)
                continue

            def make(directory: str = directory) -> str:
                self.access.mkdir(directory)
                return "created"

            self.fix(scan.name, directory, Kind.MISSING_DIR, "state directory missing", make)
            if not os.path.isdir(directory):
                scan.missing.add(state)

    def _check_tmp(self, scan: _QueueScan) -> None:
        if layout.TMP in scan.missing:
            return
        for entry in _scandir(scan.dir(layout.TMP)):
            self.tick()
            parsed = layout.parse_tmp(entry.name)
            self._check_temp(scan, entry.path, entry.name, parsed[0] if parsed else None)

    def _check_temp(self, scan: _QueueScan, path: str, name: str, message_id: str | None) -> None:
        """A file being written: removed if no live writer will publish it, else counted (its
        message's capacity token and dedup record are not leaks)."""
        if is_orphan(path, name):
            self.fix(scan.name, path, Kind.ORPHAN_TMP, _orphan_reason(name), _unlink(path))
            return
        self.counts.tmp_live += 1
        if message_id is not None:
            scan.tmp_ids.add(message_id)

    def _check_free(self, scan: _QueueScan) -> None:
        """@free holds zeros, but three things in it matter: the pool of a dead process must
        not stay there forever, no recycled file may be another name's inode (overwriting it
        would change that file: a message, after a crash on a filesystem without a journal),
        and no file of the shared pool may still hold the message it was (it is blanked when
        retired; an earlier version did not). The pools of live processes are theirs."""
        free_dir = scan.dir(layout.FREE)
        entries = list(_scandir(free_dir))
        room = DEFAULT_POOL_FILES - sum(1 for e in entries if not e.is_dir(follow_symlinks=False))
        for entry in entries:
            self.tick()
            if entry.is_dir(follow_symlinks=False):
                owner = pool_owner(entry.name, entry.path)
                if owner is Owner.UNKNOWN:
                    self.add(scan.name, entry.path, Kind.STRAY, "unknown directory in @free")
                elif owner is not Owner.ALIVE:
                    why = "dead process" if owner is Owner.DEAD else "another host, idle 1 h"
                    unblanked = _unblanked_files(entry.path)
                    if unblanked:  # killed before its reaper got to them: unlinked, not reused
                        why += f", {unblanked} file(s) not blanked (acknowledged messages)"
                    self.fix(
                        scan.name,
                        entry.path,
                        Kind.ORPHAN_POOL,
                        f"recycled-file pool of a {why}",
                        partial(_reclaim_pool, entry.path, free_dir, owner, room),
                    )
                    room = 0  # what it returned fills the shared pool; no need to be exact
                continue
            try:
                st = entry.stat(follow_symlinks=False)
                blank = not entry.is_file(follow_symlinks=False) or is_blank(entry.path, st.st_size)
            except FileNotFoundError:
                continue  # claimed by a put meanwhile
            except OSError as exc:
                self.add(scan.name, entry.path, Kind.UNREADABLE, exc.strerror or str(exc))
                continue
            links = st.st_nlink
            if links == 1 and not blank:
                # Unlinked, never blanked here: a put may claim it meanwhile and write it.
                self.fix(
                    scan.name,
                    entry.path,
                    Kind.READABLE_FREE,
                    "recycled file still holds a retired message (retired by an earlier version)",
                    _unlink(entry.path),
                )
            if links > 1:
                self.fix(
                    scan.name,
                    entry.path,
                    Kind.LINKED_FREE,
                    f"recycled file has {links} names: it may be a message's",
                    _unlink(entry.path),
                )

    def _check_messages(self, scan: _QueueScan, state: str) -> None:
        now_ms = time.time_ns() // 1_000_000
        directory = scan.dir(state)
        renamed: set[str] = set()  # our own renames may show up again later in this listing
        for entry in _scandir(directory):
            name = entry.name
            if name in renamed or name.startswith(".nfs") or entry.path in scan.rehomed:
                continue
            self.tick()
            if not entry.is_file(follow_symlinks=False):
                self.add(scan.name, entry.path, Kind.STRAY, "not a regular file")
                continue
            parsed = parse_entry(name)
            if parsed is None and (beside := layout.parse_temp_beside(name)) is not None:
                final = parse_entry(beside[0])
                self._check_temp(scan, entry.path, name, final.message_id if final else None)
                continue
            if parsed is None:
                self._check_unparsed(scan, state, entry.path, name, now_ms)
                continue
            self.counts.messages += 1
            if not self._decodes(scan, entry.path, name, parsed.message_id):
                continue
            if state in _TIMED and parsed.at_ms is not None and parsed.at_ms > now_ms + _LONGEST_MS:
                # Further ahead than any duration the store accepts: a lease or delay made
                # before the store had bounds. It would hold the message for centuries.
                detail = f"{state} time of {name!r} is more than {_LONGEST_DAYS} days ahead"
                home = _home(state, parsed.message_id, parsed.count, None, parsed.group)
                self._rehome(scan, state, entry.path, parsed.message_id, detail, home)
                continue
            canonical = _canonical(state, parsed, now_ms)
            if canonical != name:
                detail = f"name {name!r} does not fit {state} (should be like {canonical!r})"
                self.fix(
                    scan.name,
                    entry.path,
                    Kind.BAD_NAME,
                    detail,
                    partial(_rename_in, directory, name, canonical),
                )
                if self.repair and not os.path.lexists(entry.path):
                    renamed.add(canonical)
                    parsed = parse_entry(canonical) or parsed
            if state == layout.LEASED and parsed.holder is not None:
                self.holders_in_use.add(parsed.holder)
            if state == layout.LEASED and parsed.at_ms is not None and parsed.at_ms <= now_ms:
                self.counts.expired += 1
            elif state == layout.DELAYED and parsed.at_ms is not None and parsed.at_ms <= now_ms:
                self.counts.due += 1
            if parsed.message_id in scan.seen:
                scan.duplicates.add(parsed.message_id)
            else:
                scan.seen[parsed.message_id] = state

    def _check_unparsed(
        self, scan: _QueueScan, state: str, path: str, name: str, now_ms: int
    ) -> None:
        """A name that does not parse: re-home the message if the file is one, else quarantine
        it (the file, not the name, decides whether anything is lost)."""
        self.counts.messages += 1
        salvaged = _salvage(name)
        try:
            decoded = _read_decoded(path, salvaged.message_id or None)
        except FileNotFoundError:
            return  # moved by a live process since the listing
        except CorruptMessage as exc:
            detail = f"not a message file name for {state}, nor a message file: {exc}"
            self.fix(
                scan.name, path, Kind.BAD_NAME, detail, partial(self._quarantine, scan, path, name)
            )
            return
        except OSError as exc:
            self.add(scan.name, path, Kind.UNREADABLE, exc.strerror or str(exc))
            return
        message_id = decoded.system.get(codec.ID) or salvaged.message_id
        if not is_id(message_id):
            detail = f"not a message file name for {state}, and the file names no message id"
            self.fix(
                scan.name, path, Kind.BAD_NAME, detail, partial(self._quarantine, scan, path, name)
            )
            return
        group = decoded.system.get("Group")
        tag = None if group is None else layout.group_tag(group)
        at_ms = salvaged.at_ms
        if at_ms is not None and at_ms > now_ms + _LONGEST_MS:
            at_ms = None  # a time the store would never have made: not believed
        home = _home(state, message_id, salvaged.count, at_ms, tag)
        detail = f"name {name!r} does not parse; the file is intact message {message_id}"
        self._rehome(scan, state, path, message_id, detail, home)

    def _rehome(
        self,
        scan: _QueueScan,
        state: str,
        path: str,
        message_id: str,
        detail: str,
        home: tuple[str, str],
    ) -> None:
        """Report (and with repair, rename) an intact message into `home` (state, name)."""
        target_state, new = home
        target = os.path.join(scan.dir(target_state), new)

        def move() -> str:
            if os.path.lexists(target):
                # Never replace: that file is another copy, left for the duplicate check.
                raise FileExistsError(0, f"{target_state}/{new} already exists")
            os.rename(path, target)
            scan.rehomed.add(target)  # a listing still to come may show it: counted here
            return f"re-homed to {target_state}/{new}"

        self.fix(scan.name, path, Kind.MISNAMED, detail, move)
        if message_id in scan.seen:
            scan.duplicates.add(message_id)
        else:
            scan.seen[message_id] = target_state if not os.path.lexists(path) else state

    def _decodes(self, scan: _QueueScan, path: str, name: str, message_id: str) -> bool:
        """True if the file decodes as message `message_id`; reports (and with repair
        quarantines) it otherwise."""
        try:
            _read_decoded(path, message_id)
        except FileNotFoundError:
            return False  # moved by a live process since the listing: not ours to judge now
        except CorruptMessage as exc:
            self.fix(
                scan.name, path, Kind.CORRUPT, str(exc), partial(self._quarantine, scan, path, name)
            )
            if os.path.lexists(path):
                scan.corrupt_ids.add(message_id)  # still holds its capacity slot
            return False
        except OSError as exc:
            self.add(scan.name, path, Kind.UNREADABLE, exc.strerror or str(exc))
            return False
        return True

    def _quarantine(self, scan: _QueueScan, path: str, name: str) -> str:
        target = os.path.join(scan.dir(layout.CORRUPT), name)
        n = 1
        while os.path.lexists(target):
            n += 1
            target = os.path.join(scan.dir(layout.CORRUPT), f"{name}.{n}")
        os.rename(path, target)
        parsed = parse_entry(name)
        if parsed is not None:
            scan.quarantined.add(parsed.message_id)
        return f"moved to {layout.CORRUPT}/{os.path.basename(target)}"

    # -- duplicates --------------------------------------------------------------------------------
    def _resolve_duplicates(self, scan: _QueueScan) -> None:
        """Look again at the ids seen twice: a file renamed between two directory listings was
        seen in both, and is one file (one inode), not two copies."""
        copies: dict[str, list[_Copy]] = {i: [] for i in scan.duplicates}
        for state in scan.message_dirs():
            for entry in _scandir(scan.dir(state)):
                parsed = parse_entry(entry.name)
                if parsed is None or parsed.message_id not in copies:
                    continue
                if not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    _read_decoded(entry.path, parsed.message_id)  # only good copies compete
                    links = entry.stat(follow_symlinks=False).st_nlink
                except (OSError, CorruptMessage):
                    continue
                copies[parsed.message_id].append(
                    _Copy(state, entry.name, parsed, entry.inode(), links)
                )
        for message_id, found in copies.items():
            inodes = {c.inode for c in found}
            if len(found) < 2 or (len(inodes) == 1 and found[0].links < 2):
                continue  # it moved while we listed; one file, no duplicate
            found.sort(key=_keep_order)
            keep, extra = found[0], found[1:]
            where = ", ".join(f"{c.state}/{c.name}" for c in found)
            detail = f"id {message_id} is in {len(found)} files ({where})"
            self.fix(
                scan.name,
                os.path.join(scan.dir(keep.state), keep.name),
                Kind.DUPLICATE,
                detail,
                partial(self._drop_copies, scan, keep, extra),
            )

    def _drop_copies(self, scan: _QueueScan, keep: _Copy, extra: list[_Copy]) -> str:
        if not os.path.exists(os.path.join(scan.dir(keep.state), keep.name)):
            # The kept copy moved since we looked: decide nothing on stale information.
            raise FileNotFoundError(0, "the kept copy moved meanwhile; run fsck again")
        for copy in extra:
            try:
                os.unlink(os.path.join(scan.dir(copy.state), copy.name))
            except FileNotFoundError:
                pass
        scan.seen[keep.parsed.message_id] = keep.state
        return f"kept {keep.state}/{keep.name}, removed {len(extra)} other cop(ies)"

    # -- capacity slots ----------------------------------------------------------------------------
    def _check_slots(self, scan: _QueueScan) -> None:
        if layout.SLOTS in scan.missing:
            return
        suspects: dict[str, str] = {}  # slot path -> target id
        for entry in _scandir(scan.dir(layout.SLOTS)):
            self.tick()
            if not entry.is_symlink():
                self.add(scan.name, entry.path, Kind.STRAY, "not a capacity slot symlink")
                continue
            try:
                target = os.readlink(entry.path)
                age_s = time.time() - entry.stat(follow_symlinks=False).st_mtime
            except FileNotFoundError:
                continue  # released meanwhile
            held = target in scan.tmp_ids or target in scan.corrupt_ids
            if held or scan.seen.get(target) in _LIVE:
                continue
            # A young slot may belong to a put between taking it and writing its file; the
            # slot of a message we just quarantined is known dead whatever its age.
            if age_s > LEAK_GRACE_S or target in scan.quarantined:
                suspects[entry.path] = target
        if not suspects:
            return
        # A message renamed backwards in our listing order (a nack: @leased -> @ready) can be
        # missed by both listings; one more look at the live directories settles it.
        present = self._live_ids(scan, set(suspects.values()))
        for path, target in sorted(suspects.items()):
            if target not in present:
                self.fix(
                    scan.name,
                    path,
                    Kind.LEAKED_SLOT,
                    f"points at absent message {target}",
                    partial(_release_slot, path, target),
                )

    def _live_ids(self, scan: _QueueScan, wanted: set[str]) -> set[str]:
        present: set[str] = set()
        live = [layout.READY, layout.LEASED, layout.DELAYED, *scan.buckets]
        for state in live:
            if state in scan.missing:
                continue
            for entry in _scandir(scan.dir(state)):
                beside = layout.parse_temp_beside(entry.name)
                parsed = parse_entry(beside[0] if beside else entry.name)
                if parsed is not None and parsed.message_id in wanted:
                    present.add(parsed.message_id)
        for entry in _scandir(scan.dir(layout.TMP)):
            parsed_tmp = layout.parse_tmp(entry.name)
            if parsed_tmp is not None and parsed_tmp[0] in wanted:
                present.add(parsed_tmp[0])
        return present


@dataclass(frozen=True, slots=True)
class _Copy:
    state: str
    name: str
    parsed: Entry
    inode: int
    links: int


def _keep_order(copy: _Copy) -> tuple[int, bool, int, int]:
    fits = copy.name == _canonical(copy.state, copy.parsed, copy.parsed.at_ms or 0)
    state = layout.READY if backlog.is_bucket_dir(copy.state) else copy.state
    return (
        _MESSAGE_DIRS.index(state),
        not fits,
        -copy.parsed.count,
        -(copy.parsed.at_ms or 0),
    )


def _canonical(state: str, entry: Entry, now_ms: int) -> str:
    """The name `entry` should have in `state` (a missing lease/due time becomes "now"); only
    a lease names a holder."""
    if state in _TIMED:
        at_ms = now_ms if entry.at_ms is None else entry.at_ms
        holder = entry.holder if state == layout.LEASED else None
        return layout.timed_name(
            entry.message_id, entry.count, at_ms, entry.group, holder, entry.level
        )
    if state == layout.DEAD:
        return layout.dead_name(entry.message_id, entry.count, entry.group, entry.level)
    return layout.ready_name(entry.message_id, entry.count, entry.group, entry.level)


@dataclass(frozen=True, slots=True)
class _Salvaged:
    """What can be read from the start of a name that does not parse, whatever junk follows:
    an id ("" if none), a receive count (0 if none), a time (None if none, or too long)."""

    message_id: str
    count: int
    at_ms: int | None


_SALVAGE_RE = re.compile(rf"({ID_PATTERN})?(?:\.([0-9]+))?(?:\.([0-9]+))?")


def _salvage(name: str) -> _Salvaged:
    match = _SALVAGE_RE.match(name)
    assert match is not None  # every group is optional
    # A count the store never makes is capped so that one more receive still fits a name.
    count = min(int(match[2]), MAX_RECEIVE_COUNT - 1) if match[2] else 0
    at_ms = int(match[3]) if match[3] and len(match[3]) <= AT_MS_DIGITS else None
    return _Salvaged(match[1] or "", count, at_ms)


def _home(
    state: str, message_id: str, count: int, at_ms: int | None, tag: str | None
) -> tuple[str, str]:
    """Where a misnamed message goes: (state, name). Its state is kept, unless it is a lease or
    delay whose time cannot stand (`at_ms` None): then it is ready (due now)."""
    if state in _TIMED:
        if at_ms is None:
            return layout.READY, layout.ready_name(message_id, count, tag)
        return state, layout.timed_name(message_id, count, at_ms, tag)
    if state == layout.DEAD:
        return state, layout.dead_name(message_id, count, tag)
    return layout.READY, layout.ready_name(message_id, count, tag)


def _rename_in(directory: str, name: str, new: str) -> str:
    target = os.path.join(directory, new)
    if os.path.lexists(target):
        # Never replace: the other file is a second copy, left for the duplicate check.
        raise FileExistsError(0, f"{new} already exists")
    os.rename(os.path.join(directory, name), target)
    return f"renamed to {new}"


def _unblanked_files(pool_dir: str) -> int:
    """How many files of a dead process's pool hold anything but zeros: retired files its
    reaper had not blanked yet (or one a put was overwriting). Never reused (`reclaim_pool`)."""
    count = 0
    for entry in _scandir(pool_dir):
        try:
            if entry.is_file(follow_symlinks=False):
                count += not is_blank(entry.path, entry.stat(follow_symlinks=False).st_size)
        except OSError:
            continue  # gone meanwhile, or unreadable: reclaim_pool unlinks what it cannot use
    return count


def _reclaim_pool(path: str, free_dir: str, owner: Owner, room: int) -> str:
    handled = reclaim_pool(path, free_dir, owner, max(room, 0))
    return f"reclaimed {handled} file(s)"


def _conform(path: str, st: os.stat_result, access: Access, gid: int | None) -> str:
    try:
        conform(path, st, access, gid)
    except FileNotFoundError:
        return "gone meanwhile"
    return f"set as the root's {access.name} access says"


def _release_slot(path: str, target: str) -> str:
    # Re-read the link: if someone re-took this slot meanwhile it points elsewhere, keep it.
    if os.readlink(path) != target:
        return "re-taken meanwhile, kept"
    os.unlink(path)
    return "released"


def _unlink(path: str) -> Callable[[], str]:
    def action() -> str:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return "removed"

    return action


def _orphan_reason(name: str) -> str:
    parsed = layout.parse_tmp(name) or layout.parse_temp_beside(name)
    if parsed is not None and liveness(parsed[1]) is Liveness.DEAD:
        return f"temp file of dead process {parsed[1].pid}"
    return f"temp file older than {ORPHAN_GRACE_S:.0f} s"


_MISSING = object()


def _salvage_config(path: str) -> tuple[QueueConfig, list[str] | None]:
    """The stored configuration without the settings that fail alone (e.g. a duration stored
    before the store had bounds), and their names; (defaults, None) if it is not a JSON object
    or still fails (settings that fail only together). SQS attributes and the dead-letter
    settings survive a single bad value."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return QueueConfig(), None
    if not isinstance(data, dict):
        return QueueConfig(), None
    reset = []
    for key, value in data.items():
        try:
            QueueConfig.from_json({key: value})
        except ValueError:  # ConfigError, InvalidName (a dead-letter queue's name)
            reset.append(key)
    try:
        return QueueConfig.from_json({k: v for k, v in data.items() if k not in reset}), reset
    except ValueError:
        return QueueConfig(), None


def _read_marker(root: str) -> object:
    """The parsed root marker; `_MISSING` if absent, None if it is not JSON."""
    try:
        with open(os.path.join(root, layout.ROOT_MARKER), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return _MISSING
    try:
        data: object = json.loads(raw)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return None
    return data


def _read_decoded(path: str, message_id: str | None) -> codec.Decoded:
    with open(path, "rb") as f:
        return codec.decode(f.read(), message_id)


def _scandir(path: str) -> Iterator[os.DirEntry[str]]:
    """Entries of `path`, streamed (never a full list of a large directory); none if absent."""
    try:
        with os.scandir(path) as it:
            yield from it
    except FileNotFoundError:
        return


def _has_entries(path: str) -> bool:
    return any(not e.name.startswith(layout.ROOT_MARKER) for e in _scandir(path))
