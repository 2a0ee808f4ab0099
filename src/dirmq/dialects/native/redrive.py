"""The native API's redrive: a queue's dead messages moved back as a task (dirmq/redrive).

POST   /{queue}/redrive             start: {"ids": [...]} or {"reason": "..."} (or nothing:
                                    all), "to": a queue (default: where each died),
                                    "rate_per_s": n; 202 + the task, Location: its address;
                                    409 while another redrive of the queue runs
GET    /{queue}/redrive             its tasks, newest first (the last 10 kept)
GET    /{queue}/redrive/{task}      one task: status, moved, to_move, left (ids it could not move)
DELETE /{queue}/redrive/{task}      cancel it after the chunk in progress (200 + the task)
"""

from __future__ import annotations

import json
from typing import cast
from urllib.parse import quote

from dirmq.dialects.native.routes import Route
from dirmq.errors import InvalidArgument
from dirmq.redrive.model import RedriveTask
from dirmq.redrive.tasks import redrives_of
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.wire import jsondoc

_KEYS = ("ids", "reason", "to", "rate_per_s")


def _answer(status: int, data: object, headers: list[tuple[str, str]] | None = None) -> Response:
    body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
    return Response(status, body, [("Content-Type", "application/json"), *(headers or [])])


def task_path(task: RedriveTask) -> str:
    return f"/{quote(task.source, safe='/')}/redrive/{task.task_id}"


def read_start(body: bytes) -> dict[str, object]:
    """The options of a start, checked for shape (the values are checked by `start`)."""
    spelled = '{"ids": [...] | "reason": "...", "to": "queue", "rate_per_s": n}, each optional'
    data = jsondoc.load_object(
        body, f"the body must be a JSON object {spelled}", _KEYS, f"a redrive takes {spelled}"
    )
    ids = data.get("ids")
    if ids is not None and not isinstance(ids, list):
        raise InvalidArgument('"ids" must be a list of message ids')
    for key in ("reason", "to"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise InvalidArgument(f'"{key}" must be a string')
    if ids is not None and data.get("reason") is not None:
        raise InvalidArgument('give "ids" or "reason", not both')
    return data


def redrive_target(body: bytes) -> str | None:
    """The queue a start's `"to"` names, if it names one (a body that does not parse names
    none: `start` refuses it)."""
    try:
        to = read_start(body).get("to")
    except InvalidArgument:
        return None
    return to if isinstance(to, str) else None


async def start(broker: Broker, request: Request, route: Route) -> Response:
    broker.queue(route.queue)  # 404 before the body is looked at
    options = read_start(request.body)
    tasks = redrives_of(broker.store)
    ids = options.get("ids")
    reason, to, rate = options.get("reason"), options.get("to"), options.get("rate_per_s")

    def begin() -> RedriveTask:
        # The values' types are checked there (a wrong one is a 400 that says which).
        return tasks.start(
            route.queue,
            ids=cast("list[str] | None", ids),
            reason=cast("str | None", reason),
            to=cast("str | None", to),
            rate_per_s=cast("int | None", rate),
        )

    task = await broker.call(begin)
    return _answer(202, task.to_json(), [("Location", task_path(task))])


async def list_tasks(broker: Broker, request: Request, route: Route) -> Response:
    broker.queue(route.queue)
    tasks = await broker.call(redrives_of(broker.store).list, route.queue)
    return _answer(200, {"tasks": [t.to_json() for t in tasks]})


async def get_task(broker: Broker, request: Request, route: Route) -> Response:
    broker.queue(route.queue)
    task = await broker.call(redrives_of(broker.store).get, route.queue, route.ref)
    return _answer(200, task.to_json())


async def cancel_task(broker: Broker, request: Request, route: Route) -> Response:
    broker.queue(route.queue)
    task = await broker.call(redrives_of(broker.store).cancel, route.queue, route.ref)
    return _answer(200, task.to_json())
