"""Recovering the commit journals other processes left (journal.py; docs/FORMAT.md, "The commit
journal"): by every Store that opens the root (one listing of `@journal/`), every 15 s in the
server (`Store.sweep_journals`) and by `dirmq fsck --repair`, as each journal's verdict says
(journal_judge.py):
- a dead process's of this boot: every file its records name was given its name by this
  kernel, so it is in the page cache and reaches the disk with a `syncfs`; the journal is then
  removed. Replaying it would bring back messages consumed and acknowledged since;
- one written in an earlier boot (a machine crash may have lost any file or name it covers):
  claimed by a rename (of two recovering processes one wins, the other finds it gone), then
  each record whose message is in its queue in no state (same id: @ready, the backlog,
  @leased, @delayed, @dead), or only in a file that fails its checksum, is written durably
  (its capacity slot taken again first) where it was meant to go (a lease's into @ready, the
  consumer being gone; a backlog or delay bucket no longer there: @ready, or @delayed flat),
  and the journal is removed. A record of a queue deleted since, or of another incarnation of
  it (deleted and created again: incarnation.py), is skipped. A torn record (a crash
  mid-append) ends the journal: its publish was never answered, nor was any after it. A
  journal claimed by a process that died (or by an earlier boot) is claimed again and
  replayed again: a replay only writes what is missing.

A consumer's ack is no more durable than before: after a machine crash an acknowledged message
may come back from a journal, as an ack whose rename was lost may (at-least-once).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from dirmq.errors import CorruptMessage, InvalidName
from dirmq.store import backlog, delays, layout
from dirmq.store.capacity import slot_in
from dirmq.store.filemodes import Access
from dirmq.store.fsio import create_pending, fsync_dir, syncfs
from dirmq.store.incarnation import incarnation, same
from dirmq.store.journal_format import UNFLUSHED, boot_id, claim_name, header_version, parse_name
from dirmq.store.journal_judge import Judged, Verdict, judge_all, keep_dead_unflushed
from dirmq.store.names import validate_queue_name
from dirmq.store.processes import current
from dirmq.store.reading import read_message

# The states a publish names a new file in (FORMAT.md's record `<name>`), the only ones a record
# may name: a message file among @slots' or @dedup's symlinks, @free's or @tmp's files, or the
# dead letters would be one no writer made.
_PUBLISHED_INTO = (layout.READY, layout.BACKLOG, layout.DELAYED, layout.LEASED)


@dataclass(frozen=True, slots=True)
class Record:
    queue: str
    name: str  # in the queue's directory: "@ready/<name>", "@backlog/<e>/<s>/<name>", ...
    data: bytes
    incarnation: str | None = None  # of the queue it was published in (None: journal 1)


def read_records(path: str) -> Iterator[Record]:
    """The records of a journal, up to its end or its first torn record."""
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(b"\n") + 1
    version = header_version(data[: at - 1]) if at else None
    if version is None:
        return
    fields = 3 if version == 1 else 4
    while at < len(data):
        end = data.find(b"\n", at, at + 32)
        if end < 0 or data[at : at + 1] != b"@":
            return
        try:
            crc_text, length_text = data[at + 1 : end].split(b" ")
            crc, length = int(crc_text, 16), int(length_text)
        except ValueError:
            return
        body = data[end + 1 : end + 1 + length]
        if len(body) != length or zlib.crc32(body) != crc:
            return
        try:
            parts = body.split(b"\0", fields - 1)
            queue, name, payload = parts[0], parts[-2], parts[-1]
            born = parts[1].decode() if fields == 4 else None
            record = Record(queue.decode(), name.decode(), payload, born)
        except (ValueError, IndexError):  # not what a writer wrote (UnicodeDecodeError is one)
            return
        yield record
        at = end + 1 + length


def recover_journals(root: str, access: Access) -> int:
    """Recover every journal of `root` that needs it; the number of messages written back."""
    judged = [j for j in judge_all(root) if j.verdict in (Verdict.DEAD, Verdict.CRASHED)]
    if not judged:
        return 0
    replayed = 0
    if any(j.verdict is Verdict.DEAD for j in judged):
        _syncfs(root)  # their files are in this kernel's page cache: now on the disk
    for j in judged:
        replayed += recover(root, j, access, flushed=True)
    fsync_dir(os.path.join(root, layout.JOURNAL_DIR))
    return replayed


def recover(root: str, judged: Judged, access: Access, *, flushed: bool = False) -> int:
    """Recover one journal `judge` found dead or crashed (`flushed`: the caller `syncfs`ed the
    root since); the number of messages written back."""
    path = os.path.join(root, layout.JOURNAL_DIR, judged.name)
    if judged.verdict is Verdict.CRASHED:
        return replay(root, judged.name, access)
    if judged.verdict is Verdict.DEAD:
        if not flushed:
            _syncfs(root)
        _unlink(path)
    return 0


def _syncfs(root: str) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        syncfs(fd)
    except OSError:
        keep_dead_unflushed(root)
        raise
    finally:
        os.close(fd)


def replay(root: str, name: str, access: Access) -> int:
    """Claim the journal `name` of an earlier boot and write back what its records hold and
    the queues miss; the number written (0 if another process claimed it first)."""
    directory = os.path.join(root, layout.JOURNAL_DIR)
    parsed = parse_name(name.removeprefix(UNFLUSHED + "."))
    if parsed is None:
        return 0
    claimed = os.path.join(directory, claim_name(boot_id(), current().token(), parsed.original))
    try:
        os.rename(os.path.join(directory, name), claimed)
    except FileNotFoundError:
        return 0  # another process claimed it
    by_queue: dict[str, list[Record]] = {}
    for record in read_records(claimed):
        if _sound(record):
            by_queue.setdefault(record.queue, []).append(record)
    written = 0
    for queue, records in by_queue.items():
        written += _replay_queue(os.path.join(root, queue), records, access)
    _unlink(claimed)
    return written


def _sound(record: Record) -> bool:
    """Whether a record names a place inside its queue, as a writer would (a file edited by
    hand may name anything: nothing outside the root is ever written)."""
    try:
        validate_queue_name(record.queue)
    except InvalidName:
        return False
    parts = record.name.split("/")
    return parts[0] in _PUBLISHED_INTO and all(p and p not in (".", "..") for p in parts)


def _replay_queue(queue_dir: str, records: list[Record], access: Access) -> int:
    if not os.path.exists(os.path.join(queue_dir, layout.CONFIG_FILE)):
        return 0  # the queue was deleted since: its messages with it
    try:
        now: str | None = incarnation(queue_dir)
    except OSError:
        now = None
    # Another creation of the queue (deleted and created again since): not its messages.
    records = [
        r
        for r in records
        if r.incarnation is None or (now is not None and same(r.incarnation, now))
    ]
    if not records:
        return 0
    ids = {os.path.basename(r.name)[: layout.ID_LENGTH] for r in records}
    found = _locate(queue_dir, ids)
    written = 0
    for record in records:
        message_id = os.path.basename(record.name)[: layout.ID_LENGTH]
        place = found.get(message_id)
        if place is not None:
            path = f"{queue_dir}/{place[0]}/{place[1]}"
            try:
                read_message(path, message_id)
                continue  # there, intact: whatever became of it since stands
            except CorruptMessage:
                _unlink(path)  # torn by the crash: written anew below
            except FileNotFoundError:
                pass
        if _write_back(queue_dir, record, message_id, access):
            written += 1
    return written


def _locate(queue_dir: str, ids: set[str]) -> dict[str, tuple[str, str]]:
    """(queue-relative directory, name) of each of `ids` found in the queue, in any state."""
    found: dict[str, tuple[str, str]] = {}
    for directory in (layout.READY, layout.LEASED, layout.DEAD):
        try:
            names = os.listdir(os.path.join(queue_dir, directory))
        except FileNotFoundError:
            continue
        for name in names:
            message_id = name[: layout.ID_LENGTH]
            if message_id in ids and message_id not in found:
                found[message_id] = (directory, name)
    if missing := ids - found.keys():
        found.update(backlog.find(queue_dir, missing))
    if missing := ids - found.keys():
        found.update(delays.find(queue_dir, missing))
    return found


def _write_back(queue_dir: str, record: Record, message_id: str, access: Access) -> bool:
    """Write the record's message durably where it was meant to go (see the module's
    docstring); False if a file of that name appeared meanwhile."""
    directory, _, name = record.name.rpartition("/")
    entry = layout.parse_entry(name)
    if entry is None:
        return False
    target_dir = f"{queue_dir}/{directory}"
    if directory == layout.LEASED:
        target_dir = f"{queue_dir}/{layout.READY}"
        name = layout.ready_name(message_id, entry.count, entry.group, entry.level)
    elif not os.path.isdir(target_dir):
        home = layout.DELAYED if entry.at_ms is not None else layout.READY
        target_dir = f"{queue_dir}/{home}"
    slot = slot_in(record.data)
    if slot is not None and slot.isdigit():
        _hold_slot(f"{queue_dir}/{layout.SLOTS}", slot, message_id)
    pending = create_pending(
        f"{queue_dir}/{layout.TMP}",
        layout.tmp_name(message_id),
        f"{target_dir}/{name}",
        record.data,
        access,
    )
    try:
        os.fsync(pending.fd)
        pending.publish()
    except FileExistsError:
        pending.discard()
        return False
    except BaseException:
        pending.discard()
        raise
    fsync_dir(target_dir)
    return True


def _hold_slot(slots_dir: str, slot: str, message_id: str) -> None:
    """Take the capacity slot the message names again, first (as its publish did): a crash
    that lost the message lost its slot's symlink too, never flushed by itself. A slot taken
    by another message since stays its (the queue holds one more than its capacity until one
    of them goes)."""
    try:
        os.symlink(message_id, f"{slots_dir}/{slot}")
    except FileExistsError:
        return
    except FileNotFoundError:  # no @slots: the queue has no capacity any more
        return
    fsync_dir(slots_dir)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
