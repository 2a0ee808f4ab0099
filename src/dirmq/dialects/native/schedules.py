"""The native API's recurring schedules (dirmq/schedules), under the reserved `/@schedules`:

PUT    /@schedules/{name}   create or replace: {"queue", "cron" (+ "timezone") or "every_s",
                            "body" | "body_base64", "headers", "missed": "skip" | "once",
                            "paused"}; 201 when created, 200 when replaced; the schedule
                            with its last and next tick
GET    /@schedules          {"schedules": [...]}: those whose queue the principal may browse
GET    /@schedules/{name}   one schedule, its last tick (and message id) and next tick
DELETE /@schedules/{name}   204

Permissions, judged here (a schedule's queue is in its body or its file, not in the path):
admin on the queue to create, change or delete a schedule (on both queues when a change moves
it to another); browse (read grants it too) on its queue to see one.
"""

from __future__ import annotations

import json
from urllib.parse import unquote

from dirmq.errors import CorruptConfig, ScheduleNotFound
from dirmq.schedules import Schedules
from dirmq.schedules.model import SPEC_KEYS, schedule_from_json, validate_schedule_name
from dirmq.server.access import Access
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.server.credentials import ADMIN, BROWSE
from dirmq.server.errors import json_error
from dirmq.server.parameters import check_parameters
from dirmq.wire import jsondoc

PREFIX = "/@schedules"
_SPELLED = (
    '{"queue": "q", "cron": "*/5 * * * *", "timezone": "Europe/Berlin" | "every_s": 60, '
    '"body": "...", "headers": {...}, "missed": "skip" | "once", "paused": false}'
)


def schedule_path(path: str) -> str | None:
    """The schedule name a path addresses ("" for the collection), or None if the path is not
    under /@schedules."""
    if path.rstrip("/") == PREFIX:
        return ""
    if not path.startswith(PREFIX + "/"):
        return None
    return unquote(path[len(PREFIX) + 1 :].rstrip("/"), errors="strict")


class ScheduleRoutes:
    def __init__(self, broker: Broker, access: Access) -> None:
        self.broker = broker
        self.access = access
        self.schedules = Schedules(broker.store)

    async def __call__(self, request: Request, name: str) -> Response:
        if request.query:
            check_parameters(request.query, frozenset(), f"{request.method} {PREFIX}")
        if not name:
            if request.method not in ("GET", "HEAD"):
                return _not_allowed(f"{PREFIX} lists the schedules", "GET")
            return await self._list(request)
        validate_schedule_name(name)
        method = "GET" if request.method == "HEAD" else request.method
        if method == "GET":
            return await self._get(request, name)
        if method == "PUT":
            return await self._put(request, name)
        if method == "DELETE":
            return await self._delete(request, name)
        return _not_allowed(f"{PREFIX}/{name}", "DELETE, GET, PUT")

    async def _list(self, request: Request) -> Response:
        statuses = await self.broker.call(self.schedules.statuses)
        principal = request.principal
        shown = [
            s.to_json() for s in statuses if self.access.allows(principal, BROWSE, s.schedule.queue)
        ]
        return _answer(200, {"schedules": shown})

    async def _get(self, request: Request, name: str) -> Response:
        status = await self.broker.call(self.schedules.status, name)
        self.access.require(request.principal, BROWSE, status.schedule.queue)
        return _answer(200, status.to_json())

    async def _put(self, request: Request, name: str) -> Response:
        data = jsondoc.load_object(
            request.body,
            f"the body must be a JSON object {_SPELLED}",
            tuple(sorted(SPEC_KEYS)),
            f"a schedule is {_SPELLED}",
        )
        schedule = schedule_from_json(name, data)
        self.access.require(request.principal, ADMIN, schedule.queue)
        try:
            existing = await self.broker.call(self.schedules.get, name)
        except ScheduleNotFound:
            existing = None
        except CorruptConfig:  # a damaged file: replaced by an admin of the new queue
            existing = None
        if existing is not None and existing.queue != schedule.queue:
            self.access.require(request.principal, ADMIN, existing.queue)
        await self.broker.call(self.schedules.put, schedule)
        status = await self.broker.call(self.schedules.status, name)
        return _answer(201 if existing is None else 200, status.to_json())

    async def _delete(self, request: Request, name: str) -> Response:
        existing = await self.broker.call(self.schedules.get, name)
        self.access.require(request.principal, ADMIN, existing.queue)
        await self.broker.call(self.schedules.delete, name)
        return Response(204)


def _answer(status: int, data: object) -> Response:
    body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
    return Response(status, body, [("Content-Type", "application/json")])


def _not_allowed(what: str, allow: str) -> Response:
    response = json_error(405, "MethodNotAllowed", f"{what}: allowed are {allow}")
    response.headers.append(("Allow", allow))
    return response
