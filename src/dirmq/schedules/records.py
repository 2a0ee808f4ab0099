"""The files of recurring schedules under `<root>/@schedules/` (docs/FORMAT.md, "Schedules").

    @schedules/<name>.json              the schedule (model.py), replaced whole (smallfiles.py)
    @schedules/<name>/                  its tick records, made with the schedule
        <tick ms, 15 digits>.c<gen>     a claim of that tick: {"by": process token, "at_s",
                                        "kind": "tick" | "once" | "skip", "missed": n}; made
                                        with an exclusive link, so one claimer per generation
        <tick ms, 15 digits>.done       the tick is published: {"message_id", "at_s", "by"}
                                        (or {"error"} when it never can be: its queue was
                                        deleted, or no longer takes its body or headers)
        floor                           the newest tick whose records were cleaned up; no
                                        tick at or below it is ever claimed again

A tick is finished once it has a `.done` record, or its first claim is a `skip`. Every record
is a small file made once and never rewritten (but `floor`, replaced); a crash leaves at worst a
temp file (smallfiles.py) that fsck reports after an hour.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from dirmq.errors import (
    CorruptConfig,
    InvalidName,
    ScheduleNotFound,
    storage_error,
)
from dirmq.schedules.model import Schedule, schedule_from_json, validate_schedule_name
from dirmq.store import smallfiles
from dirmq.store.filemodes import Access, root_access
from dirmq.store.layout import SCHEDULES_DIR

TICK_DIGITS = 15
CLAIM_RE = re.compile(rf"([0-9]{{{TICK_DIGITS}}})\.c([0-9]{{1,6}})")
DONE_RE = re.compile(rf"([0-9]{{{TICK_DIGITS}}})\.done")
FLOOR = "floor"
SPEC_SUFFIX = ".json"
KINDS = ("tick", "once", "skip")


@dataclass(slots=True)
class TickRecords:
    """What the directory holds of one tick: its claims by generation, its `.done` record."""

    claims: dict[int, str] = field(default_factory=dict)  # generation -> path
    done: str | None = None

    @property
    def top(self) -> int:
        return max(self.claims) if self.claims else -1


class ScheduleFiles:
    """The `@schedules/` directory of one root."""

    def __init__(self, root: str, access: Access | None = None) -> None:
        self.root = os.path.abspath(root)
        self.base = os.path.join(self.root, SCHEDULES_DIR)
        self.access = access if access is not None else root_access(self.root)

    def spec_path(self, name: str) -> str:
        return os.path.join(self.base, validate_schedule_name(name) + SPEC_SUFFIX)

    def ticks_dir(self, name: str) -> str:
        return os.path.join(self.base, validate_schedule_name(name))

    # -- schedules ------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The names of the schedules, sorted (a file that is no schedule's is left to fsck)."""
        try:
            entries = os.listdir(self.base)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, "listing the schedules") from exc
        names = []
        for entry in entries:
            if entry.endswith(SPEC_SUFFIX):
                try:
                    names.append(validate_schedule_name(entry[: -len(SPEC_SUFFIX)]))
                except InvalidName:
                    continue
        return sorted(names)

    def read(self, name: str) -> Schedule:
        """The schedule `name` (ScheduleNotFound; CorruptConfig for a damaged file)."""
        try:
            data = smallfiles.read_file(self.spec_path(name))
        except OSError as exc:
            raise storage_error(exc, f"reading schedule {name!r}") from exc
        if data is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        try:
            return schedule_from_json(name, json.loads(data), stored=True)
        except ValueError as exc:  # not JSON, or not a schedule (InvalidArgument, InvalidName)
            raise CorruptConfig(
                f"schedule file @schedules/{name}{SPEC_SUFFIX} is damaged ({exc}): put the "
                "schedule again, or run `dirmq fsck --repair`"
            ) from exc

    def write(self, schedule: Schedule) -> None:
        """Store `schedule` (replacing one of that name) and make its ticks directory."""
        try:
            self.access.makedirs(self.ticks_dir(schedule.name))
            smallfiles.replace_file(
                self.spec_path(schedule.name), schedule.encode(), durable=True, access=self.access
            )
        except OSError as exc:
            raise storage_error(exc, f"writing schedule {schedule.name!r}") from exc

    def remove(self, name: str) -> None:
        """Delete the schedule and its tick records (ScheduleNotFound if there is none)."""
        try:
            os.unlink(self.spec_path(name))
        except FileNotFoundError:
            raise ScheduleNotFound(f"no schedule named {name!r}") from None
        except OSError as exc:
            raise storage_error(exc, f"deleting schedule {name!r}") from exc
        shutil.rmtree(self.ticks_dir(name), ignore_errors=True)

    # -- tick records ---------------------------------------------------------------------------
    def ticks(self, name: str) -> dict[int, TickRecords]:
        """The tick records of schedule `name`, by tick (empty if its directory is gone)."""
        records: dict[int, TickRecords] = {}
        for entry in _listdir(self.ticks_dir(name)):
            match = CLAIM_RE.fullmatch(entry)
            if match is not None:
                tick = records.setdefault(int(match.group(1)), TickRecords())
                tick.claims[int(match.group(2))] = os.path.join(self.ticks_dir(name), entry)
                continue
            match = DONE_RE.fullmatch(entry)
            if match is not None:
                tick = records.setdefault(int(match.group(1)), TickRecords())
                tick.done = os.path.join(self.ticks_dir(name), entry)
        return records

    def claim_path(self, name: str, tick_ms: int, generation: int) -> str:
        return os.path.join(self.ticks_dir(name), f"{tick_ms:0{TICK_DIGITS}d}.c{generation}")

    def done_path(self, name: str, tick_ms: int) -> str:
        return os.path.join(self.ticks_dir(name), f"{tick_ms:0{TICK_DIGITS}d}.done")

    def create(self, path: str, record: dict[str, object]) -> bool:
        """Make the record `path` unless it exists: True if this call made it. False too when
        the schedule's directory is gone (the schedule was deleted)."""
        data = json.dumps(record).encode() + b"\n"
        try:
            return smallfiles.create_file(path, data, durable=True, access=self.access)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, "recording a schedule's tick") from exc

    def floor(self, name: str) -> int:
        data = _read_json(os.path.join(self.ticks_dir(name), FLOOR))
        value = data.get("tick_ms") if isinstance(data, dict) else None
        return value if isinstance(value, int) else 0

    def raise_floor(self, name: str, tick_ms: int) -> None:
        path = os.path.join(self.ticks_dir(name), FLOOR)
        if self.floor(name) >= tick_ms:
            return
        data = json.dumps({"tick_ms": tick_ms, "at_s": time.time()}).encode() + b"\n"
        smallfiles.replace_file(path, data, durable=True, access=self.access)


def read_record(path: str | None) -> dict[str, object]:
    """A tick record's JSON object ({} if it is gone or damaged: a record is written whole,
    so a damaged one is a machine crash's, and fsck reports it)."""
    if path is None:
        return {}
    data = _read_json(path)
    return data if isinstance(data, dict) else {}


def _read_json(path: str) -> object:
    try:
        data = smallfiles.read_file(path)
    except OSError:
        return None
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None


def _listdir(path: str) -> Iterator[str]:
    try:
        yield from os.listdir(path)
    except OSError:  # gone (deleted meanwhile), or unreadable now: nothing to do this time
        return
