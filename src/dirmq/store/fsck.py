"""Check, and optionally repair, every invariant of the on-disk format under one root.

Theory of operation. fsck walks the root with `os.scandir` (never following symlinks), and checks
each queue directory it meets (a directory holding `@queue.json`) one file at a time: a message
file is read, decoded (length and CRC) and dropped before the next is read, so memory grows with
the number of ids (for the duplicate and capacity checks), never with the bodies. It takes no lock
and is safe next to live processes: a file that disappears mid-check was moved by a normal
transition and is skipped, and the two checks that a concurrent transition could fool (duplicate
ids, leaked capacity slots) are confirmed by a second look before anything is reported or removed.

Invariants, and what `repair=True` does about each (see `Kind`):

    root marker @dirmq.json present, a JSON object with "format": 5   recreate (bad one moved aside)
    ... or an older one this version reads (1-4); any other format    report; repair nothing at all
        (a newer version's: its rules may differ)
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
      (and the buckets of @backlog and @delayed)
    a delay in the bucket of its due minute, @delayed/<minute>/      move it there (a flat entry
      (delays.py); nothing else in @delayed or its buckets             of format 4: a notice);
                                                                      strays: report (a notice)
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

Where each check is: this module walks the root and checks what it meets on the way (reserved
entries, queue directories and their names, state directories without a configuration); the
root's own files are fsck_root.py's; a queue's configuration, state directories, temps and
@free fsck_queue.py's; its message files fsck_messages.py's; duplicates and leaked slots (the
checks that need the whole queue's listing) fsck_copies.py's. The backlog's shape
(fsck_backlog.py), @delayed's buckets (fsck_delays.py) and @rate (fsck_rate.py) are queue
checks of one form, `(queue directory, access) -> Finding`s, listed in `QUEUE_CHECKS`: a new
part of a queue's layout gets its check there. Every check reports to one `Run`
(fsck_findings.py), which also holds the repair rule (report only, or repair, and what a
failed repair says), so the checks cannot drift apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from dirmq.errors import InvalidArgument, InvalidName, storage_error
from dirmq.store import backlog, delays, fsck_backlog, fsck_delays, fsck_rate, layout, smallfiles
from dirmq.store.filemodes import Access
from dirmq.store.fsck_copies import check_slots, resolve_duplicates
from dirmq.store.fsck_findings import NOTICE_KINDS, Finding, FsckReport, Kind, Problem, Run, scandir
from dirmq.store.fsck_journal import check_journals
from dirmq.store.fsck_messages import check_messages
from dirmq.store.fsck_queue import (
    MESSAGE_DIRS,
    QueueScan,
    check_config,
    check_dirs,
    check_free,
    check_tmp,
)
from dirmq.store.fsck_root import (
    check_access,
    check_format,
    check_holders,
    check_root,
    check_small_temp,
    check_trash,
)
from dirmq.store.names import validate_queue_name

__all__ = ["NOTICE_KINDS", "QUEUE_CHECKS", "FsckReport", "Kind", "Problem", "fsck"]

# The checks of one part of a queue that need nothing but its directory and the root's access,
# run in this order after its messages (each finding's kind and repair are its own).
QUEUE_CHECKS: tuple[Callable[[str, Access], Iterator[Finding]], ...] = (
    fsck_backlog.findings,  # the backlog's shape; its files are checked as @ready's
    fsck_delays.findings,  # @delayed's buckets: each delay in its due minute's
    fsck_rate.findings,  # delivery slots (flow.py)
)


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
    run = Run(root, repair, progress)
    try:
        check_format(run)
        check_journals(run)  # first: what a repair writes back is then checked as any message
        _walk(run, root, "")
        check_holders(run)
        check_root(run)
        check_access(run)
    except OSError as exc:
        if isinstance(exc, InvalidArgument):
            raise
        raise storage_error(exc, f"checking {root}") from exc
    finally:
        run.flush_progress()
    return run.report()


def _walk(run: Run, path: str, name: str) -> None:
    """Check the directory `path` (queue `name`, or "" for the root) and everything below."""
    with os.scandir(path) as it:
        entries = sorted(it, key=lambda e: e.name)
    names = {e.name for e in entries}
    is_queue = bool(name) and layout.CONFIG_FILE in names
    if is_queue:
        try:
            validate_queue_name(name)
        except InvalidName as exc:
            run.add(name, path, Kind.BAD_QUEUE_NAME, f"{exc}; the store cannot open it")
            return
        _check_queue(run, path, name)
    elif name and names & set(layout.STATE_DIRS):
        _check_unconfigured(run, path, name, sorted(names & set(layout.STATE_DIRS)))
    for entry in entries:
        child = entry.name
        if child.startswith("@"):
            _check_reserved(run, name, entry)
        elif entry.is_dir(follow_symlinks=False):
            _walk(run, entry.path, f"{name}/{child}" if name else child)
        elif not child.startswith(".nfs"):  # NFS "silly rename" files come and go
            run.add(name, entry.path, Kind.STRAY, "unknown file")


def _check_reserved(run: Run, name: str, entry: os.DirEntry[str]) -> None:
    """An entry whose name starts with '@' in queue `name`'s directory ("" for the root)."""
    child = entry.name
    if not name:
        if child == layout.ROOT_MARKER or child.startswith(f"{layout.ROOT_MARKER}.bad-"):
            return
        if child == layout.ROOT_TRASH:
            check_trash(run, entry.path)
            return
        if child == layout.JOURNAL_DIR:
            return  # before the walk (check_journals)
        if child == layout.HOLDERS_DIR:
            return  # after the walk, once every lease's holder is known (check_holders)
        if child in layout.ROOT_UPPER_DIRS:
            if not entry.is_dir(follow_symlinks=False):
                run.add(name, entry.path, Kind.STRAY, "expected a directory")
            elif child != layout.PUBSUB_DIR:  # pub/sub's own check looks at its files
                for temp in smallfiles.find_temps(entry.path, recursive=True):
                    check_small_temp(run, name, temp)
            return  # otherwise an upper layer's (`dirmq fsck` checks @pubsub too)
        if smallfiles.temp_target(child) == layout.ROOT_MARKER:
            check_small_temp(run, name, entry.path)
            return
    elif child in layout.STATE_DIRS or child == layout.RATE:
        return  # checked with the queue, or reported as unconfigured
    elif child == layout.CONFIG_FILE or child.startswith(f"{layout.CONFIG_FILE}.bad-"):
        return
    elif smallfiles.temp_target(child) == layout.CONFIG_FILE:
        check_small_temp(run, name, entry.path)
        return
    run.add(name, entry.path, Kind.STRAY, "unknown entry (names starting '@' are reserved)")


