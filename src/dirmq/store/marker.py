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
format-6 root, a journal a format-5 process would not replay after a machine crash).
"""

from __future__ import annotations

import json
import os

from dirmq.errors import ConfigError
from dirmq.store import layout, smallfiles
from dirmq.store.filemodes import Access, read_marker

ROOT_FORMAT = 6  # the newest this version reads and writes
BASE_FORMAT = 5  # what a root is marked until a journal is written in it
READABLE_ROOT_FORMATS = (1, 2, 3, 4, 5, 6)


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


def mark_current(root: str, access: Access) -> None:
    """Mark a root of an earlier format with the current one (what it holds is unchanged: each
    format only adds what a newer process writes). Left as it is where this user may not write
    it."""
    data = read_marker(root)
    if not isinstance(data, dict) or data.get("format") not in READABLE_ROOT_FORMATS[:4]:
        return
    try:
        marker = os.path.join(root, layout.ROOT_MARKER)
        smallfiles.replace_file(
            marker, root_marker_bytes(access, BASE_FORMAT), durable=True, access=access
        )
    except OSError:
        pass
