"""The registry of SQS actions: each is `async (context, params) -> result`, params and result
shaped as in the JSON protocol (the query protocol is translated to and from that shape). Action
modules register theirs with `@action(name)`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from dirmq.sqs.context import Context

Params = dict[str, Any]
Result = dict[str, Any]
Action = Callable[[Context, Params], Awaitable[Result]]

REGISTRY: dict[str, Action] = {}


def action(name: str) -> Callable[[Action], Action]:
    def register(fn: Action) -> Action:
        REGISTRY[name] = fn
        return fn

    return register
