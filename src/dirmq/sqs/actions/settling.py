"""Settling receipts: DeleteMessage(Batch) and ChangeMessageVisibility(Batch), each batch
settled in one store call per kind of settlement, an old handle then treated as SQS treats it.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dirmq.errors import StaleReceipt
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.actions.shared import (
    MAX_VISIBILITY_S,
    QueueKind,
    batch_entries,
    current_message,
    entry_failure,
    integer_param,
    kind_of,
    queue_of,
)
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError
from dirmq.sqs.ids import parse_receipt_handle
from dirmq.store import Message, Queue


def _receipt(handle: object) -> tuple[str, str, int]:
    parsed = parse_receipt_handle(handle)
    if parsed is None:
        if not isinstance(handle, str) or not handle:
            raise SqsError(
                "MissingParameter", "The request must contain the parameter ReceiptHandle."
            )
        raise SqsError(
            "ReceiptHandleIsInvalid",
            f'The input receipt handle "{handle}" is not a valid receipt handle.',
        )
    assert isinstance(handle, str)
    return handle, parsed[0], parsed[1]


def _lease_over(current: Message, count: int) -> bool:
    """Whether the lease of receive `count` has passed its deadline. The store still settles
    such a lease until the message is received again; AWS refuses a FIFO receipt at once."""
    return (
        current.state == "leased"
        and current.receive_count == count
        and current.lease_deadline_s is not None
        and current.lease_deadline_s <= time.time()
    )


def _expired(handle: str) -> SqsError:
    return SqsError(
        "InvalidParameterValue",
        f"Value {handle} for parameter ReceiptHandle is invalid. Reason: The receipt handle has "
        "expired.",
    )


async def delete_one(ctx: Context, queue: Queue, kind: QueueKind, raw_handle: object) -> None:
    handle, message_id, count = _receipt(raw_handle)
    if not await _deletable(ctx, queue, kind, handle, message_id, count):
        return
    try:
        await ctx.broker.ack(queue, handle)  # the broker counts it
        return
    except StaleReceipt:
        pass
    await _delete_by_old_handle(ctx, queue, kind, handle, message_id)


async def _deletable(
    ctx: Context, queue: Queue, kind: QueueKind, handle: str, message_id: str, count: int
) -> bool:
    """Whether the handle is to be acked: on a FIFO queue not if the message is gone (a
    success), and an expired lease is refused (SqsError)."""
    if kind.fifo:
        current = await current_message(ctx, queue, message_id)
        if current is None:
            return False
        if _lease_over(current, count):
            raise _expired(handle)
    return True


async def _delete_by_old_handle(
    ctx: Context, queue: Queue, kind: QueueKind, handle: str, message_id: str
) -> None:
    """An old receipt. SQS: deleting a deleted message succeeds; on a standard queue an old
    handle still deletes the message; on a FIFO queue it has expired."""
    current = await current_message(ctx, queue, message_id)
    if current is None:
        return
    if kind.fifo:
        raise _expired(handle)
    await ctx.broker.call(queue.delete, message_id)


@action("DeleteMessage")
async def delete_message(ctx: Context, params: Params) -> Result:
    queue = await queue_of(ctx, params)
    await delete_one(ctx, queue, kind_of(queue), params.get("ReceiptHandle"))
    return {}


@action("DeleteMessageBatch")
async def delete_message_batch(ctx: Context, params: Params) -> Result:
    """Each entry checked as DeleteMessage checks it, then every valid handle acked at once
    (`Broker.ack_many`: one store call); an old handle is then settled as DeleteMessage
    settles it."""
    queue = await queue_of(ctx, params)
    entries = batch_entries(params, "DeleteMessageBatchRequestEntry")
    kind = kind_of(queue)
    outcomes: dict[str, SqsError | None] = {}  # by entry Id; None: deleted
    to_ack: list[tuple[str, str, str]] = []  # entry Id, handle, message id
    for entry in entries:
        try:
            handle, message_id, count = _receipt(entry.get("ReceiptHandle"))
            if await _deletable(ctx, queue, kind, handle, message_id, count):
                to_ack.append((entry["Id"], handle, message_id))
            else:
                outcomes[entry["Id"]] = None
        except SqsError as error:
            outcomes[entry["Id"]] = error
    failures = await ctx.broker.ack_many(queue, [handle for _, handle, _ in to_ack])
    await _settle_stale(
        to_ack,
        failures,
        outcomes,
        lambda handle, message_id: _delete_by_old_handle(ctx, queue, kind, handle, message_id),
    )
    return _batch_result(entries, outcomes)


async def _settle_stale(
    settled: list[tuple[str, str, str]],
    failures: Mapping[str, Exception],
    outcomes: dict[str, SqsError | None],
    by_old_handle: Callable[[str, str], Awaitable[None]],
) -> None:
    """The outcome of each (entry Id, handle, message id) a batch settled in one store call:
    done, or (a StaleReceipt) settled as the single action settles an old handle. Any other
    failure is raised, as the single action raises it: the store failed, not the entry."""
    for entry_id, handle, message_id in settled:
        failure = failures.get(handle)
        outcomes[entry_id] = None
        if failure is None:
            continue
        if not isinstance(failure, StaleReceipt):
            raise failure
        try:
            await by_old_handle(handle, message_id)
        except SqsError as error:
            outcomes[entry_id] = error


def _batch_result(
    entries: list[Mapping[str, Any]], outcomes: Mapping[str, SqsError | None]
) -> Result:
    """Successful and Failed, each in the order of the entries."""
    successful: list[Result] = []
    failed: list[Result] = []
    for entry in entries:
        error = outcomes[entry["Id"]]
        if error is None:
            successful.append({"Id": entry["Id"]})
        else:
            failed.append(entry_failure(entry["Id"], error))
    return {"Successful": successful, "Failed": failed}


def _visibility(params: Mapping[str, Any]) -> int:
    value = integer_param(
        params,
        "VisibilityTimeout",
        0,
        MAX_VISIBILITY_S,
        f"Must be >= 0 and <= {MAX_VISIBILITY_S}, if provided.",
    )
    if value is None:
        raise SqsError(
            "MissingParameter", "The request must contain the parameter VisibilityTimeout."
        )
    return value


async def change_visibility_one(
    ctx: Context, queue: Queue, kind: QueueKind, raw_handle: object, visibility: int
) -> None:
    handle, message_id, count = _receipt(raw_handle)
    await _check_lease(ctx, queue, kind, handle, message_id, count)
    try:
        await _apply_visibility(ctx, queue, handle, visibility)
        return
    except StaleReceipt:
        pass
    await _change_by_old_handle(ctx, queue, kind, handle, message_id, visibility)


async def _check_lease(
    ctx: Context, queue: Queue, kind: QueueKind, handle: str, message_id: str, count: int
) -> None:
    """On a FIFO queue a lease past its deadline is refused at once, as AWS does."""
    if kind.fifo:
        current = await current_message(ctx, queue, message_id)
        if current is not None and _lease_over(current, count):
            raise _expired(handle)


async def _apply_visibility(ctx: Context, queue: Queue, receipt: str, visibility: int) -> None:
    if visibility == 0:
        await ctx.broker.nack(queue, receipt)  # visible again now (or dead-lettered)
    else:
        await ctx.broker.call(queue.extend, receipt, float(visibility))


async def _change_by_old_handle(
    ctx: Context, queue: Queue, kind: QueueKind, handle: str, message_id: str, visibility: int
) -> None:
    """A handle whose lease is gone: what SQS does with it (see the cases below)."""
    current = await current_message(ctx, queue, message_id)
    if current is None:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not "
            "exist or is not available for visibility timeout change.",
        )
    if kind.fifo:
        raise _expired(handle)
    if current.state == "leased":
        # Received again since: SQS applies an old handle of a standard queue to the message
        # as it is now.
        try:
            await _apply_visibility(ctx, queue, f"{message_id}.{current.receive_count}", visibility)
            return
        except StaleReceipt:
            pass
    elif current.state == "ready" and visibility == 0:
        return  # already visible
    raise SqsError(
        "MessageNotInflight",
        f"The message referred to by receipt handle {handle} is not in flight.",
    )


@action("ChangeMessageVisibility")
async def change_message_visibility(ctx: Context, params: Params) -> Result:
    queue = await queue_of(ctx, params)
    kind = kind_of(queue)
    handle = params.get("ReceiptHandle")
    _receipt(handle)  # an invalid handle is reported before an invalid timeout
    await change_visibility_one(ctx, queue, kind, handle, _visibility(params))
    return {}


@action("ChangeMessageVisibilityBatch")
async def change_message_visibility_batch(ctx: Context, params: Params) -> Result:
    """Each entry checked as ChangeMessageVisibility checks it, then the valid handles settled
    together, one store call per timeout asked for (`Broker.extend_many`; a timeout of 0 is
    `nack_many`); an old handle is then settled as ChangeMessageVisibility settles it."""
    queue = await queue_of(ctx, params)
    entries = batch_entries(params, "ChangeMessageVisibilityBatchRequestEntry")
    kind = kind_of(queue)
    outcomes: dict[str, SqsError | None] = {}  # by entry Id; None: changed
    by_visibility: dict[int, list[tuple[str, str, str]]] = {}  # entry Id, handle, message id
    for entry in entries:
        try:
            handle, message_id, count = _receipt(entry.get("ReceiptHandle"))
            visibility = _visibility(entry)
            await _check_lease(ctx, queue, kind, handle, message_id, count)
        except SqsError as error:
            outcomes[entry["Id"]] = error
            continue
        by_visibility.setdefault(visibility, []).append((entry["Id"], handle, message_id))
    for visibility, settling in by_visibility.items():
        handles = [handle for _, handle, _ in settling]
        if visibility == 0:
            failures = await ctx.broker.nack_many(queue, handles)
        else:
            failures = await ctx.broker.extend_many(queue, handles, float(visibility))
        await _settle_stale(
            settling,
            failures,
            outcomes,
            functools.partial(_change_by_old_handle, ctx, queue, kind, visibility=visibility),
        )
    return _batch_result(entries, outcomes)
