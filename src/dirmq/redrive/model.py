"""A redrive task as it is recorded (records.py), shown (the native API's JSON, `dirmq
redrive`) and checked: its statuses, what it moves, how far it got."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dirmq import errors
from dirmq.store.deadletters import format_time

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
CANCELLING = "CANCELLING"
CANCELLED = "CANCELLED"
FAILED = "FAILED"
ACTIVE = (RUNNING, CANCELLING)
MAX_RATE = 10_000  # messages per second a task may be paced at


@dataclass(slots=True, eq=False)
class RedriveTask:
    task_id: str
    source: str  # the queue whose dead messages move
    to: str | None  # None: each to where it died
    ids: list[str] | None
    reason: str | None
    rate_per_s: int | None
    to_move: int  # planned at the start: an upper bound (a ready message may be live)
    until: str | None  # the newest id the task may move
    started_ms: int
    status: str = RUNNING
    moved: int = 0
    cursor: str | None = None  # the last id examined
    left: dict[str, str] = field(default_factory=dict)
    failure: str | None = None
    finished_ms: int | None = None
    origin: str = "native"  # what started it: native, sqs, cli (SQS shows its ARNs)
    cancel_requested: bool = False  # by any process (a `.cancel` file), as last read

    @property
    def status_shown(self) -> str:
        """CANCELLING for a running task asked to stop."""
        return CANCELLING if self.status == RUNNING and self.cancel_requested else self.status

    def record(self) -> dict[str, object]:
        """What the task's file holds."""
        return {
            "task_id": self.task_id,
            "source": self.source,
            "to": self.to,
            "ids": self.ids,
            "reason": self.reason,
            "rate_per_s": self.rate_per_s,
            "to_move": self.to_move,
            "until": self.until,
            "started_ms": self.started_ms,
            "status": self.status,
            "moved": self.moved,
            "cursor": self.cursor,
            "left": self.left,
            "failure": self.failure,
            "finished_ms": self.finished_ms,
            "origin": self.origin,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> RedriveTask:
        ids = data.get("ids")
        return cls(
            task_id=str(data["task_id"]),
            source=str(data["source"]),
            to=_optional_str(data.get("to")),
            ids=None if ids is None else [str(i) for i in ids],
            reason=_optional_str(data.get("reason")),
            rate_per_s=_optional_int(data.get("rate_per_s")),
            to_move=int(data.get("to_move", 0)),
            until=_optional_str(data.get("until")),
            started_ms=int(data.get("started_ms", 0)),
            status=str(data.get("status", FAILED)),
            moved=int(data.get("moved", 0)),
            cursor=_optional_str(data.get("cursor")),
            left={str(k): str(v) for k, v in dict(data.get("left") or {}).items()},
            failure=_optional_str(data.get("failure")),
            finished_ms=_optional_int(data.get("finished_ms")),
            origin=str(data.get("origin", "native")),
        )

    def to_json(self) -> dict[str, object]:
        """The task as the native API and `dirmq redrive` show it."""
        return {
            "task_id": self.task_id,
            "queue": self.source,
            "status": self.status_shown.lower(),
            "to": self.to,
            "ids": self.ids,
            "reason": self.reason,
            "rate_per_s": self.rate_per_s,
            "moved": self.moved,
            "to_move": self.to_move,
            "left": self.left,
            "failure": self.failure,
            "started_at": format_time(self.started_ms / 1000),
            "finished_at": _time_or_none(self.finished_ms),
        }


def _time_or_none(at_ms: int | None) -> str | None:
    return None if at_ms is None else format_time(at_ms / 1000)


def _optional_str(value: object) -> str | None:
    return None if value is None else str(value)


def _optional_int(value: object) -> int | None:
    return None if value is None else int(str(value))


def check_rate(rate_per_s: object) -> int | None:
    if rate_per_s is None:
        return None
    if isinstance(rate_per_s, bool) or not isinstance(rate_per_s, int):
        raise errors.InvalidArgument(f"rate_per_s must be an integer, got {rate_per_s!r}")
    if not 1 <= rate_per_s <= MAX_RATE:
        raise errors.InvalidArgument(f"rate_per_s must be from 1 to {MAX_RATE}, got {rate_per_s}")
    return rate_per_s
