"""Dead-letter queue redrive: StartMessageMoveTask, ListMessageMoveTasks, CancelMessageMoveTask.

A move task takes the messages out of a dead-letter queue (the task's *source*, SourceArn) and
puts them into DestinationArn or, without one, back into the queue whose redrive policy names
that dead-letter queue. It runs as an asyncio task in the server process that started it:

- Each step leases a batch from the DLQ, publishes the same bodies, headers and message groups
  to the destination (one group commit, durable at the destination's level), and only then
  acknowledges the batch in the DLQ. A crash between the two steps leaves the message in both
  queues, never in neither; the copy in the DLQ comes back when its lease expires. Each moved
  message is published with the deduplication id `dirmq-move <DLQ message id>` (a space: no
  SQS MessageDeduplicationId can look like that), so moving it again within the destination's
  dedup window (5 minutes by default) stores nothing twice. Moved messages are new messages
  (new ids, receive count 0, the destination's delay), as AWS describes redriven messages.
- The task moves at most the number of messages that were visible in the DLQ when it started
  (ApproximateNumberOfMessagesToMove), fewer if the DLQ runs dry first, so messages that die
  again during the redrive are not redriven forever.
- MaxNumberOfMessagesPerSecond (1-500) paces it; without it, batches of 100 as fast as the disk
  allows. CancelMessageMoveTask stops it after the batch in progress (CANCELLING, then
  CANCELLED); what was moved stays moved.
- A destination that disappears, or refuses a message (too large for it), fails the task
  (FAILED, FailureReason in AWS's words); the batch in hand goes back to the DLQ.

Without DestinationArn, AWS returns each message to the queue it originally came from. dirmq's
dead-lettering does not record that origin, so when several queues name the DLQ in their redrive
policy, StartMessageMoveTask refuses (InvalidParameterValue) and asks for a DestinationArn; with
exactly one such queue, that queue is the destination.

Task state is kept in files under the root (`move_task_files.py`), so every worker and process
serving it sees the same tasks: ListMessageMoveTasks and CancelMessageMoveTask work from any of
them, "one active task per source queue" holds across them, and a task whose process died
(SIGKILL, a restart) is resumed by the next process that starts, lists or looks at that
source's tasks, from the count it had recorded (a batch in flight at the crash is back in the
DLQ within LEASE_S, or in both queues, as above).

Why it is long: the four move-task actions and the task runner they start (batches, rate,
cancellation, the hold that makes one process its runner), one protocol whose states all of them
read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any

from dirmq import errors
from dirmq.server.broker import Broker
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.context import Context, valid_sqs_name
from dirmq.sqs.errors import SqsError
from dirmq.sqs.move_task_files import TaskFiles
from dirmq.store import Message, OutgoingMessage, Queue, Store
from dirmq.wire import jsondoc

log = logging.getLogger("dirmq.sqs")

RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
CANCELLING = "CANCELLING"
CANCELLED = "CANCELLED"
FAILED = "FAILED"
ACTIVE = (RUNNING, CANCELLING)
BATCH = 100  # messages per step without a rate
MAX_RATE = 500
MAX_RESULTS = 10
LEASE_S = 60.0  # how long a batch stays invisible in the DLQ while it is being moved
FULL_RETRY_S = 1.0  # destination at capacity: try again after this
DEDUP_PREFIX = "dirmq-move "
CANCEL_POLL_S = 0.25
RENEW_EVERY_S = 5.0  # the runner's hold, between batches (move_task_files.HOLD_TIMEOUT_S)


@dataclass(slots=True, eq=False)
class MoveTask:
    task_id: str
    source: str  # the dead-letter queue
    source_arn: str
    destination: str
    destination_arn: str | None  # as requested (None: the DLQ's source queue)
    rate: int | None
    to_move: int
    started_ms: int
    status: str = RUNNING
    moved: int = 0
    failure: str | None = None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None
    cancel_requested: bool = False  # by any process (a `.cancel` file), as last read
    taken_over: bool = False  # its hold lapsed and another process runs it now

    def record(self) -> dict[str, object]:
        """What the task's file holds."""
        return {
            "task_id": self.task_id,
            "source": self.source,
            "source_arn": self.source_arn,
            "destination": self.destination,
            "destination_arn": self.destination_arn,
            "rate": self.rate,
            "to_move": self.to_move,
            "started_ms": self.started_ms,
            "status": self.status,
            "moved": self.moved,
            "failure": self.failure,
        }

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> MoveTask:
        return cls(
            task_id=str(data["task_id"]),
            source=str(data["source"]),
            source_arn=str(data["source_arn"]),
            destination=str(data["destination"]),
            destination_arn=data.get("destination_arn"),
            rate=data.get("rate"),
            to_move=int(data["to_move"]),
            started_ms=int(data["started_ms"]),
            status=str(data["status"]),
            moved=int(data.get("moved", 0)),
            failure=data.get("failure"),
        )

    @property
    def handle(self) -> str:
        return encode_handle(self.task_id, self.source_arn)

    def describe(self) -> Result:
        entry: Result = {}
        status = CANCELLING if self.status == RUNNING and self.cancel_requested else self.status
        if status == RUNNING:
            entry["TaskHandle"] = self.handle
        entry["Status"] = status
        entry["SourceArn"] = self.source_arn
        if self.destination_arn is not None:
            entry["DestinationArn"] = self.destination_arn
        if self.rate is not None:
            entry["MaxNumberOfMessagesPerSecond"] = self.rate
        entry["ApproximateNumberOfMessagesMoved"] = self.moved
        entry["ApproximateNumberOfMessagesToMove"] = self.to_move
        if self.status == FAILED and self.failure:
            entry["FailureReason"] = self.failure
        entry["StartedTimestamp"] = self.started_ms
        return entry


