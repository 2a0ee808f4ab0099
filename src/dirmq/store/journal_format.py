"""A commit journal file's bytes, as its writer (journal.py) appends them and recovery
(journal_replay.py) reads them: docs/FORMAT.md, "The commit journal"."""

from __future__ import annotations

import zlib

MAGIC = b"dirmq-journal 1"
# A journal whose checkpoint's syncfs failed: `unflushed.<its name>`, kept until a replay
# after a reboot (journal.py `_keep_unflushed`).
UNFLUSHED = "unflushed"
_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str:
    """The running kernel's boot id ("" where unknown: no journal is written then, since
    nobody could tell a crash's journal from a live one)."""
    try:
        with open(_BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


def header(boot: str, owner: str) -> bytes:
    """A journal file's first line: what it is, the boot it was written in, its owner."""
    return b"%s boot=%s owner=%s\n" % (MAGIC, boot.encode(), owner.encode())


def record_pieces(queue: str, name: str, data: bytes) -> list[bytes]:
    """One record: `@<crc32 of the rest, 8 hex> <length of the rest>\\n<queue>\\0<name>\\0
    <data>`, as pieces for one `writev` (the data not copied)."""
    prefix = f"{queue}\0{name}\0".encode()
    crc = zlib.crc32(data, zlib.crc32(prefix))
    return [b"@%08x %d\n" % (crc, len(prefix) + len(data)), prefix, data]
