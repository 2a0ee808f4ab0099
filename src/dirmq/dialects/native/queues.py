"""The native API's queue routes: list, look at, create or reconfigure, delete.

GET    /                 queues (?prefix=)
GET    /{queue}          stats and configuration; 404 if absent
PUT    /{queue}          create (201) or reconfigure (200), optional JSON body
DELETE /{queue}          delete with every message, in flight or not (204)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict

from dirmq.dialects.native.routes import Route
from dirmq.errors import InvalidArgument, QueueExists
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.store import QueueConfig
from dirmq.wire import jsondoc


def json_response(
    status: int, data: object, headers: list[tuple[str, str]] | None = None
) -> Response:
    body = json.dumps(data, separators=(",", ":")).encode() + b"\n"
    return Response(status, body, [("Content-Type", "application/json"), *(headers or [])])


async def list_queues(
    broker: Broker, request: Request, route: Route, visible: Callable[[str], bool] | None = None
) -> Response:
    """The queues (under ?prefix=), those `visible` allows only when given."""
    names = await broker.call(broker.store.list_queues, request.query.get("prefix", ""))
    if visible is not None:
        names = [name for name in names if visible(name)]
    return json_response(200, {"queues": names})


async def get_queue(broker: Broker, request: Request, route: Route) -> Response:
    queue = broker.queue(route.queue)
    stats = await broker.call(queue.stats)
    return json_response(
        200,
        {
            "name": queue.name,
            "stats": asdict(stats) | {"total": stats.total},
            "config": queue.config.to_json(),
        },
    )


async def put_queue(broker: Broker, request: Request, route: Route) -> Response:
    changes = _config_body(request.body)
    store = broker.store
    config = QueueConfig().updated(**changes)  # 400 before anything happens if invalid
    try:
        await broker.call(store.create_queue, route.queue, config, exist_ok=False)
        created = True
    except QueueExists:  # it exists (or a concurrent PUT just made it): apply the changes
        if changes:
            await broker.call(store.configure, route.queue, **changes)
        created = False
    response = await get_queue(broker, request, route)
    response.status = 201 if created else 200
    return response


def dead_letter_target(body: bytes) -> str | None:
    """The `dead_letter_queue` a PUT's configuration names, if it names one (a body that does
    not parse names none: the handler refuses it)."""
    try:
        value = _config_body(body).get("dead_letter_queue")
    except InvalidArgument:
        return None
    return value if isinstance(value, str) else None


def _config_body(body: bytes) -> dict[str, object]:
    known = QueueConfig().to_json().keys()
    return jsondoc.load_object(
        body,
        "queue configuration must be a JSON object",
        known,
        "a queue takes " + ", ".join(sorted(known)),
        "configuration key",
    )


async def delete_queue(broker: Broker, request: Request, route: Route) -> Response:
    await broker.call(broker.store.delete_queue, route.queue)
    return Response(204)
