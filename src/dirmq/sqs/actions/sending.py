"""Sending: SendMessage and SendMessageBatch. Messages are dirmq messages: SQS attributes are
headers (see message_attributes.py), a FIFO queue's MessageGroupId is the store's message group
and its deduplication id the store's dedup id (the headers written besides: shared.py), so what
is sent over SQS can be received with the library or the native API and the other way round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dirmq.errors import InvalidArgument, MessageTooLarge, QueueFull
from dirmq.sqs import message_attributes as attrs
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.actions.shared import (
    DEDUP_HEADER,
    GROUP_HEADER,
    MAX_MESSAGE_BYTES,
    QueueKind,
    batch_entries,
    entry_failure,
    fifo_id,
    integer_param,
    kind_of,
    queue_of,
)
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError
from dirmq.sqs.ids import sequence_number, sqs_message_id
from dirmq.sqs.md5 import md5_of_attributes, md5_of_body
from dirmq.store import OutgoingMessage, Queue
from dirmq.store.codec import MAX_HEADER_BYTES

MAX_DELAY_S = 15 * 60
# Headers besides the codec's own lines: Dirmq-Group (a 128-character group), Dirmq-Slot.
_SYSTEM_HEADER_ALLOWANCE = 512


@dataclass(frozen=True, slots=True)
class Prepared:
    """A validated message, ready to publish, and what to answer once it is."""

    outgoing: OutgoingMessage
    md5_body: str
    md5_attributes: str | None
    md5_system: str | None


def _body(entry: Mapping[str, Any]) -> str:
    body = entry.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    bad = attrs.first_invalid_character(body)
    if bad is not None:
        raise SqsError(
            "InvalidMessageContents",
            f"Invalid binary character '{attrs.describe_character(bad)}' was found in the "
            f"message body, the set of allowed characters is {attrs.ALLOWED_CHARACTERS}",
        )
    return body


def _delay(entry: Mapping[str, Any], kind: QueueKind) -> float | None:
    delay = integer_param(
        entry, "DelaySeconds", 0, MAX_DELAY_S, f"DelaySeconds must be >= 0 and <= {MAX_DELAY_S}."
    )
    if delay is None:
        return None
    if kind.fifo:
        if delay != 0:  # FIFO queues delay only by queue; 0 means "the queue's delay"
            raise SqsError(
                "InvalidParameterValue",
                f"Value {delay} for parameter DelaySeconds is invalid. Reason: The request "
                "include parameter that is not valid for this queue type.",
            )
        return None
    return float(delay)


def entry_size(entry: Mapping[str, Any]) -> int:
    """What an entry counts towards a batch's 1 MiB, as far as it can be told before
    validating it (body and attribute bytes)."""
    body = entry.get("MessageBody")
    size = len(body.encode("utf-8", "surrogatepass")) if isinstance(body, str) else 0
    raw = entry.get("MessageAttributes")
    if isinstance(raw, Mapping):
        for name, spec in raw.items():
            size += len(str(name).encode("utf-8", "surrogatepass"))
            if isinstance(spec, Mapping):
                for key in ("DataType", "StringValue", "BinaryValue"):
                    value = spec.get(key)
                    if isinstance(value, str) and key == "BinaryValue":
                        size += len(value) * 3 // 4
                    elif isinstance(value, str):
                        size += len(value.encode("utf-8", "surrogatepass"))
                    elif isinstance(value, bytes | bytearray):
                        size += len(value)
    return size


def prepare(
    entry: Mapping[str, Any],
    kind: QueueKind,
    queue: Queue,
    *,
    batch: bool = False,
    trace_header: str | None = None,
) -> Prepared:
    """Validate one message of a SendMessage(Batch) as SQS does; SqsError says why not.
    `trace_header` is the request's X-Amzn-Trace-Id, the AWSTraceHeader unless one is given."""
    body = _body(entry)
    attributes = attrs.parse_attributes(entry.get("MessageAttributes"))
    given_trace = attrs.parse_system_attributes(entry.get("MessageSystemAttributes"))
    trace = given_trace if given_trace is not None else attrs.usable_trace_header(trace_header)
    size = len(body.encode("utf-8")) + attrs.total_size(attributes)
    if size > kind.max_message_bytes:
        verb = "cannot be validated" if batch else "are invalid"
        raise SqsError(
            "InvalidParameterValue",
            f"One or more parameters {verb}. Reason: Message must be shorter than "
            f"{kind.max_message_bytes} bytes.",
        )
    delay_s = _delay(entry, kind)
    group = fifo_id(entry.get("MessageGroupId"), "MessageGroupId")
    dedup = fifo_id(entry.get("MessageDeduplicationId"), "MessageDeduplicationId")
    headers = attrs.to_headers(attributes, trace)
    store_group = store_dedup = None
    if kind.fifo:
        if group is None:
            raise SqsError(
                "InvalidParameterValue" if batch else "MissingParameter",
                "The request must contain the parameter MessageGroupId.",
            )
        if dedup is None and kind.content_dedup:
            dedup = hashlib.sha256(body.encode("utf-8")).hexdigest()
        if dedup is None:
            raise SqsError(
                "InvalidParameterValue",
                "The queue should either have ContentBasedDeduplication enabled or "
                "MessageDeduplicationId provided explicitly",
            )
        headers[DEDUP_HEADER] = dedup
        store_group = group
        # Group and dedup ids hold no spaces, so "<group> <dedup id>" is unambiguous.
        store_dedup = (f"{group} {dedup}" if kind.dedup_per_group else dedup) + kind.dedup_epoch
    else:
        if dedup is not None:
            raise SqsError(
                "InvalidParameterValue",
                f"Value {dedup} for parameter MessageDeduplicationId is invalid. Reason: The "
                "request includes a parameter that is not valid for this queue type.",
            )
        if group is not None:
            headers[GROUP_HEADER] = group
    head = sum(len(n) + len(v.encode("utf-8")) + 3 for n, v in headers.items())
    if head + _SYSTEM_HEADER_ALLOWANCE > MAX_HEADER_BYTES:
        raise SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: the message attributes take {head} "
            f"bytes once stored; dirmq keeps at most {MAX_HEADER_BYTES - _SYSTEM_HEADER_ALLOWANCE}"
            " bytes of attributes per message.",
        )
    outgoing = OutgoingMessage(
        body.encode("utf-8"),
        headers,
        delay_s,
        dedup_id=store_dedup,
        group=store_group,
        priority=_priority(attributes.get(PRIORITY_ATTRIBUTE)),
    )
    try:
        queue.validate(outgoing)
    except MessageTooLarge:
        raise SqsError(
            "InvalidParameterValue",
            "One or more parameters are invalid. Reason: Message must be shorter than "
            f"{queue.config.max_message_bytes} bytes.",
        ) from None
    except InvalidArgument as exc:
        raise SqsError("InvalidParameterValue", str(exc)) from None
    values = attrs.md5_values(attributes)
    # Only system attributes of the request are digested (AWS: none for the HTTP header's).
    system = None if given_trace is None else {attrs.TRACE_ATTRIBUTE: ("String", given_trace)}
    return Prepared(
        outgoing,
        md5_of_body(body),
        md5_of_attributes(values),
        None if system is None else md5_of_attributes(system),
    )


