"""`dirmq fsck` of the message files of one state directory (or backlog bucket) of a queue: each
name fits its directory, each file decodes as the message its name says.

A file is read, decoded and dropped before the next is read. What is seen is noted in the
queue's `QueueScan` (where each id was, which ids were seen twice, which are corrupt) for the
checks that need the whole queue's listing (fsck_copies.py). A name that does not fit its
directory is renamed to the one it should have; a file whose name the store cannot use is
re-homed under a valid name if it decodes and names its message, else quarantined in @corrupt
(fsck.py's docstring: the file, not the name, decides whether anything is lost).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from functools import partial

from dirmq.errors import CorruptMessage
from dirmq.store import codec, delays, layout
from dirmq.store.bounds import AT_MS_DIGITS, MAX_DURATION_S, MAX_RECEIVE_COUNT
from dirmq.store.filemodes import Access
from dirmq.store.fsck_findings import Kind, Run, scandir
from dirmq.store.fsck_queue import TIMED, QueueScan, check_temp
from dirmq.store.ids import ID_PATTERN, is_id
from dirmq.store.layout import Entry, parse_entry

# No lease or delay the store makes is further ahead than its longest duration; a day more
# leaves room for another host's clock running ahead of ours.
_LONGEST_MS = int(MAX_DURATION_S * 1000) + 86_400_000
_LONGEST_DAYS = _LONGEST_MS // 86_400_000


def check_messages(run: Run, scan: QueueScan, state: str) -> None:
    """The files of `state` (a state directory, or a backlog bucket checked as @ready's)."""
    now_ms = time.time_ns() // 1_000_000
    directory = scan.dir(state)
    # A delay bucket's names are those of @delayed (`shape`); its directory is the bucket.
    shape = layout.DELAYED if delays.is_bucket_dir(state) else state
    renamed: set[str] = set()  # our own renames may show up again later in this listing
    for entry in scandir(directory):
        name = entry.name
        if name in renamed or name.startswith(".nfs") or entry.path in scan.rehomed:
            continue
        if state == layout.DELAYED and entry.is_dir(follow_symlinks=False):
            continue  # a bucket, checked as a directory of its own; else fsck_delays's stray
        run.tick()
        if not entry.is_file(follow_symlinks=False):
            run.add(scan.name, entry.path, Kind.STRAY, "not a regular file")
            continue
        parsed = parse_entry(name)
        if parsed is None and (beside := layout.parse_temp_beside(name)) is not None:
            final = parse_entry(beside[0])
            check_temp(run, scan, entry.path, name, final.message_id if final else None)
            continue
        if parsed is None:
            _check_unparsed(run, scan, state, entry.path, name, now_ms)
            continue
        run.counts.messages += 1
        if not _decodes(run, scan, entry.path, name, parsed.message_id):
            continue
        if shape in TIMED and parsed.at_ms is not None and parsed.at_ms > now_ms + _LONGEST_MS:
            # Further ahead than any duration the store accepts: a lease or delay made before
            # the store had bounds. It would hold the message for centuries.
            detail = f"{state} time of {name!r} is more than {_LONGEST_DAYS} days ahead"
            home = _home(shape, parsed.message_id, parsed.count, None, parsed.group)
            _rehome(run, scan, state, entry.path, parsed.message_id, detail, home)
            continue
        canonical = canonical_name(shape, parsed, now_ms)
        if canonical != name:
            detail = f"name {name!r} does not fit {state} (should be like {canonical!r})"
            # A delay's canonical name goes into the bucket of its due minute (delays.py).
            target_dir = (
                os.path.join(scan.path, delays.relative_dir(canonical))
                if shape == layout.DELAYED
                else directory
            )
            run.fix(
                scan.name,
                entry.path,
                Kind.BAD_NAME,
                detail,
                partial(_rename_in, directory, name, canonical, target_dir, run.access),
            )
            if run.repair and not os.path.lexists(entry.path) and target_dir == directory:
                renamed.add(canonical)
                parsed = parse_entry(canonical) or parsed
        if state == layout.LEASED and parsed.holder is not None:
            run.holders_in_use.add(parsed.holder)
        if state == layout.LEASED and parsed.at_ms is not None and parsed.at_ms <= now_ms:
            run.counts.expired += 1
        elif shape == layout.DELAYED and parsed.at_ms is not None and parsed.at_ms <= now_ms:
            run.counts.due += 1
        if parsed.message_id in scan.seen:
            scan.duplicates.add(parsed.message_id)
        else:
            scan.seen[parsed.message_id] = state


def _check_unparsed(
    run: Run, scan: QueueScan, state: str, path: str, name: str, now_ms: int
) -> None:
    """A name that does not parse: re-home the message if the file is one, else quarantine it
    (the file, not the name, decides whether anything is lost)."""
    run.counts.messages += 1
    salvaged = _salvage(name)
    try:
        decoded = read_decoded(path, salvaged.message_id or None)
    except FileNotFoundError:
        return  # moved by a live process since the listing
    except CorruptMessage as exc:
        detail = f"not a message file name for {state}, nor a message file: {exc}"
        run.fix(scan.name, path, Kind.BAD_NAME, detail, partial(_quarantine, scan, path, name))
        return
    except OSError as exc:
        run.add(scan.name, path, Kind.UNREADABLE, exc.strerror or str(exc))
        return
    message_id = decoded.system.get(codec.ID) or salvaged.message_id
    if not is_id(message_id):
        detail = f"not a message file name for {state}, and the file names no message id"
        run.fix(scan.name, path, Kind.BAD_NAME, detail, partial(_quarantine, scan, path, name))
        return
    group = decoded.system.get("Group")
    tag = None if group is None else layout.group_tag(group)
    at_ms = salvaged.at_ms
    if at_ms is not None and at_ms > now_ms + _LONGEST_MS:
        at_ms = None  # a time the store would never have made: not believed
    shape = layout.DELAYED if delays.is_bucket_dir(state) else state
    home = _home(shape, message_id, salvaged.count, at_ms, tag)
    detail = f"name {name!r} does not parse; the file is intact message {message_id}"
    _rehome(run, scan, state, path, message_id, detail, home)


def _rehome(
    run: Run,
    scan: QueueScan,
    state: str,
    path: str,
    message_id: str,
    detail: str,
    home: tuple[str, str],
) -> None:
    """Report (and with repair, rename) an intact message into `home` (state, name)."""
    target_state, new = home
    if target_state == layout.DELAYED:  # into the bucket of its due minute (delays.py)
        target_state = delays.relative_dir(new)
    target = os.path.join(scan.dir(target_state), new)

    def move() -> str:
        if target_state != state and delays.is_bucket_dir(target_state):
            try:
                run.access.mkdir(scan.dir(target_state))
            except FileExistsError:
                pass
        if os.path.lexists(target):
            # Never replace: that file is another copy, left for the duplicate check.
            raise FileExistsError(0, f"{target_state}/{new} already exists")
        os.rename(path, target)
        scan.rehomed.add(target)  # a listing still to come may show it: counted here
        return f"re-homed to {target_state}/{new}"

    run.fix(scan.name, path, Kind.MISNAMED, detail, move)
    if message_id in scan.seen:
        scan.duplicates.add(message_id)
    else:
        scan.seen[message_id] = target_state if not os.path.lexists(path) else state


def _decodes(run: Run, scan: QueueScan, path: str, name: str, message_id: str) -> bool:
    """True if the file decodes as message `message_id`; reports (and with repair quarantines)
    it otherwise."""
    try:
        read_decoded(path, message_id)
    except FileNotFoundError:
        return False  # moved by a live process since the listing: not ours to judge now
    except CorruptMessage as exc:
        run.fix(scan.name, path, Kind.CORRUPT, str(exc), partial(_quarantine, scan, path, name))
        if os.path.lexists(path):
            scan.corrupt_ids.add(message_id)  # still holds its capacity slot
        return False
    except OSError as exc:
        run.add(scan.name, path, Kind.UNREADABLE, exc.strerror or str(exc))
        return False
    return True


def _quarantine(scan: QueueScan, path: str, name: str) -> str:
    target = os.path.join(scan.dir(layout.CORRUPT), name)
    n = 1
    while os.path.lexists(target):
        n += 1
        target = os.path.join(scan.dir(layout.CORRUPT), f"{name}.{n}")
    os.rename(path, target)
    parsed = parse_entry(name)
    if parsed is not None:
        scan.quarantined.add(parsed.message_id)
    return f"moved to {layout.CORRUPT}/{os.path.basename(target)}"


def read_decoded(path: str, message_id: str | None) -> codec.Decoded:
    with open(path, "rb") as f:
        return codec.decode(f.read(), message_id)


def canonical_name(state: str, entry: Entry, now_ms: int) -> str:
    """The name `entry` should have in `state` (a missing lease/due time becomes "now"); only
    a lease names a holder."""
    if state in TIMED:
        at_ms = now_ms if entry.at_ms is None else entry.at_ms
        holder = entry.holder if state == layout.LEASED else None
        return layout.timed_name(
            entry.message_id, entry.count, at_ms, entry.group, holder, entry.level
        )
    if state == layout.DEAD:
        return layout.dead_name(entry.message_id, entry.count, entry.group, entry.level)
    return layout.ready_name(entry.message_id, entry.count, entry.group, entry.level)


@dataclass(frozen=True, slots=True)
class _Salvaged:
    """What can be read from the start of a name that does not parse, whatever junk follows:
    an id ("" if none), a receive count (0 if none), a time (None if none, or too long)."""

    message_id: str
    count: int
    at_ms: int | None


_SALVAGE_RE = re.compile(rf"({ID_PATTERN})?(?:\.([0-9]+))?(?:\.([0-9]+))?")


def _salvage(name: str) -> _Salvaged:
    match = _SALVAGE_RE.match(name)
    assert match is not None  # every group is optional
    # A count the store never makes is capped so that one more receive still fits a name.
    count = min(int(match[2]), MAX_RECEIVE_COUNT - 1) if match[2] else 0
    at_ms = int(match[3]) if match[3] and len(match[3]) <= AT_MS_DIGITS else None
    return _Salvaged(match[1] or "", count, at_ms)


def _home(
    state: str, message_id: str, count: int, at_ms: int | None, tag: str | None
) -> tuple[str, str]:
    """Where a misnamed message goes: (state, name). Its state is kept, unless it is a lease or
    delay whose time cannot stand (`at_ms` None): then it is ready (due now)."""
    if state in TIMED:
        if at_ms is None:
            return layout.READY, layout.ready_name(message_id, count, tag)
        return state, layout.timed_name(message_id, count, at_ms, tag)
    if state == layout.DEAD:
        return state, layout.dead_name(message_id, count, tag)
    return layout.READY, layout.ready_name(message_id, count, tag)


def _rename_in(
    directory: str, name: str, new: str, target_dir: str, access: Access | None = None
) -> str:
    """Rename `name` of `directory` to `new` in `target_dir` (a delay's bucket, made if
    missing; else the same directory)."""
    if target_dir != directory and access is not None:
        try:
            access.mkdir(target_dir)
        except FileExistsError:
            pass
    target = os.path.join(target_dir, new)
    if os.path.lexists(target):
        # Never replace: the other file is a second copy, left for the duplicate check.
        raise FileExistsError(0, f"{new} already exists")
    os.rename(os.path.join(directory, name), target)
    if target_dir != directory:
        return f"renamed to {os.path.basename(target_dir)}/{new}"
    return f"renamed to {new}"
