"""Settling many receipts in one request: `POST /{queue}/messages/ack`, `.../nack` and
`.../extend` with a JSON body `{"receipts": [...]}` (a nack may add `"delay"`, an extend must add
`"visibility"`: seconds, or a duration such as "30s"). At most MAX_SETTLE receipts a request;
each is settled once (a duplicate is no failure). The answer is 200
`{"settled": N, "failed": [{"receipt", "error", "message"}]}`, the error by its dirmq class name
(what the Python client rebuilds); a body that is wrong anywhere is refused whole (400), before
any receipt is touched, and a `StorageError` answers the whole request (503), as
`Queue.ack_many` raises it once every receipt was tried. The broker settles each batch with one
pool call and one store call (`Broker.ack_many`, `extend_many`, `nack_many`)."""

from __future__ import annotations

import json

from dirmq.dialects.native.routes import Route
from dirmq.errors import InvalidArgument, StorageError
from dirmq.server.broker import Broker
from dirmq.server.contract import Request, Response
from dirmq.store.bounds import check_seconds
from dirmq.wire import jsondoc
from dirmq.wire.durations import parse_duration

MAX_SETTLE = 1000  # receipts per batch request
_BATCH_OPTIONS = {"ack": "", "nack": "delay", "extend": "visibility"}  # each one's duration


def read_settle_batch(body: bytes, action: str) -> tuple[list[str], float | None]:
    """The receipts of a batch settle request's JSON body (duplicates once, in order) and its
    duration (`delay` of a nack, `visibility` of an extend, required): InvalidArgument for
    anything else, before any receipt is touched."""
    option = _BATCH_OPTIONS[action]
    spelled = '{"receipts": [...]' + (f', "{option}": ...' if option else "") + "}"
    try:
        data = jsondoc.loads(body) if body.strip() else None
    except ValueError as exc:
        raise InvalidArgument(f"the body must be a JSON object {spelled}: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidArgument(f"the body must be a JSON object {spelled}")
    unknown = sorted(str(key)[:100] for key in data if key not in ("receipts", option))
    if unknown:
        raise InvalidArgument(f"unknown key {unknown[0]!r}: {action} takes {spelled}")
    receipts = data.get("receipts")
    if not isinstance(receipts, list):
        raise InvalidArgument(f'"receipts" must be a list of receipts: {spelled}')
    if len(receipts) > MAX_SETTLE:
        raise InvalidArgument(
            f"{len(receipts)} receipts in one request; at most {MAX_SETTLE}: split the batch"
        )
    for receipt in receipts:
        if not isinstance(receipt, str):
            raise InvalidArgument(f"a receipt must be a string, not {str(receipt)[:80]!r}")
    duration: float | None = None
    if option and option in data:
        duration = _json_duration(data[option], option)
    elif action == "extend":
        raise InvalidArgument(f'extend needs "visibility" (e.g. "30s"): {spelled}')
    return list(dict.fromkeys(receipts)), duration


def _json_duration(value: object, name: str) -> float:
    """A duration in a JSON body: seconds as a number, or a string as in a query parameter."""
    if isinstance(value, str):
        return parse_duration(value, name)
    return check_seconds(name, value)  # a number of seconds, within bounds


async def settle_batch(broker: Broker, request: Request, route: Route) -> Response:
    queue = broker.queue(route.queue)  # 404 before the body is looked at
    receipts, duration = read_settle_batch(request.body, route.action)
    dead: list[str] = []
    if route.action == "ack":
        failures = await broker.ack_many(queue, receipts)
    elif route.action == "nack":
        failures = await broker.nack_many(queue, receipts, duration or 0.0, dead)
    else:
        assert duration is not None
        failures = await broker.extend_many(queue, receipts, duration)
    for failure in failures.values():  # as `Queue.ack_many`: raised once all were tried
        if isinstance(failure, StorageError):
            raise failure
    failed = [
        {"receipt": receipt, "error": type(exc).__name__, "message": str(exc)}
        for receipt, exc in failures.items()
    ]
    answer: dict[str, object] = {"settled": len(receipts) - len(failed), "failed": failed}
    if route.action == "nack":  # those past the queue's max receives went to its dead letters
        answer["dead_lettered"] = dead
    body = json.dumps(answer, separators=(",", ":")).encode() + b"\n"
    return Response(200, body, [("Content-Type", "application/json")])
