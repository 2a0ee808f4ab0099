"""Recurring schedules (issue 36): a body and headers published to a queue at each tick of a
cron expression in a time zone, or every N seconds; each tick exactly once, whatever the number
of runners. Store + stdlib + cronsim only (docs/FORMAT.md, "Schedules")."""

from dirmq.schedules.api import Schedules, ScheduleStatus, schedule
from dirmq.schedules.model import Schedule, validate_schedule_name
from dirmq.schedules.runner import Scheduler, run_schedules

__all__ = [
    "Schedule",
    "ScheduleStatus",
    "Scheduler",
    "Schedules",
    "run_schedules",
    "schedule",
    "validate_schedule_name",
]
