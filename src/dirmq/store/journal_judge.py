"""What a commit journal in `@journal/` needs (journal.py; docs/FORMAT.md, "The commit journal"),
as its name and header say (`judge`), for its recovery (journal_replay.py), a checkpoint's look
at dead processes' journals, and fsck:
- its owner runs (or cannot be seen from here: another pid namespace), in this boot: it is in
  use; left alone. An owner that is this very process under another image (it re-executed
  itself; a journal 1's name has no image) is gone;
- its owner is dead, in this boot: `DEAD`, flushed and removed, never replayed;
- a `syncfs` that was to clear it failed (`unflushed.<name>`: its owner's checkpoint,
  journal.py; or, a dead process's, any checkpoint's or recovery's: `keep_dead_unflushed`), in
  this boot: a file it covers may not be on the disk though the page cache shows it whole, and
  the kernel reported that once; kept, neither removed nor replayed, until a reboot makes it
  an earlier boot's (below); fsck reports it. So is one that could not be renamed so, its
  write permission taken away instead (`mark_unflushed`);
- its header is whole but not one this version reads (a newer journal format): left alone,
  for the dirmq that wrote it (removed, what it holds could be lost);
- it was written in an earlier boot (its header's boot id is not this kernel's): `CRASHED`,
  replayed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from enum import Enum

from dirmq.store import layout
from dirmq.store.filesystems import is_shared
from dirmq.store.fsio import fsync_dir
from dirmq.store.journal_format import (
    CLAIMED,
    UNFLUSHED,
    boot_id,
    header_version,
    image,
    parse_name,
)
from dirmq.store.processes import HOST_TAG, Liveness, ProcessIdentity, current, liveness

HEADER_MAX = 512
FOREIGN = "?"  # read_header's answer for a header it cannot read (no boot id holds a "?")


class Verdict(Enum):
    IN_USE = "in use"  # its owner (or claimer) runs, or cannot be seen from here
    DEAD = "dead"  # its owner died in this boot: flush and remove
    CRASHED = "crashed"  # written in an earlier boot: replay
    UNKNOWN = "unknown"  # not a journal's name
    FOREIGN = "foreign"  # a header this version does not read (a newer format's): left alone
    UNFLUSHED = "unflushed"  # its checkpoint's syncfs failed, this boot: kept until a reboot


@dataclass(frozen=True, slots=True)
class Judged:
    name: str
    verdict: Verdict
    owner: ProcessIdentity | None


def read_header(path: str) -> str | None:
    """The boot id in a journal's header; None if it has none (torn: no record follows);
    `FOREIGN` for a whole first line that is not a header this version reads (a newer
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
