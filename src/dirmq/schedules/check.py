"""`dirmq fsck` for schedules: check every invariant of `@schedules/` (FORMAT.md, "Schedules").

Checked, and what `repair=True` does:

    <name>.json parses as a schedule (a valid name, known keys)   move to @schedules/@corrupt/
    <name>/ (tick records) belongs to a <name>.json               remove it (a deletion that
                                                                  crashed half-way)
    in <name>/ only claims, .done records and floor, each a       a foreign file: move to
      JSON object                                                 @corrupt/; a damaged .done is
                                                                  rewritten (the tick stays done:
                                                                  never published twice); a
                                                                  damaged claim is a notice (its
                                                                  claimer is taken for dead)
    the queue a schedule publishes to exists                      a notice (its ticks are lost
                                                                  until the queue is made)

Temp files of small-file writes here are the store's fsck's (as in @redrive, @sqs).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field

from dirmq.errors import DirmqError
from dirmq.schedules.records import CLAIM_RE, DONE_RE, FLOOR, SPEC_SUFFIX, ScheduleFiles
from dirmq.store import smallfiles
from dirmq.store.fsckrecord import Found
from dirmq.store.layout import CONFIG_FILE
from dirmq.store.names import queue_path
from dirmq.store.recovery import older_than

CORRUPT_DIR = "@corrupt"


@dataclass(frozen=True, slots=True)
class Finding:
    path: str
    kind: str  # bad-schedule | orphan | foreign | bad-record | no-queue
    detail: str
    repaired: bool = False
    notice: bool = False


@dataclass(slots=True)
class SchedulesReport:
    findings: list[Finding] = field(default_factory=list)
    schedules_checked: int = 0
    records_checked: int = 0

    @property
    def ok(self) -> bool:
        return all(f.repaired or f.notice for f in self.findings)

    def found(self, root: str) -> list[Found]:
        """The findings as the record of a check counts them (store/fsckrecord.py): kinds
        prefixed `schedules-`, paths relative to `root`."""
        root = os.path.abspath(root)
        return [
            Found(f"schedules-{f.kind}", "", os.path.relpath(f.path, root), f.repaired, f.notice)
            for f in self.findings
        ]


def check_schedules(root: str, *, repair: bool = False) -> SchedulesReport | None:
    """Check `<root>/@schedules` (None if the root has none)."""
    files = ScheduleFiles(root)
    if not os.path.isdir(files.base):
        return None
    return _Checker(files, repair).run()


class _Checker:
    def __init__(self, files: ScheduleFiles, repair: bool) -> None:
        self.files = files
        self.repair = repair
        self.report = SchedulesReport()

    def run(self) -> SchedulesReport:
        base = self.files.base
        entries = sorted(os.listdir(base))
        specs = {e[: -len(SPEC_SUFFIX)] for e in entries if e.endswith(SPEC_SUFFIX)}
        for entry in entries:
            path = os.path.join(base, entry)
            if entry == CORRUPT_DIR:
                continue
            if smallfiles.temp_target(entry) is not None:
                continue  # the store's fsck judges small-file temps
            elif entry.endswith(SPEC_SUFFIX):
                self._spec(entry[: -len(SPEC_SUFFIX)], path)
            elif os.path.isdir(path) and not os.path.islink(path):
                if entry in specs:
                    self._ticks(path)
                elif older_than(path, 60.0):  # a young one may be a put in progress
                    self._orphan(path)
            else:
                self._foreign(path, "unknown file in @schedules")
        return self.report

    def _add(
        self, path: str, kind: str, detail: str, *, repaired: bool = False, notice: bool = False
    ) -> None:
        self.report.findings.append(Finding(path, kind, detail, repaired, notice))

    def _spec(self, name: str, path: str) -> None:
        self.report.schedules_checked += 1
        try:
            schedule = self.files.read(name)
        except DirmqError as exc:
            self._quarantine(path, "bad-schedule", str(exc))
            return
        marker = os.path.join(queue_path(self.files.root, schedule.queue), CONFIG_FILE)
        if not os.path.exists(marker):
            detail = f"publishes to queue {schedule.queue!r}, which does not exist"
            self._add(path, "no-queue", detail, notice=True)

    def _orphan(self, path: str) -> None:
        detail = "tick records of a schedule that does not exist (an interrupted delete)"
        if self.repair:
            shutil.rmtree(path, ignore_errors=True)
            self._add(path, "orphan", f"{detail}; removed", repaired=True)
        else:
            self._add(path, "orphan", detail)

    def _ticks(self, directory: str) -> None:
        for entry in sorted(os.listdir(directory)):
            path = os.path.join(directory, entry)
            if smallfiles.temp_target(entry) is not None:
                continue
            self.report.records_checked += 1
            if CLAIM_RE.fullmatch(entry):
                if not _is_object(path):
                    detail = "damaged claim: its claimer counts as dead"
                    self._add(path, "bad-record", detail, notice=True)
            elif DONE_RE.fullmatch(entry) or entry == FLOOR:
                if not _is_object(path):
                    self._rewrite(path, entry == FLOOR)
            else:
                self._foreign(path, "unknown file among tick records")

    def _rewrite(self, path: str, floor: bool) -> None:
        detail = "damaged record"
        if not self.repair:
            self._add(path, "bad-record", detail)
            return
        if floor:  # a floor of 0 only lets stale claims be checked against .done records
            data: dict[str, object] = {"tick_ms": 0, "at_s": time.time()}
        else:  # the tick stays done: a publish is never repeated for a damaged record
            data = {"kind": "tick", "repaired_s": time.time()}
        smallfiles.replace_file(
            path, json.dumps(data).encode() + b"\n", durable=True, access=self.files.access
        )
        self._add(path, "bad-record", f"{detail}; rewritten", repaired=True)

    def _foreign(self, path: str, detail: str) -> None:
        self._quarantine(path, "foreign", detail)

    def _quarantine(self, path: str, kind: str, detail: str) -> None:
        if not self.repair:
            self._add(path, kind, detail)
            return
        target_dir = os.path.join(self.files.base, CORRUPT_DIR)
        self.files.access.makedirs(target_dir)
        target = os.path.join(target_dir, f"{os.path.basename(path)}.{uuid.uuid4().hex[:8]}")
        try:
            os.rename(path, target)
        except FileNotFoundError:
            return
        self._add(path, kind, f"{detail}; moved to {CORRUPT_DIR}/", repaired=True)


def _is_object(path: str) -> bool:
    try:
        data = smallfiles.read_file(path)
    except OSError:
        return False
    if data is None:
        return True  # gone meanwhile (cleaned up): nothing wrong
    try:
        return isinstance(json.loads(data), dict)
    except ValueError:
        return False
