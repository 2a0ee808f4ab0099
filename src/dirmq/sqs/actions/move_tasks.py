"""Dead-letter queue redrive: StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask.

A move task is a redrive task (dirmq/redrive/tasks.py), what `POST /{queue}/redrive` runs too:
it takes the dead messages out of a dead-letter queue (the task's *source*, SourceArn) and puts
each into DestinationArn or, without one, back into the queue it died in (its provenance,
`Dirmq-Dead-Source`, says which: several queues may share one dead-letter queue). Each move is
one rename: a message keeps its id, body, attributes and group, and is moved exactly once
whatever crashes; no copy is made, so nothing needs deduplicating.

- The task moves at most the messages that were in the DLQ when it started
  (ApproximateNumberOfMessagesToMove), so messages that die again during the redrive are not
  redriven forever.
- MaxNumberOfMessagesPerSecond (1-500) paces it. CancelMessageMoveTask stops it after the chunk
  in progress (CANCELLING, then CANCELLED); what was moved stays moved.
- A destination that disappears fails the task (FAILED, FailureReason in AWS's words).

Tasks are files under the root (redrive/records.py), so every worker and process serving it sees
the same tasks, native ones too: "one active task per source queue" holds across them, and a task
whose process died (SIGKILL, a restart) is resumed by the next process that starts, lists or
looks at that source's tasks, from the last chunk it recorded.
"""

from __future__ import annotations

import base64
import binascii
import json

from dirmq import errors
from dirmq.redrive.model import FAILED, RUNNING, RedriveTask
from dirmq.redrive.tasks import Redrives, redrives_of
from dirmq.server.broker import Broker
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.context import Context, valid_sqs_name
from dirmq.sqs.errors import SqsError
from dirmq.store import Store
from dirmq.wire import jsondoc

MAX_RATE = 500
MAX_RESULTS = 10


def describe(task: RedriveTask, ctx: Context) -> Result:
    """A task as ListMessageMoveTasks shows it."""
    entry: Result = {}
    status = task.status_shown
    if status == RUNNING:
        entry["TaskHandle"] = encode_handle(task.task_id, ctx.queue_arn(task.source))
    entry["Status"] = status
    entry["SourceArn"] = ctx.queue_arn(task.source)
    if task.to is not None:
        entry["DestinationArn"] = ctx.queue_arn(task.to)
    if task.rate_per_s is not None:
        entry["MaxNumberOfMessagesPerSecond"] = task.rate_per_s
    entry["ApproximateNumberOfMessagesMoved"] = task.moved
    entry["ApproximateNumberOfMessagesToMove"] = task.to_move
    if task.status == FAILED and task.failure:
        entry["FailureReason"] = failure_reason(task.failure)
    entry["StartedTimestamp"] = task.started_ms
    return entry


def tasks_of(broker: Broker) -> Redrives:
    """The server's redrive tasks (SQS's move tasks are redrive tasks)."""
    return redrives_of(broker.store)


def encode_handle(task_id: str, source_arn: str) -> str:
    """AWS's shape: base64 of {"taskId": ..., "sourceArn": ...}."""
    doc = json.dumps({"taskId": task_id, "sourceArn": source_arn}, separators=(",", ":"))
    return base64.b64encode(doc.encode()).decode()


def decode_handle(handle: object) -> tuple[str, str]:
    """(task id, source ARN) of a TaskHandle; InvalidParameterValue if it is not one of ours."""
    invalid = SqsError("InvalidParameterValue", "Value for parameter TaskHandle is invalid.")
    if not isinstance(handle, str) or not handle:
        raise invalid
    try:
        doc = jsondoc.loads(base64.b64decode(handle.encode("ascii"), validate=True))
    except (ValueError, UnicodeError, binascii.Error):
        raise invalid from None
    if not isinstance(doc, dict):
        raise invalid
    task_id, source_arn = doc.get("taskId"), doc.get("sourceArn")
    if not isinstance(task_id, str) or not isinstance(source_arn, str):
        raise invalid
    return task_id, source_arn


def task_of_handle(ctx: Context, handle: object) -> tuple[str, str]:
    """(task id, source queue name) of a TaskHandle; InvalidParameterValue if it is not one of
    ours or names no queue of this account."""
    task_id, source_arn = decode_handle(handle)
    try:
        return task_id, ctx.name_from_arn(source_arn, "SourceArn")
    except SqsError:
        raise SqsError(
            "InvalidParameterValue", "Value for parameter TaskHandle is invalid."
        ) from None


# -- the actions ---------------------------------------------------------------------------------


