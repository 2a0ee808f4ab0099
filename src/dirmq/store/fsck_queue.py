"""`dirmq fsck` of a queue's frame: its configuration, its state directories, the temp files of
writers (@tmp, and beside their final names) and the recycled files of @free; and the
bookkeeping of one queue's check (`QueueScan`) that the checks of its messages share
(fsck_messages.py, fsck_copies.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import partial

from dirmq.store import layout, smallfiles
from dirmq.store.config import QueueConfig
from dirmq.store.fsck_findings import Kind, Run, scandir, set_aside, unlinker
from dirmq.store.poolreclaim import Owner, pool_owner, reclaim_pool
from dirmq.store.processes import Liveness, liveness
from dirmq.store.recovery import ORPHAN_GRACE_S, is_orphan
from dirmq.store.recycled import DEFAULT_POOL_FILES, is_blank

# Message states in the order a duplicate is kept (first = kept first), and their name shapes.
MESSAGE_DIRS = (layout.LEASED, layout.READY, layout.DELAYED, layout.DEAD)
TIMED = frozenset({layout.LEASED, layout.DELAYED})
LIVE = frozenset({layout.READY, layout.LEASED, layout.DELAYED})  # hold a capacity slot


@dataclass(slots=True)
class QueueScan:
    """Per-queue bookkeeping: where each id was seen, which ids occur twice, live temp ids."""

    path: str
    name: str
    seen: dict[str, str] = field(default_factory=dict)  # id -> state dir (first copy)
    duplicates: set[str] = field(default_factory=set)
    tmp_ids: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)  # state dirs absent after the dir check
    corrupt_ids: set[str] = field(default_factory=set)  # corrupt, still in place (report only)
    quarantined: set[str] = field(default_factory=set)  # corrupt, moved to @corrupt by repair
    rehomed: set[str] = field(default_factory=set)  # paths of files re-homed by repair

    buckets: list[str] = field(default_factory=list)  # the backlog's (queue-relative)
    delay_buckets: list[str] = field(default_factory=list)  # @delayed's (queue-relative)

    def dir(self, state: str) -> str:
        return os.path.join(self.path, state)

    def message_dirs(self) -> list[str]:
        """The state directories that hold messages, then the backlog's and @delayed's
        buckets."""
        listed = [d for d in MESSAGE_DIRS if d not in self.missing]
        return [*listed, *self.buckets, *self.delay_buckets]


def check_config(run: Run, scan: QueueScan) -> None:
    """@queue.json parses and validates (a repair sets the bad one aside and keeps what it can);
    the dead-letter queue it names exists (a notice)."""
    config_path = os.path.join(scan.path, layout.CONFIG_FILE)
    try:
        with open(config_path, "rb") as f:
            config = QueueConfig.loads(f.read())
    except FileNotFoundError:
        return  # deleted while we looked: the queue is going away
    except ValueError as exc:  # ConfigError, and what the loader lets through (bad UTF-8)

        def replace() -> str:
            salvaged, reset = _salvage_config(config_path)
            aside = set_aside(config_path)
            smallfiles.replace_file(config_path, salvaged.dumps(), durable=True, access=run.access)
            if reset is None:
                return f"{aside} and wrote the default configuration: review it"
            return f"{aside}; kept the other settings, reset {', '.join(reset)} to default"

        run.fix(scan.name, config_path, Kind.BAD_CONFIG, str(exc), replace)
        return
    dlq = config.dead_letter_queue
    if dlq and not os.path.exists(os.path.join(run.root, *dlq.split("/"), layout.CONFIG_FILE)):
        detail = f"dead-letter queue {dlq!r} does not exist: dead messages stay in @dead"
        run.add(scan.name, config_path, Kind.MISSING_DLQ, detail)


def _salvage_config(path: str) -> tuple[QueueConfig, list[str] | None]:
    """The stored configuration without the settings that fail alone (e.g. a duration stored
    before the store had bounds), and their names; (defaults, None) if it is not a JSON object
    or still fails (settings that fail only together). SQS attributes and the dead-letter
    settings survive a single bad value."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return QueueConfig(), None
    if not isinstance(data, dict):
        return QueueConfig(), None
    reset = []
    for key, value in data.items():
        try:
            QueueConfig.from_json({key: value})
        except ValueError:  # ConfigError, InvalidName (a dead-letter queue's name)
            reset.append(key)
    try:
        return QueueConfig.from_json({k: v for k, v in data.items() if k not in reset}), reset
    except ValueError:
        return QueueConfig(), None