def _check_unconfigured(run: Run, path: str, name: str, state_dirs: list[str]) -> None:
    """State directories without @queue.json: a create or delete that crashed midway."""
    messages = 0
    for state in state_dirs:
        try:
            messages += sum(1 for _ in scandir(os.path.join(path, state)))
        except NotADirectoryError:
            messages += 1
    if messages:
        # Inventing a configuration would be guessing; `dirmq create NAME` adopts the files.
        detail = (
            f"state directories without {layout.CONFIG_FILE} hold {messages} file(s); "
            f"'dirmq create {name}' adopts them, or remove the directories"
        )
        run.add(name, path, Kind.UNCONFIGURED, detail)
        return

    def remove() -> str:
        for state in state_dirs:
            os.rmdir(os.path.join(path, state))
        return "removed the empty state directories"

    detail = f"empty state directories without {layout.CONFIG_FILE} (a crashed create/delete)"
    run.fix(name, path, Kind.UNCONFIGURED, detail, remove)


def _check_queue(run: Run, path: str, name: str) -> None:
    """One queue, in an order each check relies on: its frame first (what is missing is not
    looked into), its messages (which note what they see in the `QueueScan`), then the checks
    that need the whole listing."""
    run.counts.queues += 1
    scan = QueueScan(path, name)
    check_config(run, scan)
    check_dirs(run, scan)
    check_tmp(run, scan)
    for state in MESSAGE_DIRS:
        if state not in scan.missing:
            check_messages(run, scan, state)
    scan.buckets = backlog.bucket_dirs(path)
    for bucket in scan.buckets:  # ready messages behind @ready: checked as @ready's are
        check_messages(run, scan, bucket)
    if layout.DELAYED not in scan.missing:  # delays in the buckets of their due minutes
        scan.delay_buckets = [delays.bucket_dir(m) for m in delays.top(path)[0]]
    for bucket in scan.delay_buckets:
        check_messages(run, scan, bucket)
    for check in QUEUE_CHECKS:
        for finding in check(path, run.access):
            run.record(name, finding)
    if scan.duplicates:
        resolve_duplicates(run, scan)
    check_slots(run, scan)
    if layout.FREE not in scan.missing:
        check_free(run, scan)
    if layout.CORRUPT not in scan.missing:
        run.counts.corrupt_kept += sum(1 for _ in scandir(scan.dir(layout.CORRUPT)))
