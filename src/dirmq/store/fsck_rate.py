"""`dirmq fsck` of a queue's delivery slots (`@rate/<second>.<n>`, flow.py).

A slot of a second more than `STALE_S` ago is a notice: gets remove the old ones as they take
slot 0 of a second, so they remain only where the limit was lifted or nothing was received
since; a repair removes them. Anything else in @rate is stray (left alone). One of fsck.py's
`QUEUE_CHECKS`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from dirmq.store import layout
from dirmq.store.filemodes import Access
from dirmq.store.flow import parse_slot
from dirmq.store.fsck_findings import Finding, Kind, unlinker

STALE_S = 60  # older seconds' slots count for nothing: a notice, removed by a repair


def findings(queue_dir: str, access: Access, now_s: float | None = None) -> Iterator[Finding]:
    del access  # a slot's mode is checked with every entry's (fsck_root.check_access)
    directory = os.path.join(queue_dir, layout.RATE)
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    oldest = int(time.time() if now_s is None else now_s) - STALE_S
    for entry in entries:
        parsed = parse_slot(entry.name)
        if parsed is None or not entry.is_file(follow_symlinks=False):
            yield Finding(Kind.STRAY, entry.path, "not a delivery slot", None)
        elif parsed[0] < oldest:
            detail = "delivery slot of a past second"
            yield Finding(Kind.STALE_RATE_SLOT, entry.path, detail, unlinker(entry.path))