# A dirmq extension (docs/sqs.md "Priorities"): a Number message attribute of this name is the
# message's priority in a queue of several priority levels; it is kept and delivered as sent.
PRIORITY_ATTRIBUTE = "DirmqPriority"


def _priority(attribute: attrs.Attribute | None) -> int:
    if attribute is None:
        return 0
    value = attribute.value
    text = value if isinstance(value, str) else ""
    if attribute.base_type != "Number" or not (text.isascii() and text.isdigit()):
        raise SqsError(
            "InvalidParameterValue",
            f"The message attribute '{PRIORITY_ATTRIBUTE}' (a dirmq priority) must be a Number "
            f"from 0 to the queue's priority_levels - 1, got {str(value)[:40]!r}.",
        )
    return int(text)


def _sent(prepared: Prepared, message_id: str, kind: QueueKind) -> Result:
    result: Result = {
        "MessageId": sqs_message_id(message_id),
        "MD5OfMessageBody": prepared.md5_body,
    }
    if prepared.md5_attributes is not None:
        result["MD5OfMessageAttributes"] = prepared.md5_attributes
    if prepared.md5_system is not None:
        result["MD5OfMessageSystemAttributes"] = prepared.md5_system
    if kind.fifo:
        result["SequenceNumber"] = sequence_number(message_id)
    return result


async def _publish(ctx: Context, queue: Queue, messages: list[OutgoingMessage]) -> list[str]:
    try:
        return await ctx.broker.publish(queue, messages, timeout_s=0.0)
    except QueueFull as exc:
        # A dirmq capacity, which SQS queues lack: SDKs back off and retry a throttled request.
        raise SqsError("RequestThrottled", f"The queue is full: {exc}") from None


@action("SendMessage")
async def send_message(ctx: Context, params: Params) -> Result:
    queue = await queue_of(ctx, params)
    kind = kind_of(queue)
    prepared = prepare(params, kind, queue, trace_header=ctx.trace_header)
    (message_id,) = await _publish(ctx, queue, [prepared.outgoing])
    return _sent(prepared, message_id, kind)


@action("SendMessageBatch")
async def send_message_batch(ctx: Context, params: Params) -> Result:
    queue = await queue_of(ctx, params)
    entries = batch_entries(params, "SendMessageBatchRequestEntry")
    kind = kind_of(queue)
    total = sum(entry_size(e) for e in entries)
    if total > MAX_MESSAGE_BYTES:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {MAX_MESSAGE_BYTES} bytes. "
            f"You have sent {total} bytes.",
        )
    if kind.fifo and any(e.get("MessageGroupId") is None for e in entries):
        raise SqsError(
            "InvalidParameterValue", "The request must contain the parameter MessageGroupId."
        )
    if (
        kind.fifo
        and not kind.content_dedup
        and any(e.get("MessageDeduplicationId") is None for e in entries)
    ):
        raise SqsError(
            "InvalidParameterValue",
            "The queue should either have ContentBasedDeduplication enabled or "
            "MessageDeduplicationId provided explicitly",
        )
    failed: list[Result] = []
    good: list[tuple[str, Prepared]] = []
    for entry in entries:
        try:
            prepared = prepare(entry, kind, queue, batch=True, trace_header=ctx.trace_header)
            good.append((entry["Id"], prepared))
        except SqsError as error:
            if error.kind.code == "UnsupportedOperation":
                raise SqsError(
                    "UnsupportedOperation",
                    "Message attribute list values in SendMessageBatch operation are not "
                    "supported.",
                ) from None
            failed.append(entry_failure(entry["Id"], error))
    successful: list[Result] = []
    if good:
        ids = await _publish(ctx, queue, [p.outgoing for _, p in good])
        for (entry_id, prepared), message_id in zip(good, ids, strict=True):
            successful.append({"Id": entry_id, **_sent(prepared, message_id, kind)})
    return {"Successful": successful, "Failed": failed}


__all__ = ["Prepared", "prepare"]
