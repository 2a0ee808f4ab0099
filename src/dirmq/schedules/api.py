"""Schedules: the library's door to a root's recurring schedules (the CLI, the native HTTP API
and the console call it too)."""

from __future__ import annotations

import builtins
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from dirmq.errors import ConfigError, QueueNotFound
from dirmq.schedules.model import Schedule, iso_utc, schedule_from_json
from dirmq.schedules.records import ScheduleFiles, read_record
from dirmq.schedules.runner import LATE_S, Scheduler
from dirmq.store import OutgoingMessage, Store


@dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """A schedule and where it stands: its last finished tick (published, or skipped), the
    message that tick published, and its next tick (None while paused)."""

    schedule: Schedule
    last_tick_ms: int | None
    last_kind: str | None  # tick | once | skip
    last_message_id: str | None
    next_tick_ms: int | None

    def to_json(self) -> dict[str, object]:
        data = self.schedule.to_json()
        data["name"] = self.schedule.name
        data["last_tick"] = None if self.last_tick_ms is None else iso_utc(self.last_tick_ms)
        data["last_kind"] = self.last_kind
        data["last_message_id"] = self.last_message_id
        data["next_tick"] = None if self.next_tick_ms is None else iso_utc(self.next_tick_ms)
        return data


class Schedules:
    """The schedules of `store`'s root. Changes take effect at every runner's next step (within
    a second); a change never publishes ticks from before it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.files = ScheduleFiles(store.root, store.access)

    def put(self, schedule: Schedule) -> Schedule:
        """Create or replace a schedule (its creation time kept). The queue must exist
        (QueueNotFound) and take its body and headers (what `put` would refuse is refused
        now)."""
        if not self.store.exists(schedule.queue):
            raise QueueNotFound.missing(schedule.queue)
        queue = self.store.queue(schedule.queue)
        queue.validate(OutgoingMessage(schedule.body, schedule.headers))
        now = time.time()
        try:
            created = self.files.read(schedule.name).created_s
        except (LookupError, ConfigError):  # none yet, or a damaged file: this one replaces it
            created = now
        stored = replace(schedule, created_s=created, updated_s=now)
        self.files.write(stored)
        return stored

    def put_json(self, name: str, data: object) -> Schedule:
        """`put` of a schedule given as its JSON object (the native API's body)."""
        return self.put(schedule_from_json(name, data))

    def get(self, name: str) -> Schedule:
        return self.files.read(name)

    def names(self) -> list[str]:
        return self.files.names()

    def list(self) -> list[Schedule]:
        """Every schedule (one whose file is damaged is left out: fsck reports it)."""
        found = []
        for name in self.files.names():
            try:
                found.append(self.files.read(name))
            except (LookupError, ValueError):
                continue
        return found

    def pause(self, name: str) -> Schedule:
        return self._set_paused(name, True)

    def resume(self, name: str) -> Schedule:
        """Resume a paused schedule: its next tick is the first after now (the ticks while it
        was paused are not published)."""
        return self._set_paused(name, False)

    def _set_paused(self, name: str, paused: bool) -> Schedule:
        schedule = self.files.read(name).with_pause(paused)
        self.files.write(schedule)
        return schedule

    def delete(self, name: str) -> None:
        self.files.remove(name)

    def status(self, name: str, now_s: float | None = None) -> ScheduleStatus:
        return self._status(self.files.read(name), time.time() if now_s is None else now_s)

    def statuses(self, now_s: float | None = None) -> builtins.list[ScheduleStatus]:
        """Every schedule with its last and next tick (what the console shows)."""
        now = time.time() if now_s is None else now_s
        return [self._status(schedule, now) for schedule in self.list()]

    def _status(self, schedule: Schedule, now_s: float) -> ScheduleStatus:
        last_tick = last_kind = last_id = None
        for tick, records in sorted(self.files.ticks(schedule.name).items(), reverse=True):
            first = read_record(records.claims.get(0))
            if records.done is not None:
                done = read_record(records.done)
                kind, message_id = done.get("kind"), done.get("message_id")
            elif first.get("kind") == "skip":
                kind, message_id = "skip", None
            else:
                continue  # claimed, not published yet
            last_tick = tick
            last_kind = kind if isinstance(kind, str) else None
            last_id = message_id if isinstance(message_id, str) else None
            break
        next_tick = None
        if not schedule.paused:
            after = max(int(now_s * 1000), last_tick or 0)
            next_tick = schedule.next_tick_ms(after)
        return ScheduleStatus(schedule, last_tick, last_kind, last_id, next_tick)

    def scheduler(self, *, late_s: float = LATE_S) -> Scheduler:
        """A runner of these schedules in this process: `with schedules.scheduler(): ...`, or
        `.start()` and `.stop()`."""
        return Scheduler(self.store, late_s=late_s)


def schedule(
    name: str,
    queue: str,
    *,
    cron: str | None = None,
    every_s: float | None = None,
    timezone: str = "UTC",
    body: bytes | str = b"",
    headers: Mapping[str, str] | None = None,
    missed: str = "skip",
    paused: bool = False,
) -> Schedule:
    """A Schedule from keywords (`body` as text is UTF-8)."""
    return Schedule(
        name=name,
        queue=queue,
        body=body.encode("utf-8") if isinstance(body, str) else body,
        headers=dict(headers or {}),
        cron=cron,
        every_s=every_s,
        timezone=timezone,
        missed=missed,
        paused=paused,
    )
