"""Receiving: ReceiveMessage. A FIFO queue's receive takes as many consecutive messages of a
group as fit, and no other receive gets any of the group while one of them is in flight; a
FIFO receive with a ReceiveRequestAttemptId is answered again, its leases restarted, when it
is retried (receive_attempts.py). Receipt handles are dirmq receipts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from dirmq.errors import InvalidArgument, StaleReceipt
from dirmq.sqs import message_attributes as attrs
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.actions.shared import (
    DEDUP_HEADER,
    GROUP_HEADER,
    MAX_VISIBILITY_S,
    MAX_WAIT_S,
    QueueKind,
    current_message,
    fifo_id,
    integer_param,
    kind_of,
    queue_of,
)
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError
from dirmq.sqs.ids import parse_receipt_handle, sequence_number, sqs_message_id
from dirmq.sqs.md5 import md5_of_attributes, md5_of_body
from dirmq.sqs.receive_attempts import Attempt, ReceiveMemory, memory_for
from dirmq.store import Message, Queue

MAX_RECEIVE = 10
SYSTEM_ATTRIBUTES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "SequenceNumber",
    "MessageDeduplicationId",
    "MessageGroupId",
    "AWSTraceHeader",
    "DeadLetterQueueSourceArn",
)


def _names(params: Params, key: str) -> list[str]:
    value = params.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise SqsError("InvalidParameterValue", f"{key} must be a list of names.")
    return [v for v in value if isinstance(v, str)]


def _system_attributes(
    ctx: Context,
    message: Message,
    kind: QueueKind,
    wanted: set[str],
    memory: ReceiveMemory,
    queue_name: str,
) -> dict[str, str]:
    sent_ms = round(message.published_at_s * 1000)
    first_ms = _first_receive(memory, queue_name, message, sent_ms)  # noted even if not asked
    if not wanted:
        return {}
    everything = "All" in wanted
    values: dict[str, Callable[[], str | None]] = {
        "SenderId": lambda: ctx.account,
        "SentTimestamp": lambda: str(sent_ms),
        "ApproximateReceiveCount": lambda: str(message.receive_count),
        "ApproximateFirstReceiveTimestamp": lambda: str(first_ms),
        "SequenceNumber": lambda: sequence_number(message.id) if kind.fifo else None,
        "MessageDeduplicationId": lambda: _header(message, DEDUP_HEADER) if kind.fifo else None,
        "MessageGroupId": lambda: message.group or _header(message, GROUP_HEADER),
        "AWSTraceHeader": lambda: attrs.trace_header(message.headers),
        "DeadLetterQueueSourceArn": lambda: (
            ctx.queue_arn(message.dead.source) if message.dead is not None else None
        ),
    }
    result: dict[str, str] = {}
    for name in SYSTEM_ATTRIBUTES:
        if everything or name in wanted:
            value = values[name]()
            if value is not None:
                result[name] = value
    return result


def _first_receive(memory: ReceiveMemory, queue: str, message: Message, sent_ms: int) -> int:
    now = round(time.time() * 1000)
    known = memory.first_receive_ms(queue, message.id, message.receive_count, now)
    return known if known >= 0 else sent_ms


def _header(message: Message, name: str) -> str | None:
    lowered = name.lower()
    for key, value in message.headers.items():
        if key.lower() == lowered:
            return value
    return None


def render_message(
    ctx: Context,
    message: Message,
    kind: QueueKind,
    attribute_names: list[str],
    system_names: set[str],
    memory: ReceiveMemory,
    queue_name: str,
) -> Result:
    # Bodies published by the library may be any bytes; SQS bodies are text.
    body = message.body.decode("utf-8", "replace")
    rendered: Result = {
        "MessageId": sqs_message_id(message.id),
        "ReceiptHandle": message.receipt,
        "MD5OfBody": md5_of_body(body),
        "Body": body,
    }
    system = _system_attributes(ctx, message, kind, system_names, memory, queue_name)
    if system:
        rendered["Attributes"] = system
    selected = attrs.select(attrs.of_message(message), attribute_names)
    if selected:
        rendered["MD5OfMessageAttributes"] = md5_of_attributes(attrs.md5_values(selected))
        rendered["MessageAttributes"] = {n: a.to_json() for n, a in selected.items()}
    return rendered


@action("ReceiveMessage")
async def receive_message(ctx: Context, params: Params) -> Result:
    queue = await queue_of(ctx, params)
    kind = kind_of(queue)
    count = integer_param(
        params, "MaxNumberOfMessages", 1, MAX_RECEIVE, "Must be between 1 and 10, if provided."
    )
    visibility = integer_param(
        params,
        "VisibilityTimeout",
        0,
        MAX_VISIBILITY_S,
        f"Must be >= 0 and <= {MAX_VISIBILITY_S}, if provided.",
    )
    wait = integer_param(
        params, "WaitTimeSeconds", 0, MAX_WAIT_S, f"Must be >= 0 and <= {MAX_WAIT_S}, if provided."
    )
    attribute_names = _names(params, "MessageAttributeNames")
    system_names = set(_names(params, "AttributeNames")) | set(
        _names(params, "MessageSystemAttributeNames")
    )
    attempt_id = fifo_id(params.get("ReceiveRequestAttemptId"), "ReceiveRequestAttemptId")
    memory = memory_for(ctx.broker, ctx.broker.store)

    async def receive() -> list[Result]:
        visibility_s = None if visibility is None else float(visibility)
        wait_s = float(kind.wait_default_s if wait is None else wait)
        # FIFO: as many consecutive messages of a group as fit, like AWS.
        got = await ctx.broker.receive(
            queue,
            count or 1,
            visibility_s,
            wait_s,
            max_per_group=None if kind.fifo else 1,
            consumer=ctx.principal,
        )
        return [
            render_message(ctx, m, kind, attribute_names, system_names, memory, queue.name)
            for m in got
        ]

    if not kind.fifo or attempt_id is None:
        messages = await receive()
    else:
        async with memory.lock(queue.name, attempt_id):
            retried = await _retry_or_receive(ctx, queue, memory, attempt_id, visibility)
            if retried is not None:
                messages = retried
            else:
                messages = await receive()
                if messages:
                    receipts = [m["ReceiptHandle"] for m in messages]
                    attempt = Attempt(receipts, messages, attribute_names)
                    await ctx.broker.call(memory.remember, queue.name, attempt_id, attempt)
    return {"Messages": messages} if messages else {}


async def _retry_or_receive(
    ctx: Context, queue: Queue, memory: ReceiveMemory, attempt_id: str, visibility: int | None
) -> list[Result] | None:
    """The answer of an earlier receive with this attempt id, its leases restarted; None when
    there is none (or none of its messages is still in flight under its receipts)."""
    attempt = await ctx.broker.call(memory.attempt, queue.name, attempt_id)
    if attempt is None:
        return None
    visibility_s = float(queue.config.visibility_timeout_s if visibility is None else visibility)
    live: list[tuple[str, Result]] = []
    for receipt, rendered in zip(attempt.receipts, attempt.messages, strict=True):
        try:
            await ctx.broker.call(queue.extend, receipt, visibility_s)
        except (StaleReceipt, InvalidArgument):
            continue  # deleted, or returned to the queue: no longer part of this attempt
        parsed = parse_receipt_handle(receipt)
        current = None if parsed is None else await current_message(ctx, queue, parsed[0])
        if current is None:
            continue  # deleted since the extension
        live.append((receipt, _with_data(rendered, current, attempt.attribute_names)))
    if not live:
        await ctx.broker.call(memory.forget, queue.name, attempt_id)
        return None
    answer = [rendered for _, rendered in live]
    if len(live) < len(attempt.receipts):
        attempt.receipts = [receipt for receipt, _ in live]
        attempt.messages = answer
        await ctx.broker.call(memory.remember, queue.name, attempt_id, attempt)
    return answer


def _with_data(rendered: Result, message: Message, attribute_names: list[str]) -> Result:
    """A remembered answer (kept without the message's data) with its body and message
    attributes read again from `message`, in the order `render_message` gives them."""
    full: Result = {}
    for key, value in rendered.items():
        if key == "MessageAttributes" and attribute_names:
            continue  # (a record of an earlier version kept them, without the names asked)
        full[key] = value
        if key == "MD5OfBody":
            full["Body"] = message.body.decode("utf-8", "replace")
        elif key == "MD5OfMessageAttributes" and attribute_names:
            selected = attrs.select(attrs.of_message(message), attribute_names)
            full["MessageAttributes"] = {n: a.to_json() for n, a in selected.items()}
    return full


__all__ = ["render_message"]
