"""The root marker `@dirmq.json`: which format a root is in, and what it holds.

Format 2 adds lease holders (`+<token>` at the end of a lease name, records in `@holders`:
docs/FORMAT.md, "Lease holders"); format 3 the backlog (`@backlog/` in a queue: "The
backlog"); format 4 message priorities (`^<level>` in state names, `@backlog/p<level>/`:
"Priorities"); format 5 delayed messages in buckets of their due minute (`@delayed/<minute>/`:
"Delayed messages"); format 6 commit journals (`@journal/`: "The commit journal"), marked by
the first process that writes one. A root of format 1 to 4 is read alike (flat entries of
@delayed are moved into their buckets as a process meets them), and marked 5 when a Store opens
it: the `dirmq fsck` of an earlier version repairs nothing in a root of a format it does not
know, where it would otherwise re-home what it cannot parse. A root of a format this version
does not know is refused (`check_readable`): it may hold what this version cannot recover (a
format-6 root, a journal a format-5 process would not replay after a machine crash). A format
is never marked backwards: the mark of 5 edits the file it read (`mark_current`), and a
journal's first file marks 6 again once it exists (journal.py).
"""

from __future__ import annotations

import json
import os
import re

from dirmq.errors import ConfigError
from dirmq.store import layout, smallfiles
from dirmq.store.filemodes import Access, read_marker

ROOT_FORMAT = 6  # the newest this version reads and writes
BASE_FORMAT = 5  # what a root is marked until a journal is written in it
READABLE_ROOT_FORMATS = (1, 2, 3, 4, 5, 6)
MARKER_MAX = 1 << 16  # a marker is tens of bytes: more is no marker this version wrote
_FORMAT_VALUE = re.compile(rb'"format"\s*:\s*([1-4])(?![0-9])')


def root_marker_bytes(access: Access, root_format: int = ROOT_FORMAT) -> bytes:
    """What `@dirmq.json` holds: the format, and the root's access (absent for a legacy root)."""
    return json.dumps({"format": root_format, **access.marker_fields()}).encode() + b"\n"


def format_to_write(root: str) -> int:
    """The format a marker written anew says: 6 where the root is marked so or has journals
    (a format-5 process must not take it for its own), else 5."""
    data = read_marker(root)
    if isinstance(data, dict) and data.get("format") == ROOT_FORMAT:
        return ROOT_FORMAT
    return ROOT_FORMAT if os.path.isdir(os.path.join(root, layout.JOURNAL_DIR)) else BASE_FORMAT


def write_marker(root: str, access: Access) -> None:
    """Write `@dirmq.json` anew (durably) for `access`, in the format `format_to_write` says.
    That read and this rename are not one step: a process that writes its first journal
    between them marks 6, which the rename would put 5 over. So a 5 written where journals
    exist now is marked 6 again (the journal's own re-mark, once its first file exists, covers
    a rename that comes before that file)."""
    root_format = format_to_write(root)
    marker = os.path.join(root, layout.ROOT_MARKER)
    smallfiles.replace_file(
        marker, root_marker_bytes(access, root_format), durable=True, access=access
    )
    if root_format != ROOT_FORMAT and os.path.isdir(os.path.join(root, layout.JOURNAL_DIR)):
        mark_journaled(root, access)


def check_readable(root: str) -> None:
    """Refuse a root marked with a format this version does not know (a newer one)."""
    data = read_marker(root)
    found = data.get("format") if isinstance(data, dict) else None
    if isinstance(found, int) and found not in READABLE_ROOT_FORMATS:
        raise ConfigError(
            f"{root} is a root of format {found}, newer than this dirmq reads (up to "
            f"{ROOT_FORMAT}); open it with the dirmq that wrote it, or a newer one"
        )


def mark_journaled(root: str, access: Access) -> None:
    """Mark the root format 6 before the first journal is written in it (durably: a process of
    format 5 must never open a root holding a journal it would not replay)."""
    data = read_marker(root)
    if isinstance(data, dict) and data.get("format") == ROOT_FORMAT:
        return
    marker = os.path.join(root, layout.ROOT_MARKER)
    smallfiles.replace_file(marker, root_marker_bytes(access), durable=True, access=access)


def mark_current(root: str) -> None:
    """Mark a root of an earlier format with the current one (what it holds is unchanged: each
    format only adds what a newer process writes). Left as it is where this user may not write
    it.

    The one marker edited in place: its format digit overwritten (one byte, which no reader
    sees torn) in the file this call read, never a new file renamed over the name. Another
    process may mark the root 6 (its first journal: `mark_journaled`) between this read and
    this write; a rename would then put 5 over that 6 (an older process would take the root
    for its own and never replay the journal), where this write goes into the file the 6
    replaced, no longer the marker."""
    path = os.path.join(root, layout.ROOT_MARKER)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return
    try:
        data = os.read(fd, MARKER_MAX)
        at = _format_digit(data)
        if at is not None:
            os.pwrite(fd, str(BASE_FORMAT).encode(), at)
            os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _format_digit(data: bytes) -> int | None:
    """Where in marker `data` its format digit is, if it is an earlier one (1 to 4) and
    overwriting it with 5 changes nothing else; None otherwise."""
    try:
        parsed = json.loads(data)
    except ValueError:
        return None
    if not isinstance(parsed, dict) or parsed.get("format") not in READABLE_ROOT_FORMATS[:4]:
        return None
    for match in _FORMAT_VALUE.finditer(data):
        at = match.start(1)
        edited = data[:at] + str(BASE_FORMAT).encode() + data[at + 1 :]
        try:
            if json.loads(edited) == {**parsed, "format": BASE_FORMAT}:
                return at
        except ValueError:
            continue
    return None