class MoveTasks:
    """The move tasks of one root as this process sees them: the files (every process's tasks)
    and the runners of the tasks this process owns."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.files = TaskFiles(broker.store.root, access=broker.store.access)
        self.running: dict[str, MoveTask] = {}  # task id -> the task this process runs

    async def list(self, source: str) -> list[MoveTask]:
        """Every remembered task of `source`, newest first, after resuming orphans."""
        records = await self.broker.call(self.files.load, source)
        shown = []
        for record, cancel_requested in records:
            task = MoveTask.from_record(record)
            task.cancel_requested = cancel_requested
            mine = self.running.get(task.task_id)
            if mine is not None:
                mine.cancel_requested = mine.cancel_requested or task.cancel_requested
                shown.append(mine)
                continue
            if task.status in ACTIVE:
                owner = await self.broker.call(self.files.try_own, task)
                if owner:  # its process is gone: carry on from its record
                    log.info("resuming move task %s from %s", task.task_id, task.source)
                    self.start(task)
            shown.append(task)
        return shown

    def start(self, task: MoveTask) -> None:
        """Run `task`, whose hold this process has."""
        self.running[task.task_id] = task
        task.runner = asyncio.get_running_loop().create_task(self._run(task))

    async def _run(self, task: MoveTask) -> None:
        try:
            await run(self.broker, task, self.files)
        finally:
            self.running.pop(task.task_id, None)
            with contextlib.suppress(OSError):
                await self.broker.call(self.files.finish, task)

    async def resume_all(self) -> None:
        """At start-up: resume the tasks whose process died (a crash, a restart)."""
        for source in await self.broker.call(self.files.sources):
            with contextlib.suppress(errors.DirmqError, OSError):
                await self.list(source)


_REGISTRY: weakref.WeakKeyDictionary[Broker, MoveTasks] = weakref.WeakKeyDictionary()


def tasks_of(broker: Broker) -> MoveTasks:
    tasks = _REGISTRY.get(broker)
    if tasks is None:
        tasks = _REGISTRY[broker] = MoveTasks(broker)
    return tasks


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


@dataclass(frozen=True, slots=True)
class _Plan:
    destination: str
    to_move: int


def _plan(store: Store, source: str, destination: str | None) -> _Plan:
    """Checks against the store (run on the broker's thread pool)."""
    if not store.exists(source):
        raise _not_found("SourceArn")
    sources = dead_letter_sources(store, source)
    if not sources:
        raise SqsError(
            "InvalidParameterValue", "Source queue must be configured as a Dead Letter Queue."
        )
    if destination is None:
        if len(sources) > 1:
            raise SqsError(
                "InvalidParameterValue",
                f"Source queue is the dead-letter queue of several queues ({', '.join(sources)})"
                " and dirmq does not record which one each message came from: give a "
                "DestinationArn.",
            )
        destination = sources[0]
    elif not store.exists(destination):
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
    return _Plan(destination, store.queue(source).stats().ready)


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
    plan = await broker.call(_plan, broker.store, source, destination)
    tasks = tasks_of(broker)
    await tasks.list(source)  # resumes an orphan, which then counts as the active task
    task = MoveTask(
        task_id=str(uuid.uuid4()),
        source=source,
        source_arn=ctx.queue_arn(source),
        destination=plan.destination,
        destination_arn=None if destination is None else ctx.queue_arn(destination),
        rate=rate,
        to_move=plan.to_move,
        started_ms=int(time.time() * 1000),
    )
    if not await broker.call(tasks.files.create, task):
        raise SqsError(
            "InvalidParameterValue",
            "There is already a task running. Only one active task is allowed for a source "
            "queue arn at a given time.",
        )
    tasks.start(task)
    return {"TaskHandle": task.handle}


@action("ListMessageMoveTasks")
async def list_message_move_tasks(ctx: Context, params: Params) -> Result:
    source = _arn_param(ctx, params, "SourceArn")
    limit = _int_param(params, "MaxResults", 1, MAX_RESULTS, 1)
    assert limit is not None
    if not await ctx.broker.call(ctx.broker.store.exists, source):
        raise _not_found("SourceArn")
    found = (await tasks_of(ctx.broker).list(source))[:limit]
    return {"Results": [t.describe() for t in found]}


@action("CancelMessageMoveTask")
async def cancel_message_move_task(ctx: Context, params: Params) -> Result:
    task_id, source = task_of_handle(ctx, params.get("TaskHandle"))
    if not await ctx.broker.call(ctx.broker.store.exists, source):
        raise _not_found("SourceArn")
    tasks = tasks_of(ctx.broker)
    task = next((t for t in await tasks.list(source) if t.task_id == task_id), None)
    if task is None or task.status != RUNNING or task.cancel_requested:
        # Only a RUNNING task can be cancelled; list results show a handle only for those.
        raise SqsError("ResourceNotFoundException", "Task does not exist.")
    await ctx.broker.call(tasks.files.request_cancel, task)
    task.cancel_requested = True
    task.cancel.set()  # a no-op unless this process runs it (others see the file)
    return {"ApproximateNumberOfMessagesMoved": task.moved}


# -- the mover -----------------------------------------------------------------------------------


async def run(broker: Broker, task: MoveTask, files: TaskFiles) -> None:
    """Move messages until done, cancelled or failed; always leaves a final status (in the
    task's file: `files.finish` after this)."""
    watcher = asyncio.get_running_loop().create_task(_watch_cancel(broker, task, files))
    try:
        source = await broker.call(broker.queue, task.source)
        destination = await broker.call(broker.queue, task.destination)
        await _move(broker, task, source, destination, files)
    except Exception as exc:
        task.failure = failure_reason(exc)
        task.status = FAILED
        log.warning(
            "move task %s from %s to %s failed: %s",
            task.task_id,
            task.source,
            task.destination,
            exc,
        )
        return
    finally:
        watcher.cancel()
    if task.taken_over:
        log.warning(
            "move task %s from %s: another process took it over (this one stalled past its "
            "hold's timeout); stopped",
            task.task_id,
            task.source,
        )
        return
    task.status = CANCELLED if task.cancel.is_set() else COMPLETED


async def _watch_cancel(broker: Broker, task: MoveTask, files: TaskFiles) -> None:
    """Another process cancels by a file: look for it a few times a second. Renew the hold
    meanwhile (a batch may wait long for its rate or a full destination)."""
    loop = asyncio.get_running_loop()
    renewed = loop.time()
    while not task.cancel.is_set():
        await asyncio.sleep(CANCEL_POLL_S)
        with contextlib.suppress(OSError):
            if loop.time() - renewed >= RENEW_EVERY_S:
                renewed = loop.time()
                if not await broker.call(files.renew, task):
                    task.taken_over = True
                    task.cancel.set()  # stops the mover at its next step
                    return
            if await broker.call(files.cancel_requested, task):
                task.cancel_requested = True
                task.cancel.set()


async def _move(
    broker: Broker, task: MoveTask, source: Queue, destination: Queue, files: TaskFiles
) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while task.moved < task.to_move and not task.cancel.is_set():
        want = min(BATCH, task.to_move - task.moved)
        if task.rate is not None:
            want = min(want, task.rate)
            delay = started + task.moved / task.rate - loop.time()
            if delay > 0 and await _cancelled_within(task, delay):
                return
        if not await broker.call(files.renew, task):
            task.taken_over = True
            return
        # One consumer: a group's consecutive messages move together, in their order.
        got = await broker.call(source.get, want, visibility_s=LEASE_S, max_per_group=None)
        if not got:
            return  # the DLQ ran dry before the count taken at the start
        try:
            await broker.publish(destination, [_copy(m) for m in got], timeout_s=0.0)
        except errors.QueueFull:
            await _give_back(broker, source, got)
            if await _cancelled_within(task, FULL_RETRY_S):
                return
            continue
        except Exception:
            await _give_back(broker, source, got)
            raise
        # (Cancelled by the server's shutdown: the batch's leases expire and it is back in the
        # DLQ within LEASE_S, and in the destination too if the publish got through.)
        # Stored in the destination: now they may leave the DLQ. A receipt that went stale
        # meanwhile (lease expired, someone else took it) is that consumer's copy now.
        await broker.call(source.ack_many, [m.receipt or "" for m in got])
        task.moved += len(got)
        if not await broker.call(files.save, task):  # a process resuming it starts from here
            task.taken_over = True
            return


def _copy(message: Message) -> OutgoingMessage:
    return OutgoingMessage(
        body=message.body,
        headers=message.headers,
        group=message.group,
        dedup_id=DEDUP_PREFIX + message.id,
    )


async def _cancelled_within(task: MoveTask, seconds: float) -> bool:
    """Wait `seconds` unless the task is cancelled first; True if it was."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(task.cancel.wait(), seconds)
    return task.cancel.is_set()


async def _give_back(broker: Broker, queue: Queue, messages: list[Message]) -> None:
    for message in messages:
        with contextlib.suppress(errors.DirmqError):
            await broker.call(queue.nack, message.receipt or "")


def failure_reason(exc: BaseException) -> str:
    """What ListMessageMoveTasks says about a FAILED task, in AWS's (query) error codes."""
    if isinstance(exc, errors.QueueNotFound):
        return "AWS.SimpleQueueService.NonExistentQueue"
    if isinstance(exc, errors.MessageTooLarge | errors.InvalidArgument):
        return "InvalidParameterValue"
    if isinstance(exc, errors.StorageError):
        return "ServiceUnavailable"
    return "InternalError"
