"""The shape of native API paths. The queue name is the path (percent-decoded, nested with `/`);
a final `messages` segment, optionally followed by a message reference and an action, addresses
its messages; `messages/ack`, `messages/nack` and `messages/extend` settle many receipts at once
(no message id or receipt is spelled so); a final `redrive` addresses the queue's redrive tasks,
`redrive/{task id}` one of them. `/`, `/health`, `/metrics` and `/openapi.json` are the
server's own."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote

from dirmq.store.names import MESSAGE_ACTIONS as ACTIONS
from dirmq.store.names import REDRIVE, SERVER_PATHS, is_task_id, validate_queue_name

BATCH_ACTIONS = frozenset({"ack", "nack", "extend"})  # POST /{queue}/messages/{action}


@dataclass(frozen=True, slots=True)
class Route:
    kind: str  # root | server | queue | messages | message | action | batch | redrive | task
    queue: str = ""
    ref: str = ""  # message id or receipt; a redrive task's id
    action: str = ""  # an action's, or a batch's (ack | nack | extend)

    @property
    def label(self) -> str:
        """A low-cardinality name for metrics."""
        return self.queue if self.kind == "server" else self.kind


def parse_route(path: str) -> Route:
    """The route of a request path; InvalidName if the queue part is not a valid queue name
    (checked before anything else, so a hostile path never reaches a handler)."""
    route = _shape(unquote(path, errors="strict"))
    if route.queue and route.kind != "server":
        validate_queue_name(route.queue)
    return route


def _shape(decoded: str) -> Route:
    stripped = decoded.strip("/")
    if not stripped:
        return Route("root")
    if stripped in SERVER_PATHS:
        return Route("server", queue=stripped)
    segments = stripped.split("/")
    if len(segments) >= 2 and segments[-1] == "messages":
        return Route("messages", "/".join(segments[:-1]))
    if len(segments) >= 3 and segments[-2] == "messages":
        if segments[-1] in BATCH_ACTIONS:
            return Route("batch", "/".join(segments[:-2]), action=segments[-1])
        return Route("message", "/".join(segments[:-2]), ref=segments[-1])
    if len(segments) >= 4 and segments[-3] == "messages" and segments[-1] in ACTIONS:
        return Route("action", "/".join(segments[:-3]), ref=segments[-2], action=segments[-1])
    if len(segments) >= 2 and segments[-1] == REDRIVE:
        return Route("redrive", "/".join(segments[:-1]))
    if len(segments) >= 3 and segments[-2] == REDRIVE and is_task_id(segments[-1]):
        return Route("task", "/".join(segments[:-2]), ref=segments[-1])
    return Route("queue", stripped)
