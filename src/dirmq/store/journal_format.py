"""A commit journal file's name and bytes, as its writer (journal.py) makes them and recovery
(journal_replay.py) reads them: docs/FORMAT.md, "The commit journal".

Journal 2 (this version's) adds, to journal 1 (read still, never written): the process image in
the name (a process that re-executes itself keeps its pid and start time, so its new image
would take its old image's names, and the old image's journal would pass for the running
one's), and each record's queue incarnation (incarnation.py: a queue deleted and created again
is not its predecessor).
"""

from __future__ import annotations

import os
import re
import zlib
from dataclasses import dataclass

from dirmq.store.processes import ProcessIdentity, parse_token

MAGIC = b"dirmq-journal"
VERSION = 2  # what this version writes
READ_VERSIONS = (1, 2)
# A journal whose checkpoint's syncfs failed: `unflushed.<its name>`, kept until a replay
# after a reboot (journal.py `_keep_unflushed`).
UNFLUSHED = "unflushed"
CLAIMED = "replaying"  # a claimed journal: replaying.<boot>.<claimer>.<its own name>
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_IMAGE = re.compile(r"[0-9a-f]{16}")  # (a host tag, the first part of a token, has 8)


def boot_id() -> str:
    """The running kernel's boot id ("" where unknown: no journal is written then, since
    nobody could tell a crash's journal from a live one)."""
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


def _new_image() -> None:
    global _image
    _image = os.urandom(8).hex()


_image = ""
_new_image()
os.register_at_fork(after_in_child=_new_image)


def image() -> str:
    """This process image's 16 random hex digits: drawn at its start (and in a forked child),
    and again by a process that re-executes itself, which keeps its pid and start time."""
    return _image


def file_name(owner: str, number: int) -> str:
    """The name of this image's journal number `number` (owner: this process's token)."""
    return f"{owner}.{_image}.{number}"


def claim_name(boot: str, claimer: str, original: str) -> str:
    """The name a journal `original` takes while this image replays it."""
    return f"{CLAIMED}.{boot}.{claimer}.{_image}.{original}"


@dataclass(frozen=True, slots=True)
class JournalName:
    owner: ProcessIdentity
    image: str | None  # None: a journal 1's name, which has none
    claimer: ProcessIdentity | None = None  # a claimed journal's
    claimer_image: str | None = None
    claim_boot: str = ""
    original: str = ""  # its name before it was claimed (or marked unflushed)


def parse_name(name: str) -> JournalName | None:
    """What a journal's file name says (`unflushed.` aside), or None for another name:
    `<owner>.<image>.<n>` (journal 1: `<owner>.<n>`), claimed `replaying.<boot>.<claimer>.
    <claimer's image>.<that>` (by an earlier version: no claimer's image)."""
    parts = name.split(".")
    if parts[0] != CLAIMED:
        return _parse_own(parts)
    if len(parts) < 7:
        return None
    claimer = parse_token(".".join(parts[2:6]))
    claimer_image = parts[6] if _IMAGE.fullmatch(parts[6]) else None
    own = _parse_own(parts[7:] if claimer_image else parts[6:])
    if claimer is None or own is None:
        return None
    return JournalName(own.owner, own.image, claimer, claimer_image, parts[1], own.original)


def _parse_own(parts: list[str]) -> JournalName | None:
    if len(parts) not in (5, 6) or not parts[-1].isdigit():
        return None
    image = parts[4] if len(parts) == 6 else None
    if image is not None and not _IMAGE.fullmatch(image):
        return None
    owner = parse_token(".".join(parts[:4]))
    return None if owner is None else JournalName(owner, image, original=".".join(parts))


def header(boot: str, owner: str, version: int = VERSION) -> bytes:
    """A journal file's first line: what it is (and its version), the boot it was written in,
    its owner."""
    return b"%s %d boot=%s owner=%s\n" % (MAGIC, version, boot.encode(), owner.encode())


def header_version(line: bytes) -> int | None:
    """The journal version of a header line (its newline cut), or None for one this version
    does not read (a newer journal's, or a file edited by hand)."""
    fields = line.split(b" ")
    if len(fields) < 3 or fields[0] != MAGIC or not fields[2].startswith(b"boot="):
        return None
    version = int(fields[1]) if fields[1].isdigit() else 0
    return version if version in READ_VERSIONS else None


def record_pieces(
    queue: str, name: str, data: bytes, incarnation: str | None = None
) -> list[bytes]:
    """One record: `@<crc32 of the rest, 8 hex> <length of the rest>\\n<queue>\\0<incarnation>
    \\0<name>\\0<data>` (journal 1: no incarnation), as pieces for one `writev` (the data not
    copied)."""
    if incarnation is None:
        prefix = f"{queue}\0{name}\0".encode()
    else:
        prefix = f"{queue}\0{incarnation}\0{name}\0".encode()
    crc = zlib.crc32(data, zlib.crc32(prefix))
    return [b"@%08x %d\n" % (crc, len(prefix) + len(data)), prefix, data]
