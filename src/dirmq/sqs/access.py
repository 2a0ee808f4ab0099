"""Which permission each SQS action needs, and on which queue: judged by name, after the
request is parsed and before the action runs (so a refusal is the same for a queue that exists
and one that does not). docs/security.md has the table for readers.

    read    ReceiveMessage, DeleteMessage(Batch), ChangeMessageVisibility(Batch)
    write   SendMessage(Batch); the queue a RedrivePolicy or a move task sends messages to
    admin   CreateQueue, SetQueueAttributes, PurgeQueue, DeleteQueue, TagQueue, UntagQueue,
            AddPermission, RemovePermission, Start/CancelMessageMoveTask (the source)
    any     GetQueueUrl, GetQueueAttributes, ListQueueTags, ListDeadLetterSourceQueues,
            ListMessageMoveTasks (the source): the actions that only look, so `browse` is
            enough (SQS has no way to look at a message without receiving it)
    -       ListQueues (and ListDeadLetterSourceQueues' answer): only the queues the principal
            may see

An action in none of these tables is refused: a new action must be given its permission here
(tests/test_access.py checks every registered action is).
"""

from __future__ import annotations

from typing import Any

from dirmq.server.access import Access
from dirmq.server.credentials import ADMIN, READ, SEE, WRITE
from dirmq.sqs.actions.move_tasks import task_of_handle
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError, missing
from dirmq.wire import jsondoc

BY_QUEUE_URL: dict[str, str] = {
    "SendMessage": WRITE,
    "SendMessageBatch": WRITE,
    "ReceiveMessage": READ,
    "DeleteMessage": READ,
    "DeleteMessageBatch": READ,
    "ChangeMessageVisibility": READ,
    "ChangeMessageVisibilityBatch": READ,
    "GetQueueAttributes": SEE,
    "ListQueueTags": SEE,
    "ListDeadLetterSourceQueues": SEE,
    "SetQueueAttributes": ADMIN,
    "PurgeQueue": ADMIN,
    "DeleteQueue": ADMIN,
    "TagQueue": ADMIN,
    "UntagQueue": ADMIN,
    "AddPermission": ADMIN,
    "RemovePermission": ADMIN,
}
BY_QUEUE_NAME: dict[str, str] = {"CreateQueue": ADMIN, "GetQueueUrl": SEE}
BY_SOURCE_ARN: dict[str, str] = {"StartMessageMoveTask": ADMIN, "ListMessageMoveTasks": SEE}
BY_TASK_HANDLE = ("CancelMessageMoveTask",)
FILTERED = ("ListQueues",)  # their answers hold only what the principal may see
JUDGED = (*BY_QUEUE_URL, *BY_QUEUE_NAME, *BY_SOURCE_ARN, *BY_TASK_HANDLE, *FILTERED)


def authorise(
    access: Access, principal: str, action: str, params: dict[str, Any], ctx: Context
) -> None:
    """Return if `principal` may run `action` with `params`; else SqsError AccessDenied. Bad
    parameters raise what the action itself would (nothing is looked up)."""
    if not access.enabled:
        return
    needs = BY_QUEUE_URL.get(action)
    if needs is not None:
        _require(access, principal, action, needs, ctx.name_from_url(params.get("QueueUrl")))
        if action == "SetQueueAttributes":
            _redrive_target(access, principal, action, params, ctx)
        return
    needs = BY_QUEUE_NAME.get(action)
    if needs is not None:
        name = params.get("QueueName")
        if not isinstance(name, str) or not name:
            raise missing("QueueName")
        _require(access, principal, action, needs, name)
        if action == "CreateQueue":
            _redrive_target(access, principal, action, params, ctx)
        return
    needs = BY_SOURCE_ARN.get(action)
    if needs is not None:
        _require(access, principal, action, needs, _arn(ctx, params, "SourceArn"))
        if action == "StartMessageMoveTask" and params.get("DestinationArn") not in (None, ""):
            _require(access, principal, action, WRITE, _arn(ctx, params, "DestinationArn"))
        return
    if action in BY_TASK_HANDLE:
        _task_id, source = task_of_handle(ctx, params.get("TaskHandle"))
        _require(access, principal, action, ADMIN, source)
        return
    if action not in FILTERED:
        raise SqsError("AccessDenied", f"sqs:{action} has no permission rule: refused")


def _require(access: Access, principal: str, action: str, needs: str, name: str) -> None:
    if not access.allows(principal, needs, name):
        wanted = "some permission" if needs == SEE else f"{needs} permission"
        raise SqsError(
            "AccessDenied",
            f"principal {principal!r} is not authorized to perform sqs:{action} on queue "
            f"{name!r}: it needs {wanted} on it",
        )


def _arn(ctx: Context, params: dict[str, Any], parameter: str) -> str:
    arn = params.get(parameter)
    if not isinstance(arn, str) or not arn:
        raise missing(parameter)
    return ctx.name_from_arn(arn, parameter)


def _redrive_target(
    access: Access, principal: str, action: str, params: dict[str, Any], ctx: Context
) -> None:
    """A RedrivePolicy sends the queue's dead letters to its target: writing to it."""
    attributes = params.get("Attributes")
    policy = attributes.get("RedrivePolicy") if isinstance(attributes, dict) else None
    if not isinstance(policy, str) or not policy.strip():
        return
    try:
        document = jsondoc.loads(policy.encode())
    except ValueError:
        return  # the action refuses it, before anything is stored
    target = document.get("deadLetterTargetArn") if isinstance(document, dict) else None
    if isinstance(target, str):
        try:
            name = ctx.name_from_arn(target, "RedrivePolicy")
        except SqsError:
            return  # likewise
        _require(access, principal, action, WRITE, name)
