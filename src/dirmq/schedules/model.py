"""A recurring schedule: what it publishes, where, and when its ticks fall.

A schedule ticks either at each match of a cron expression in a time zone (`cron` +
`timezone`), evaluated by `cronsim`, or every `every_s` seconds (ticks at whole multiples of
`every_s` since the Unix epoch, so every process computes the same instants with no shared
state). Ticks are instants in UTC milliseconds; a tick's name on disk is that number.

Why cronsim: it is maintained (releases through 2026), typed, has no dependencies, and was
written for correct daylight-saving behaviour (healthchecks.io's scheduler): a local time that
does not exist (spring forward) fires once at the first valid instant after it, and a fixed local
time that occurs twice (fall back) fires once, at its first occurrence; interval expressions
(`*/15 * * * *`) fire in both copies of the repeated hour, as real time passes. croniter, the
other candidate, documents DST bugs and changed hands after being declared unmaintained.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from dirmq.errors import InvalidArgument, InvalidName
from dirmq.store.bounds import MAX_DURATION_S
from dirmq.store.names import validate_queue_name

NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,79}")
MISSED = ("skip", "once")
MIN_EVERY_S = 1.0
MAX_TICKS_PER_STEP = 100_000  # how far one look ahead iterates a cron expression, at most
# Headers every published message carries (set by the runner, never taken from the spec).
TICK_HEADER = "X-Schedule-Tick"
NAME_HEADER = "X-Schedule"
MISSED_HEADER = "X-Schedule-Missed"
RESERVED_HEADERS = frozenset(h.lower() for h in (TICK_HEADER, NAME_HEADER, MISSED_HEADER))
# The keys of a schedule's JSON (the file, PUT /@schedules/{name}); another is refused.
SPEC_KEYS = frozenset(
    {"queue", "cron", "every_s", "timezone", "body", "body_base64", "headers", "missed", "paused"}
)
STORED_KEYS = SPEC_KEYS | {"format", "created_s", "updated_s"}


def validate_schedule_name(name: str) -> str:
    """`name` if it may name a schedule: 1-80 ASCII letters, digits, `_` and `-`, starting with
    a letter or digit (it is a file name and a URL segment as it stands); else InvalidName."""
    if not isinstance(name, str) or NAME_RE.fullmatch(name) is None:
        raise InvalidName(
            f"schedule name {name!r}: use 1-80 letters, digits, '_' or '-', "
            "starting with a letter or digit"
        )
    return name


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule. Exactly one of `cron` and `every_s` is set; `timezone` applies to `cron`
    (an IANA name, `UTC` by default). `missed`: what a tick no runner published in time becomes
    (`skip`: nothing; `once`: one message for all the ticks missed in a row, stamped with the
    latest one). A paused schedule publishes nothing, and its ticks while paused are skipped
    (resuming never publishes the backlog)."""

    name: str
    queue: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    missed: str = "skip"
    paused: bool = False
    created_s: float = 0.0
    updated_s: float = 0.0

    def __post_init__(self) -> None:
        validate_schedule_name(self.name)
        validate_queue_name(self.queue)
        if (self.cron is None) == (self.every_s is None):
            raise InvalidArgument("a schedule needs exactly one of 'cron' and 'every_s'")
        if self.cron is not None:
            if not isinstance(self.cron, str):
                raise InvalidArgument("'cron' must be a string such as '*/5 * * * *'")
            self.zone()  # raises for an unknown zone
            try:
                CronSim(self.cron, datetime.now(UTC))
            except (CronSimError, ValueError) as exc:
                raise InvalidArgument(
                    f"cron expression {self.cron!r}: {exc} (five fields: minute hour "
                    "day-of-month month day-of-week, or six with seconds last)"
                ) from exc
        else:
            every = self.every_s
            if (
                isinstance(every, bool)
                or not isinstance(every, int | float)
                or not math.isfinite(every)
                or not MIN_EVERY_S <= every <= MAX_DURATION_S
            ):
                raise InvalidArgument(
                    f"'every_s' must be a number of seconds from {MIN_EVERY_S:g} "
                    f"to {MAX_DURATION_S:g}, not {every!r}"
                )
            if self.timezone != "UTC":
                raise InvalidArgument("'timezone' applies to 'cron' only: leave it out")
        if self.missed not in MISSED:
            raise InvalidArgument(f"'missed' must be 'skip' or 'once', not {self.missed!r}")
        if not isinstance(self.paused, bool):
            raise InvalidArgument("'paused' must be true or false")
        if not isinstance(self.headers, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise InvalidArgument("'headers' must be an object of strings")
        clash = sorted(k for k in self.headers if k.lower() in RESERVED_HEADERS)
        if clash:
            raise InvalidArgument(f"headers {clash} are set by the scheduler: leave them out")

    def zone(self) -> ZoneInfo:
        try:
            return ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
            raise InvalidArgument(
                f"time zone {self.timezone!r} is unknown: use an IANA name such as "
                "'Europe/Berlin' or 'UTC'"
            ) from exc

    @property
    def every_ms(self) -> int | None:
        return None if self.every_s is None else max(1, round(self.every_s * 1000))

    def next_tick_ms(self, after_ms: int) -> int:
        """The first tick strictly after `after_ms` (UTC ms since the epoch)."""
        every = self.every_ms
        if every is not None:
            return (after_ms // every + 1) * every
        assert self.cron is not None
        start = datetime.fromtimestamp(after_ms / 1000, self.zone())
        return round(next(iter(CronSim(self.cron, start))).timestamp() * 1000)

    def ticks_through(self, after_ms: int, until_ms: int) -> tuple[list[int], int]:
        """The ticks in (`after_ms`, `until_ms`]: the last `MAX_TICKS_PER_STEP` of them, and how
        many there were (an every-second schedule idle for a year has 31 million: counted in
        full for `every_s`, up to the cap for `cron`)."""
        every = self.every_ms
        if every is not None:
            first = after_ms // every + 1
            last = until_ms // every
            count = max(0, last - first + 1)
            lo = max(first, last - MAX_TICKS_PER_STEP + 1)
            return [k * every for k in range(lo, last + 1)], count
        assert self.cron is not None
        # Backwards from `until_ms`: a long idle time costs at most the cap, newest ticks first.
        ticks: list[int] = []
        start = datetime.fromtimestamp((until_ms + 1000) / 1000, self.zone())
        for moment in CronSim(self.cron, start, reverse=True):
            tick = round(moment.timestamp() * 1000)
            if tick > until_ms:
                continue
            if tick <= after_ms or len(ticks) >= MAX_TICKS_PER_STEP:
                break
            ticks.append(tick)
        ticks.reverse()
        return ticks, len(ticks)

    def to_json(self) -> dict[str, Any]:
        """The schedule as stored and answered (`body` as text when it is UTF-8, else
        `body_base64`)."""
        data: dict[str, Any] = {"queue": self.queue}
        if self.cron is not None:
            data["cron"] = self.cron
            data["timezone"] = self.timezone
        else:
            data["every_s"] = self.every_s
        try:
            data["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            data["body_base64"] = base64.b64encode(self.body).decode("ascii")
        data.update(
            headers=dict(self.headers),
            missed=self.missed,
            paused=self.paused,
            created_s=self.created_s,
            updated_s=self.updated_s,
        )
        return data

    def encode(self) -> bytes:
        return json.dumps({"format": 1, **self.to_json()}, indent=1).encode() + b"\n"

    def with_pause(self, paused: bool) -> Schedule:
        return replace(self, paused=paused, updated_s=time.time())


def schedule_from_json(name: str, data: object, *, stored: bool = False) -> Schedule:
    """A schedule from its JSON object (a client's, or `stored`: its file's, which also holds
    its times); InvalidArgument saying what is wrong."""
    if not isinstance(data, dict):
        raise InvalidArgument("a schedule is a JSON object")
    unknown = sorted(set(data) - (STORED_KEYS if stored else SPEC_KEYS))
    if unknown:
        raise InvalidArgument(f"unknown schedule keys {unknown}: known are {sorted(SPEC_KEYS)}")
    if "queue" not in data:
        raise InvalidArgument("a schedule needs 'queue': the queue it publishes to")
    if "body" in data and "body_base64" in data:
        raise InvalidArgument("give 'body' or 'body_base64', not both")
    body = b""
    if "body_base64" in data:
        try:
            body = base64.b64decode(_str(data, "body_base64"), validate=True)
        except (binascii.Error, ValueError) as exc:  # ValueError: a character beyond ASCII
            raise InvalidArgument("'body_base64' is not valid base64") from exc
    elif "body" in data:
        body = _str(data, "body").encode("utf-8")
    headers = data.get("headers", {})
    if not isinstance(headers, dict):
        raise InvalidArgument("'headers' must be an object of strings")
    every = data.get("every_s")
    if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)):
        raise InvalidArgument(f"'every_s' must be a number of seconds, not {every!r}")
    cron = data.get("cron")
    zone = data.get("timezone", "UTC")
    if not isinstance(zone, str):
        raise InvalidArgument("'timezone' must be an IANA zone name such as 'Europe/Berlin'")
    return Schedule(
        name=name,
        queue=_str(data, "queue"),
        body=body,
        headers=dict(headers),
        cron=cron,
        every_s=every,
        timezone=zone,
        missed=data.get("missed", "skip"),
        paused=data.get("paused", False),
        created_s=_time(data, "created_s") if stored else 0.0,
        updated_s=_time(data, "updated_s") if stored else 0.0,
    )


def _str(data: dict[str, Any], key: str) -> str:
    value = data[key]
    if not isinstance(value, str):
        raise InvalidArgument(f"{key!r} must be a string")
    return value


def _time(data: dict[str, Any], key: str) -> float:
    value = data.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(f"{key!r} must be a number")
    return float(value)


def iso_utc(tick_ms: int) -> str:
    """A tick as ISO 8601 UTC with milliseconds (`2026-03-29T01:00:00.000Z`)."""
    moment = datetime.fromtimestamp(tick_ms / 1000, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{tick_ms % 1000:03d}Z"