def _arn_param(ctx: Context, params: Params, name: str) -> str:
    """The queue name in ARN parameter `name` (required)."""
    arn = params.get(name)
    if not isinstance(arn, str) or not arn:
        raise SqsError("MissingParameter", f"The request must contain the parameter {name}.")
    return ctx.name_from_arn(arn, name)


def _not_found(parameter: str) -> SqsError:
    return SqsError(
        "ResourceNotFoundException",
        f"The resource that you specified for the {parameter} parameter doesn't exist.",
    )


def _int_param(params: Params, name: str, low: int, high: int, default: int | None) -> int | None:
    value = params.get(name)
    if value is None:
        return default
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {name} is invalid. Reason: You must enter a number "
            f"that's between {low} and {high}.",
        )
    return value


def _check(store: Store, source: str, destination: str | None) -> None:
    """Checks against the store (run on the broker's thread pool)."""
    if not store.exists(source):
        raise _not_found("SourceArn")
    if not dead_letter_sources(store, source):
        raise SqsError(
            "InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue."
        )
    if destination is None:
        return
    if not store.exists(destination):
        raise _not_found("DestinationArn")
    if destination == source:
        raise SqsError(
            "InvalidParameterValue", "The source and destination queues must be different."
        )
    if source.endswith(".fifo") != destination.endswith(".fifo"):
        raise SqsError(
            "InvalidParameterValue",
            "The destination queue must be of the same type (standard or FIFO) as the source "
            "queue.",
        )


def dead_letter_sources(store: Store, dlq: str) -> list[str]:
    """The SQS-visible queues whose dead-letter queue is `dlq`, sorted."""
    found = []
    for name in store.list_queues():
        if name == dlq or not valid_sqs_name(name):
            continue
        try:
            if store.queue(name).config.dead_letter_queue == dlq:
                found.append(name)
        except errors.DirmqError:  # deleted meanwhile, or a corrupt configuration
            continue
    return found


@action("StartMessageMoveTask")
async def start_message_move_task(ctx: Context, params: Params) -> Result:
    source = _arn_param(ctx, params, "SourceArn")
    destination: str | None = None
    if params.get("DestinationArn") not in (None, ""):
        destination = _arn_param(ctx, params, "DestinationArn")
    rate = _int_param(params, "MaxNumberOfMessagesPerSecond", 1, MAX_RATE, None)
    broker = ctx.broker
    await broker.call(_check, broker.store, source, destination)
    tasks = tasks_of(broker)
    try:
        task = await broker.call(
            lambda: tasks.start(source, to=destination, rate_per_s=rate, origin="sqs")
        )
    except errors.RedriveBusy:
        raise SqsError(
            "InvalidParameterValue",
            "There is already a task running. Only one active task is allowed for a source "
            "queue arn at a given time.",
        ) from None
    return {"TaskHandle": encode_handle(task.task_id, ctx.queue_arn(source))}


@action("ListMessageMoveTasks")
async def list_message_move_tasks(ctx: Context, params: Params) -> Result:
    source = _arn_param(ctx, params, "SourceArn")
    limit = _int_param(params, "MaxResults", 1, MAX_RESULTS, 1)
    assert limit is not None
    if not await ctx.broker.call(ctx.broker.store.exists, source):
        raise _not_found("SourceArn")
    found = (await ctx.broker.call(tasks_of(ctx.broker).list, source))[:limit]
    return {"Results": [describe(t, ctx) for t in found]}


@action("CancelMessageMoveTask")
async def cancel_message_move_task(ctx: Context, params: Params) -> Result:
    task_id, source = task_of_handle(ctx, params.get("TaskHandle"))
    if not await ctx.broker.call(ctx.broker.store.exists, source):
        raise _not_found("SourceArn")
    tasks = tasks_of(ctx.broker)
    found = [t for t in await ctx.broker.call(tasks.list, source) if t.task_id == task_id]
    if not found or found[0].status_shown != RUNNING:
        # Only a RUNNING task can be cancelled; list results show a handle only for those.
        raise SqsError("ResourceNotFoundException", "Task does not exist.")
    task = await ctx.broker.call(tasks.cancel, source, task_id)
    return {"ApproximateNumberOfMessagesMoved": task.moved}


def failure_reason(failure: str) -> str:
    """What ListMessageMoveTasks says about a FAILED task, in AWS's (query) error codes, from
    the task's failure (`<error class>: <message>`)."""
    kind = failure.split(":", 1)[0]
    if kind == "QueueNotFound":
        return "AWS.SimpleQueueService.NonExistentQueue"
    if kind in ("MessageTooLarge", "InvalidArgument"):
        return "InvalidParameterValue"
    if kind in ("StorageError", "DiskFull", "StorageIOError"):
        return "ServiceUnavailable"
    return "InternalError"
