"""The root marker `@dirmq.json`: which format a root is in, and what it holds.

Format 2 adds lease holders (`+<token>` at the end of a lease name, records in `@holders`:
docs/FORMAT.md, "Lease holders"); format 3 the backlog (`@backlog/` in a queue: "The
backlog"); format 4 message priorities (`^<level>` in state names, `@backlog/p<level>/`:
"Priorities"); format 5 delayed messages in buckets of their due minute (`@delayed/<minute>/`:
"Delayed messages"). A root of format 1 to 4 is read alike (flat entries of @delayed are moved
into their buckets as a process meets them), and marked 5 when a Store opens it: the `dirmq
fsck` of an earlier version repairs nothing in a root of a format it does not know, where it
would otherwise re-home what it cannot parse.
"""

from __future__ import annotations

import json
import os

from dirmq.store import layout, smallfiles
from dirmq.store.filemodes import Access, read_marker

ROOT_FORMAT = 5
READABLE_ROOT_FORMATS = (1, 2, 3, 4, 5)


def root_marker_bytes(access: Access) -> bytes:
    """What `@dirmq.json` holds: the format, and the root's access (absent for a legacy root)."""
    return json.dumps({"format": ROOT_FORMAT, **access.marker_fields()}).encode() + b"\n"


def mark_current(root: str, access: Access) -> None:
    """Mark a root of an earlier format with the current one (what it holds is unchanged: each
    format only adds what a newer process writes). Left as it is where this user may not write
    it."""
    data = read_marker(root)
    if not isinstance(data, dict) or data.get("format") not in READABLE_ROOT_FORMATS[:-1]:
        return
    try:
        marker = os.path.join(root, layout.ROOT_MARKER)
        smallfiles.replace_file(marker, root_marker_bytes(access), durable=True, access=access)
    except OSError:
        pass
