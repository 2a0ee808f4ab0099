"""`dirmq fsck` of the root's own files: the marker (@dirmq.json) and its format, the modes of
every entry (the root's access), @trash, @holders, and small-file temps (smallfiles.py).

The marker is read first (`check_format`: a root of a format whose rules may differ from ours is
checked, never repaired; the access it gives is what new entries get), and written, if missing
or broken, last (`check_root`: only once the walk has seen whether the directory holds queues).
"""

from __future__ import annotations

import json
import os
import shutil
from functools import partial

from dirmq.errors import ConfigError
from dirmq.store import layout, smallfiles
from dirmq.store.filemodes import GROUP, Access, conform, inferred_access, mismatches
from dirmq.store.fsck_findings import Kind, Run, scandir, set_aside, unlinker
from dirmq.store.holders import is_record_name, orphan_record
from dirmq.store.journal_judge import marked_unflushed
from dirmq.store.marker import READABLE_ROOT_FORMATS, write_marker
from dirmq.store.recovery import older_than

_MISSING = object()


def check_format(run: Run) -> None:
    """Before anything else: a root of a newer format is checked, never repaired; the root's
    access (what modes new entries get), from the marker or, where it has none that can be
    read, from the root directory's own mode."""
    data = _read_marker(run.root)
    marker = os.path.join(run.root, layout.ROOT_MARKER)
    try:
        run.access = (
            Access.from_marker(data) if isinstance(data, dict) else inferred_access(run.root)
        )
    except ConfigError as exc:
        run.access = inferred_access(run.root)
        run.fix("", marker, Kind.ROOT_MARKER, str(exc), partial(_write_marker, run))
    found = data.get("format") if isinstance(data, dict) else None
    if isinstance(found, int) and found not in READABLE_ROOT_FORMATS:
        # Its rules may differ from ours: "repairing" it could destroy what it means.
        run.repair = False
        detail = f"unsupported root format {found}: checked, nothing repaired"
        run.add("", marker, Kind.ROOT_MARKER, detail)


def check_root(run: Run) -> None:
    """After the walk: the root marker is missing or broken (format mismatch is done)."""
    marker = os.path.join(run.root, layout.ROOT_MARKER)
    data = _read_marker(run.root)
    if data is _MISSING:
        detail = f"{layout.ROOT_MARKER} is missing"
        if run.counts.queues == 0 and _has_entries(run.root):
            # Refuse to stamp an arbitrary, non-empty directory as a dirmq root.
            run.add("", marker, Kind.ROOT_MARKER, f"{detail}, and no queue either: not a root?")
            return
        run.fix("", marker, Kind.ROOT_MARKER, detail, partial(_write_marker, run))
    elif not isinstance(data, dict) or not isinstance(data.get("format"), int):
        run.fix(
            "",
            marker,
            Kind.ROOT_MARKER,
            f"{layout.ROOT_MARKER} is not a JSON object with a format number",
            lambda: set_aside(marker) + "; " + _write_marker(run),
        )


def _write_marker(run: Run) -> str:
    write_marker(run.root, run.access)
    return f"wrote a fresh {layout.ROOT_MARKER} ({run.access.name} access)"


def check_access(run: Run) -> None:
    """Every entry has the modes (and group) the root's access gives new ones: one more walk of
    the whole root, upper layers' directories included (+30% to a check of 30,000 small
    messages). Not in a directory without a marker: it may be no root at all."""
    if not isinstance(_read_marker(run.root), dict):
        return
    access = run.access
    gid = os.stat(run.root).st_gid if access.name == GROUP else None
    journals = os.path.join(run.root, layout.JOURNAL_DIR) + "/"
    for path, st, problem in mismatches(run.root, access, gid):
        run.tick()
        if path.startswith(journals) and marked_unflushed(path):
            continue  # its mode keeps it until a reboot replays it
        run.fix("", path, Kind.ACCESS, problem, partial(_conform, path, st, access, gid))


def _conform(path: str, st: os.stat_result, access: Access, gid: int | None) -> str:
    try:
        conform(path, st, access, gid)
    except FileNotFoundError:
        return "gone meanwhile"
    return f"set as the root's {access.name} access says"


def check_trash(run: Run, path: str) -> None:
    """@trash holds nothing but the leftovers of an interrupted queue deletion."""
    try:
        leftovers = sorted(os.listdir(path))
    except NotADirectoryError:
        run.add("", path, Kind.STRAY, "expected a directory")
        return
    if not leftovers:
        return

    def empty() -> str:
        for entry in leftovers:
            target = os.path.join(path, entry)
            if os.path.isdir(target) and not os.path.islink(target):
                shutil.rmtree(target)
            else:
                os.unlink(target)
        return "emptied"

    detail = f"{len(leftovers)} leftover(s) of an interrupted queue deletion"
    run.fix("", path, Kind.TRASH, detail, empty)


def check_small_temp(run: Run, name: str, path: str) -> None:
    """A temp file of a small-file write (smallfiles.py) of queue `name` ("" for the root's): a
    crash leftover once it is old (a young one may be a write in progress)."""
    if not older_than(path, smallfiles.STALE_TEMP_S):
        return
    target = smallfiles.temp_target(os.path.basename(path))
    detail = f"temp file of an unfinished write of {target}"
    run.fix(name, path, Kind.ORPHAN_TMP, detail, unlinker(path))


def check_holders(run: Run) -> None:
    """@holders (holders.py), after the walk (once every lease's holder is known): another
    host's record that no lease names an hour after it was written is a notice
    (`orphan-holder`), removed by a repair (one of a process gone from this host is no damage:
    a sweep removes it); a leftover temp as any small file's; anything else is stray."""
    directory = os.path.join(run.root, layout.HOLDERS_DIR)
    for entry in scandir(directory):
        if smallfiles.temp_target(entry.name) is not None:
            check_small_temp(run, "", entry.path)
        elif not is_record_name(entry.name):
            run.add("", entry.path, Kind.STRAY, "not a holder record")
        elif (detail := orphan_record(entry.path, run.holders_in_use)) is not None:
            run.fix("", entry.path, Kind.ORPHAN_HOLDER, detail, unlinker(entry.path))


def _read_marker(root: str) -> object:
    """The parsed root marker; `_MISSING` if absent, None if it is not JSON."""
    try:
        with open(os.path.join(root, layout.ROOT_MARKER), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return _MISSING
    try:
        data: object = json.loads(raw)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return None
    return data


def _has_entries(path: str) -> bool:
    return any(not e.name.startswith(layout.ROOT_MARKER) for e in scandir(path))
