"""Recovering the commit journals other processes left (journal.py; docs/FORMAT.md, "The commit
journal"): by every Store that opens the root (one listing of `@journal/`) and by `dirmq fsck
--repair`.

What a journal needs depends on who wrote it and when (`judge`):
- its owner runs (or cannot be seen from here: another pid namespace), in this boot: it is in
  use; left alone;
- its owner is dead, in this boot: every file its records name was given its name by this
  kernel, so it is in the page cache and reaches the disk with a `syncfs`; the journal is then
  removed. Replaying it would bring back messages consumed and acknowledged since;
- a `syncfs` that was to clear it failed (`unflushed.<name>`: its owner's checkpoint,
  journal.py; or, a dead process's, any checkpoint's or recovery's), in this boot: a file it
  covers may not be on the disk though the page cache shows it whole, and the kernel reported
  that once; kept, neither removed nor replayed, until a reboot makes it an earlier boot's
  (below); fsck reports it. So is one that could not be renamed so, its write permission
  taken away instead (`mark_unflushed`);
- its header is whole but not one this version writes (a newer journal format): left alone,
  for the dirmq that wrote it (removed, what it holds could be lost);
- it was written in an earlier boot (its header's boot id is not this kernel's): a machine
  crash may have lost any file or name it covers. It is claimed by a rename (of two recovering
  processes one wins, the other finds it gone), then each record whose message is in its queue
  in no state (same id: @ready, the backlog, @leased, @delayed, @dead), or only in a file that
  fails its checksum, is written durably (its capacity slot taken again first) where it was
  meant to go (a lease's into @ready, the
  consumer being gone; a backlog or delay bucket no longer there: @ready, or @delayed flat),
  and the journal is removed. A torn record (a crash mid-append) ends the journal: its publish
  was never answered, nor was any after it. A journal claimed by a process that died (or by an
  earlier boot) is claimed again and replayed again: a replay only writes what is missing.

A consumer's ack is no more durable than before: after a machine crash an acknowledged message
may come back from a journal, as an ack whose rename was lost may (at-least-once).
"""

from __future__ import annotations

import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from dirmq.errors import CorruptMessage, InvalidName
from dirmq.store import backlog, delays, layout
from dirmq.store.capacity import slot_in
from dirmq.store.filemodes import Access
from dirmq.store.filesystems import is_shared
from dirmq.store.fsio import create_pending, fsync_dir, syncfs
from dirmq.store.incarnation import incarnation
from dirmq.store.journal_format import (
    CLAIMED,
    UNFLUSHED,
    boot_id,
    claim_name,
    header_version,
    image,
    parse_name,
)
from dirmq.store.names import validate_queue_name
from dirmq.store.processes import HOST_TAG, Liveness, ProcessIdentity, current, liveness
from dirmq.store.reading import read_message

HEADER_MAX = 512
FOREIGN = "?"  # read_header's answer for a header it cannot read (no boot id holds a "?")
# The states a publish names a new file in (FORMAT.md's record `<name>`), the only ones a record
# may name: a message file among @slots' or @dedup's symlinks, @free's or @tmp's files, or the
# dead letters would be one no writer made.
_PUBLISHED_INTO = (layout.READY, layout.BACKLOG, layout.DELAYED, layout.LEASED)


class Verdict(Enum):
    IN_USE = "in use"  # its owner (or claimer) runs, or cannot be seen from here
    DEAD = "dead"  # its owner died in this boot: flush and remove
    CRASHED = "crashed"  # written in an earlier boot: replay
    UNKNOWN = "unknown"  # not a journal's name
    FOREIGN = "foreign"  # a header this version does not write (a newer format's): left alone
    UNFLUSHED = "unflushed"  # its checkpoint's syncfs failed, this boot: kept until a reboot


@dataclass(frozen=True, slots=True)
class Judged:
    name: str
    verdict: Verdict
    owner: ProcessIdentity | None


@dataclass(frozen=True, slots=True)
class Record:
    queue: str
    name: str  # in the queue's directory: "@ready/<name>", "@backlog/<e>/<s>/<name>", ...
    data: bytes
    incarnation: str | None = None  # of the queue it was published in (None: journal 1)


def read_header(path: str) -> str | None:
    """The boot id in a journal's header; None if it has none (torn: no record follows);
    `FOREIGN` for a whole first line that is not a header this version writes (a newer
    journal format, or a file edited by hand): no record of it can be read, so none may be
    dropped with it."""
    try:
        with open(path, "rb") as f:
            head, newline, _ = f.read(HEADER_MAX).partition(b"\n")
    except FileNotFoundError:
        return None
    if not newline:  # a header is one write flushed before any record: this one was cut short
        return None
    if header_version(head) is None:
        return FOREIGN
    return head.split(b" ")[2][5:].decode(errors="replace")