def check_dirs(run: Run, scan: QueueScan) -> None:
    """Every state directory exists (a repair makes it); those that do not stay in
    `scan.missing`, where no later check looks."""
    for state in layout.STATE_DIRS:
        directory = scan.dir(state)
        if os.path.isdir(directory) or (state == layout.BACKLOG and not os.path.lexists(directory)):
            continue  # a queue made before the backlog gets it when next opened
        if os.path.lexists(directory):
            # Something else has the name: moving it aside would be guessing what it is.
            run.add(scan.name, directory, Kind.MISSING_DIR, "exists but is not a directory")
            scan.missing.add(state)
            continue

        def make(directory: str = directory) -> str:
            run.access.mkdir(directory)
            return "created"

        run.fix(scan.name, directory, Kind.MISSING_DIR, "state directory missing", make)
        if not os.path.isdir(directory):
            scan.missing.add(state)


def check_tmp(run: Run, scan: QueueScan) -> None:
    if layout.TMP in scan.missing:
        return
    for entry in scandir(scan.dir(layout.TMP)):
        run.tick()
        parsed = layout.parse_tmp(entry.name)
        check_temp(run, scan, entry.path, entry.name, parsed[0] if parsed else None)


def check_temp(run: Run, scan: QueueScan, path: str, name: str, message_id: str | None) -> None:
    """A file being written: removed if no live writer will publish it, else counted (its
    message's capacity token and dedup record are not leaks)."""
    if is_orphan(path, name):
        run.fix(scan.name, path, Kind.ORPHAN_TMP, _orphan_reason(name), unlinker(path))
        return
    run.counts.tmp_live += 1
    if message_id is not None:
        scan.tmp_ids.add(message_id)


def _orphan_reason(name: str) -> str:
    parsed = layout.parse_tmp(name) or layout.parse_temp_beside(name)
    if parsed is not None and liveness(parsed[1]) is Liveness.DEAD:
        return f"temp file of dead process {parsed[1].pid}"
    return f"temp file older than {ORPHAN_GRACE_S:.0f} s"


def check_free(run: Run, scan: QueueScan) -> None:
    """@free holds zeros, but three things in it matter: the pool of a dead process must not
    stay there forever, no recycled file may be another name's inode (overwriting it would
    change that file: a message, after a crash on a filesystem without a journal), and no file
    of the shared pool may still hold the message it was (it is blanked when retired; an
    earlier version did not). The pools of live processes are theirs."""
    free_dir = scan.dir(layout.FREE)
    entries = list(scandir(free_dir))
    room = DEFAULT_POOL_FILES - sum(1 for e in entries if not e.is_dir(follow_symlinks=False))
    for entry in entries:
        run.tick()
        if entry.is_dir(follow_symlinks=False):
            owner = pool_owner(entry.name, entry.path)
            if owner is Owner.UNKNOWN:
                run.add(scan.name, entry.path, Kind.STRAY, "unknown directory in @free")
            elif owner is not Owner.ALIVE:
                why = "dead process" if owner is Owner.DEAD else "another host, idle 1 h"
                unblanked = _unblanked_files(entry.path)
                if unblanked:  # killed before its reaper got to them: unlinked, not reused
                    why += f", {unblanked} file(s) not blanked (acknowledged messages)"
                run.fix(
                    scan.name,
                    entry.path,
                    Kind.ORPHAN_POOL,
                    f"recycled-file pool of a {why}",
                    partial(_reclaim_pool, entry.path, free_dir, owner, room),
                )
                room = 0  # what it returned fills the shared pool; no need to be exact
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            blank = not entry.is_file(follow_symlinks=False) or is_blank(entry.path, st.st_size)
        except FileNotFoundError:
            continue  # claimed by a put meanwhile
        except OSError as exc:
            run.add(scan.name, entry.path, Kind.UNREADABLE, exc.strerror or str(exc))
            continue
        links = st.st_nlink
        if links == 1 and not blank:
            # Unlinked, never blanked here: a put may claim it meanwhile and write it.
            run.fix(
                scan.name,
                entry.path,
                Kind.READABLE_FREE,
                "recycled file still holds a retired message (retired by an earlier version)",
                unlinker(entry.path),
            )
        if links > 1:
            run.fix(
                scan.name,
                entry.path,
                Kind.LINKED_FREE,
                f"recycled file has {links} names: it may be a message's",
                unlinker(entry.path),
            )


def _unblanked_files(pool_dir: str) -> int:
    """How many files of a dead process's pool hold anything but zeros: retired files its
    reaper had not blanked yet (or one a put was overwriting). Never reused (`reclaim_pool`)."""
    count = 0
    for entry in scandir(pool_dir):
        try:
            if entry.is_file(follow_symlinks=False):
                count += not is_blank(entry.path, entry.stat(follow_symlinks=False).st_size)
        except OSError:
            continue  # gone meanwhile, or unreadable: reclaim_pool unlinks what it cannot use
    return count


def _reclaim_pool(path: str, free_dir: str, owner: Owner, room: int) -> str:
    handled = reclaim_pool(path, free_dir, owner, max(room, 0))
    return f"reclaimed {handled} file(s)"
