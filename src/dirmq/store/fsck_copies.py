"""`dirmq fsck` of what needs a whole queue's listing: one message id in several files, and
capacity slots (@slots) pointing at no message.

Both are confirmed by a second look before anything is reported or removed: fsck takes no lock,
and a message a live process renames between two directory listings is seen in both (one file,
not two copies) or in neither (its slot is not leaked).

Which copy of a duplicated id is kept, and why: fsck.py's docstring (`_keep_order` here).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from functools import partial

from dirmq.errors import CorruptMessage
from dirmq.store import backlog, delays, layout
from dirmq.store.capacity import LEAK_GRACE_S
from dirmq.store.fsck_findings import Kind, Run, scandir
from dirmq.store.fsck_messages import canonical_name, read_decoded
from dirmq.store.fsck_queue import LIVE, MESSAGE_DIRS, QueueScan
from dirmq.store.layout import Entry, parse_entry


@dataclass(frozen=True, slots=True)
class _Copy:
    state: str
    name: str
    parsed: Entry
    inode: int
    links: int


def resolve_duplicates(run: Run, scan: QueueScan) -> None:
    """Look again at the ids seen twice: a file renamed between two directory listings was seen
    in both, and is one file (one inode), not two copies."""
    copies: dict[str, list[_Copy]] = {i: [] for i in scan.duplicates}
    for state in scan.message_dirs():
        for entry in scandir(scan.dir(state)):
            parsed = parse_entry(entry.name)
            if parsed is None or parsed.message_id not in copies:
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                read_decoded(entry.path, parsed.message_id)  # only good copies compete
                links = entry.stat(follow_symlinks=False).st_nlink
            except (OSError, CorruptMessage):
                continue
            copies[parsed.message_id].append(_Copy(state, entry.name, parsed, entry.inode(), links))
    for message_id, found in copies.items():
        inodes = {c.inode for c in found}
        if len(found) < 2 or (len(inodes) == 1 and found[0].links < 2):
            continue  # it moved while we listed; one file, no duplicate
        found.sort(key=_keep_order)
        keep, extra = found[0], found[1:]
        where = ", ".join(f"{c.state}/{c.name}" for c in found)
        detail = f"id {message_id} is in {len(found)} files ({where})"
        run.fix(
            scan.name,
            os.path.join(scan.dir(keep.state), keep.name),
            Kind.DUPLICATE,
            detail,
            partial(_drop_copies, scan, keep, extra),
        )


def _keep_order(copy: _Copy) -> tuple[int, bool, int, int]:
    state = layout.READY if backlog.is_bucket_dir(copy.state) else copy.state
    state = layout.DELAYED if delays.is_bucket_dir(state) else state
    fits = copy.name == canonical_name(state, copy.parsed, copy.parsed.at_ms or 0)
    return (
        MESSAGE_DIRS.index(state),
        not fits,
        -copy.parsed.count,
        -(copy.parsed.at_ms or 0),
    )


def _drop_copies(scan: QueueScan, keep: _Copy, extra: list[_Copy]) -> str:
    if not os.path.exists(os.path.join(scan.dir(keep.state), keep.name)):
        # The kept copy moved since we looked: decide nothing on stale information.
        raise FileNotFoundError(0, "the kept copy moved meanwhile; run fsck again")
    for copy in extra:
        try:
            os.unlink(os.path.join(scan.dir(copy.state), copy.name))
        except FileNotFoundError:
            pass
    scan.seen[keep.parsed.message_id] = keep.state
    return f"kept {keep.state}/{keep.name}, removed {len(extra)} other cop(ies)"


def check_slots(run: Run, scan: QueueScan) -> None:
    """No capacity slot (a symlink naming its message's id) points at an absent message; one
    younger than `LEAK_GRACE_S` may be a put's between taking it and writing its file."""
    if layout.SLOTS in scan.missing:
        return
    suspects: dict[str, str] = {}  # slot path -> target id
    for entry in scandir(scan.dir(layout.SLOTS)):
        run.tick()
        if not entry.is_symlink():
            run.add(scan.name, entry.path, Kind.STRAY, "not a capacity slot symlink")
            continue
        try:
            target = os.readlink(entry.path)
            age_s = time.time() - entry.stat(follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue  # released meanwhile
        held = target in scan.tmp_ids or target in scan.corrupt_ids
        if held or scan.seen.get(target) in LIVE:
            continue
        # A young slot may belong to a put between taking it and writing its file; the slot
        # of a message we just quarantined is known dead whatever its age.
        if age_s > LEAK_GRACE_S or target in scan.quarantined:
            suspects[entry.path] = target
    if not suspects:
        return
    # A message renamed backwards in our listing order (a nack: @leased -> @ready) can be
    # missed by both listings; one more look at the live directories settles it.
    present = _live_ids(scan, set(suspects.values()))
    for path, target in sorted(suspects.items()):
        if target not in present:
            run.fix(
                scan.name,
                path,
                Kind.LEAKED_SLOT,
                f"points at absent message {target}",
                partial(_release_slot, path, target),
            )


def _live_ids(scan: QueueScan, wanted: set[str]) -> set[str]:
    present: set[str] = set()
    live = [layout.READY, layout.LEASED, layout.DELAYED, *scan.buckets, *scan.delay_buckets]
    for state in live:
        if state in scan.missing:
            continue
        for entry in scandir(scan.dir(state)):
            beside = layout.parse_temp_beside(entry.name)
            parsed = parse_entry(beside[0] if beside else entry.name)
            if parsed is not None and parsed.message_id in wanted:
                present.add(parsed.message_id)
    for entry in scandir(scan.dir(layout.TMP)):
        parsed_tmp = layout.parse_tmp(entry.name)
        if parsed_tmp is not None and parsed_tmp[0] in wanted:
            present.add(parsed_tmp[0])
    return present


def _release_slot(path: str, target: str) -> str:
    # Re-read the link: if someone re-took this slot meanwhile it points elsewhere, keep it.
    if os.readlink(path) != target:
        return "re-taken meanwhile, kept"
    os.unlink(path)
    return "released"