def read_records(path: str) -> Iterator[Record]:
    """The records of a journal, up to its end or its first torn record."""
    with open(path, "rb") as f:
        data = f.read()
    at = data.find(b"\n") + 1
    version = header_version(data[: at - 1])
    if not at or version is None:
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


def judge(directory: str, name: str, boot: str, shared: bool = False) -> Judged:
    """What the journal `name` needs (the module's docstring). `shared`: the root is on a
    shared filesystem, where another host's journal is of another kernel, not of an earlier
    boot (no process writes one there, but one that was told the filesystem is local might)."""
    unflushed = name.startswith(UNFLUSHED + ".")
    parsed = parse_name(name.removeprefix(UNFLUSHED + "."))
    if parsed is None:
        return Judged(name, Verdict.UNKNOWN, None)
    owner, claimer = parsed.owner, parsed.claimer
    if shared and (claimer or owner).host != HOST_TAG:
        return Judged(name, Verdict.IN_USE, owner)
    if (
        claimer is not None
        and parsed.claim_boot == boot
        and not _gone(claimer, parsed.claimer_image)
    ):
        return Judged(name, Verdict.IN_USE, owner)  # being replayed
    written_in = read_header(os.path.join(directory, name))
    if written_in == FOREIGN:
        return Judged(name, Verdict.FOREIGN, owner)
    if written_in is not None and written_in != boot:
        return Judged(name, Verdict.CRASHED, owner)
    if unflushed or marked_unflushed(os.path.join(directory, name)):  # what its files hold
        # in this kernel's page cache may not be on the disk: neither removed nor replayed
        return Judged(name, Verdict.UNFLUSHED, owner)
    # This boot's (or torn before its header was durable: then it holds no record).
    if claimer is None and not _gone(owner, parsed.image):
        return Judged(name, Verdict.IN_USE, owner)
    return Judged(name, Verdict.DEAD, owner)


def _gone(process: ProcessIdentity, process_image: str | None) -> bool:
    """Whether the process image that named a journal is gone: its process is dead, or it is
    this process and another image of it (one that re-executed itself: one image at a time
    runs a pid; a journal 1's name, which has no image, is never this image's)."""
    if process == current():
        return process_image != image()
    return liveness(process) is Liveness.DEAD


def judge_all(root: str) -> list[Judged]:
    directory = os.path.join(root, layout.JOURNAL_DIR)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    if not names:
        return []
    boot, shared = boot_id(), is_shared(root)
    return [judge(directory, name, boot, shared) for name in names if not name.startswith(".")]


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


def keep_dead_unflushed(root: str) -> None:
    """A `syncfs` of the root failed (a recovery's, or a checkpoint's: journal.py): the files
    the journals of dead processes cover may not be on the disk, and the kernel reports that
    error once, to the descriptors open when it happened: a later opener's flush would
    succeed and remove them. So each is kept as `unflushed.<name>`, as the failing process's
    own are (replayed after a reboot). One whose header is torn holds no record: left as it
    is. Best effort: the caller raises the flush's error whatever happens here."""
    directory = os.path.join(root, layout.JOURNAL_DIR)
    boot = boot_id()
    try:
        judged_all = judge_all(root)
    except OSError:
        return
    for judged in judged_all:  # each, whatever fails for another
        path = os.path.join(directory, judged.name)
        claimed = judged.name.startswith(CLAIMED + ".")  # (only an earlier boot's is)
        if judged.verdict is Verdict.DEAD and not claimed and read_header(path) == boot:
            try:
                os.rename(path, os.path.join(directory, f"{UNFLUSHED}.{judged.name}"))
            except FileNotFoundError:
                pass  # another process recovered it first
            except OSError:
                mark_unflushed(path)
    try:
        fsync_dir(directory)
    except OSError:
        pass


def mark_unflushed(path: str) -> None:
    """Keep the journal at `path`, which a failed `syncfs` was to clear, where it could not be
    renamed `unflushed.<name>` (a failing disk refuses a directory's write first): its write
    permission taken away, a change of its inode alone. Under its owner's name it would
    otherwise be judged the journal of a process that merely died, and removed. Best effort:
    a disk that refuses this too refuses the removal as well."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        os.chmod(path, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    except OSError:
        pass


def marked_unflushed(path: str) -> bool:
    """Whether `mark_unflushed` kept the journal at `path` (every writer makes it writable;
    fsck leaves its mode as it is)."""
    try:
        return not os.stat(path).st_mode & stat.S_IWUSR
    except FileNotFoundError:
        return False


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
        now = incarnation(queue_dir)
    except OSError:
        now = None
    # Another creation of the queue (deleted and created again since): not its messages.
    records = [r for r in records if r.incarnation is None or r.incarnation == now]
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
