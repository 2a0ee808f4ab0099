"""The schedules page (/ui/schedules) and its actions: every recurring schedule the principal
may see (dirmq/schedules), with where it stands (its last and next tick), and pause, resume
and delete for an admin of its queue.

Permissions are those of the native API (dialects/native/schedules.py, `SCHEDULE_NEEDS`): a
schedule's queue is in its file, not in the path, so each row is judged on its own queue:
`browse` to see it, `admin` to change it.

    GET  /ui/schedules[?queue=<name>]        the table (those of one queue)
    POST /ui/schedules/<name>/pause|resume   a schedule paused (no tick published) or resumed
    POST /ui/schedules/<name>/delete         removed, its name typed to confirm (`confirm`)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlencode

from dirmq.console.call import Call, Console
from dirmq.console.permissions import SCHEDULE_NEEDS
from dirmq.console.preview import Preview, preview
from dirmq.errors import CorruptConfig, InvalidArgument, ScheduleNotFound
from dirmq.schedules import Schedules, ScheduleStatus, validate_schedule_name
from dirmq.server.contract import Response
from dirmq.store.names import validate_queue_name

OPS = ("pause", "resume", "delete")


@dataclass(frozen=True, slots=True)
class Row:
    status: ScheduleStatus
    body: Preview
    may_change: bool

    @property
    def anchor(self) -> str:
        return "s-" + self.status.schedule.name  # a schedule's name is safe in an id


def schedules_of(console: Console, queue: str) -> list[ScheduleStatus]:
    """The schedules publishing to `queue` (shown on its page to one who may browse it)."""
    return _statuses(Schedules(console.store), lambda target: target == queue)


def _statuses(schedules: Schedules, wanted: Callable[[str], bool]) -> list[ScheduleStatus]:
    """The status of each schedule whose queue is `wanted`: the tick records of those only
    are listed (a page refreshed every 2 s on a root of many schedules)."""
    found = []
    for each in schedules.list():
        if wanted(each.queue):
            try:
                found.append(schedules.status(each.name))
            except (ScheduleNotFound, CorruptConfig):  # deleted or replaced meanwhile
                continue
    return found


def page(console: Console, call: Call) -> Response:
    queue = call.request.query.get("queue", "")
    if queue:
        validate_queue_name(queue)
    see, change = SCHEDULE_NEEDS["see"], SCHEDULE_NEEDS["change"]

    def wanted(target: str) -> bool:
        return (not queue or target == queue) and console.may(call, see, target)

    rows = []
    for status in _statuses(Schedules(console.store), wanted):
        may_change = console.may(call, change, status.schedule.queue)
        rows.append(Row(status, preview(status.schedule.body), may_change))
    return console.render.page(
        "schedules.html",
        principal=call.session.principal,
        signed_in=console.access.enabled,
        csrf=call.csrf,
        request_note=call.request.query.get("note", "")[:300],
        rows=rows,
        queue=queue,
        self_url="/ui/schedules" + ("?" + urlencode({"queue": queue}) if queue else ""),
    )


def act(console: Console, call: Call) -> Response:
    """Pause, resume or delete a schedule, for an admin of its queue (of the queue it has
    now: read first, as the API does)."""
    parts = call.request.path.split("/")  # "", "ui", "schedules", <name>, <op>
    try:
        name = validate_schedule_name(unquote(parts[3], errors="strict"))
    except UnicodeDecodeError:
        raise InvalidArgument("the schedule name in the path is not UTF-8") from None
    op = parts[4]
    if op not in OPS:
        raise InvalidArgument(f"a schedule is paused, resumed or deleted, not {op[:40]!r}")
    schedules = Schedules(console.store)
    console.require(call, SCHEDULE_NEEDS["change"], schedules.get(name).queue)
    if op == "pause":
        schedules.pause(name)
        note = f"paused schedule {name}: no tick is published until it is resumed"
    elif op == "resume":
        schedules.resume(name)
        note = f"resumed schedule {name}: its next tick is the first after now"
    else:
        if call.arg("confirm") != name:
            raise InvalidArgument(
                f"type the schedule's name ({name!r}) to confirm the delete; nothing was removed"
            )
        schedules.delete(name)
        note = f"deleted schedule {name}"
    back = call.arg("back")  # the page the form was on: this one, or the queue's
    if not back.startswith("/ui/") or any(c in back for c in "\\#\r\n") or "//" in back:
        back = "/ui/schedules"
    glue = "&" if "?" in back else "?"
    location = f"{back}{glue}{urlencode({'note': note})}"
    if op != "delete":
        location += f"#s-{quote(name)}"
    return Response(303, b"", [("Location", location), ("Cache-Control", "no-store")])
