"""Message actions: SendMessage(Batch), ReceiveMessage, DeleteMessage(Batch),
ChangeMessageVisibility(Batch).

Messages are dirmq messages: SQS attributes are headers (see message_attributes.py), a FIFO
queue's MessageGroupId is the store's message group (delivered in order; a receive takes as
many consecutive messages of a group as fit, and no other receive gets any of the group while
one of them is in flight), its deduplication id the store's dedup id, and receipt handles are
dirmq receipts, so what is sent over SQS can be received with the library or the native API and
the other way round.

Headers written besides the attributes:

    X-Sqs-Message-Deduplication-Id   FIFO: the deduplication id (explicit or content-based)
    X-Sqs-Message-Group-Id           standard queues: MessageGroupId (fair queues; the store's
                                     groups would impose FIFO order, which standard queues lack)

Why it is long: six actions and their batch forms, sharing the parameter checks, the rendering of
attributes and the FIFO receive-attempt replay.
"""

from __future__ import annotations

import functools
import hashlib
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dirmq.errors import (
    InvalidArgument,
    MessageNotFound,
    MessageTooLarge,
    QueueFull,
    StaleReceipt,
)
from dirmq.sqs import attributes as queue_attributes
from dirmq.sqs import message_attributes as attrs
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError
from dirmq.sqs.ids import parse_receipt_handle, sequence_number, sqs_message_id
from dirmq.sqs.md5 import md5_of_attributes, md5_of_body
from dirmq.sqs.receive_attempts import Attempt, ReceiveMemory, memory_for
from dirmq.store import Message, OutgoingMessage, Queue, QueueConfig
from dirmq.store.codec import MAX_HEADER_BYTES

MAX_MESSAGE_BYTES = 1024 * 1024
MAX_BATCH_ENTRIES = 10
MAX_RECEIVE = 10
MAX_VISIBILITY_S = 12 * 60 * 60
MAX_WAIT_S = 20
MAX_DELAY_S = 15 * 60
DEDUP_HEADER = "X-Sqs-Message-Deduplication-Id"
GROUP_HEADER = "X-Sqs-Message-Group-Id"
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
_FIFO_ID_RE = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")
_BATCH_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")
# Headers besides the codec's own lines: Dirmq-Group (a 128-character group), Dirmq-Slot.
_SYSTEM_HEADER_ALLOWANCE = 512


# -- the queue's SQS settings -----------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class QueueKind:
    fifo: bool
    content_dedup: bool
    dedup_per_group: bool  # DeduplicationScope=messageGroup
    max_message_bytes: int
    wait_default_s: int
    # The last PurgeQueue, as a suffix of the store's dedup ids: AWS forgets deduplication ids
    # when a queue is purged, and a new suffix makes the store's older records unreachable.
    dedup_epoch: str


# The last QueueKind computed for each configuration object: a queue keeps its QueueConfig
# until the configuration changes, so a message request usually finds it here.
_KINDS: weakref.WeakKeyDictionary[Queue, tuple[QueueConfig, QueueKind]] = (
    weakref.WeakKeyDictionary()
)


def kind_of(queue: Queue) -> QueueKind:
    config = queue.config
    cached = _KINDS.get(queue)
    if cached is not None and cached[0] is config:
        return cached[1]
    kind = queue_kind(config)
    _KINDS[queue] = (config, kind)
    return kind


def queue_kind(config: QueueConfig) -> QueueKind:
    """What SendMessage and ReceiveMessage need from a queue's attributes."""
    fifo = queue_attributes.is_fifo(config)
    return QueueKind(
        fifo=fifo,
        content_dedup=queue_attributes.content_based_dedup(config),
        dedup_per_group=fifo and queue_attributes.dedup_scope(config) == "messageGroup",
        max_message_bytes=max(1, min(queue_attributes.max_message_size(config), MAX_MESSAGE_BYTES)),
        wait_default_s=min(max(queue_attributes.receive_wait_default(config), 0), MAX_WAIT_S),
        dedup_epoch=_dedup_epoch(config) if fifo else "",
    )


def _dedup_epoch(config: QueueConfig) -> str:
    purged = queue_attributes.sqs_meta(config).get("purged")
    return f" purged:{purged!r}" if isinstance(purged, int | float) else ""


# -- parameters -------------------------------------------------------------------------------
def _integer(params: Mapping[str, Any], name: str, low: int, high: int, reason: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,12}", value.strip()):
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {name} is invalid. Reason: {reason}",
        )
    return value


def _fifo_id(value: object, parameter: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FIFO_ID_RE.fullmatch(value):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {parameter} is invalid. Reason: {parameter} can only "
            "include alphanumeric and punctuation characters. 1 to 128 in length.",
        )
    return value


async def _queue(ctx: Context, params: Params) -> Queue:
    name = ctx.name_from_url(params.get("QueueUrl"))
    # On the event loop, as the native API does: an open queue is cached (at most a stat every
    # 0.5 s), and a thread-pool round trip per message request cost more than the call.
    return ctx.broker.queue(name)


# -- sending ----------------------------------------------------------------------------------
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
    delay = _integer(
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
    group = _fifo_id(entry.get("MessageGroupId"), "MessageGroupId")
    dedup = _fifo_id(entry.get("MessageDeduplicationId"), "MessageDeduplicationId")
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
        body.encode("utf-8"), headers, delay_s, dedup_id=store_dedup, group=store_group
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
    queue = await _queue(ctx, params)
    kind = kind_of(queue)
    prepared = prepare(params, kind, queue, trace_header=ctx.trace_header)
    (message_id,) = await _publish(ctx, queue, [prepared.outgoing])
    return _sent(prepared, message_id, kind)


def _batch_entries(params: Params, entry_name: str) -> list[Mapping[str, Any]]:
    """The Entries of a batch request, checked as a whole as SQS does: 1 to 10 entries whose
    Ids are valid and distinct."""
    entries = params.get("Entries")
    if entries is None:
        raise SqsError("MissingParameter", "The request must contain the parameter Entries.")
    if not isinstance(entries, list) or not entries:
        raise SqsError(
            "EmptyBatchRequest", f"There should be at least one {entry_name} in the request."
        )
    if len(entries) > MAX_BATCH_ENTRIES:
        raise SqsError(
            "TooManyEntriesInBatchRequest",
            f"Maximum number of entries per request are {MAX_BATCH_ENTRIES}. "
            f"You have sent {len(entries)}.",
        )
    seen: set[str] = set()
    for entry in entries:
        entry_id = entry.get("Id") if isinstance(entry, Mapping) else None
        if not isinstance(entry_id, str) or not _BATCH_ID_RE.fullmatch(entry_id):
            raise SqsError(
                "InvalidBatchEntryId",
                "A batch entry id can only contain alphanumeric characters, hyphens and "
                "underscores. It can be at most 80 letters long.",
            )
        if entry_id in seen:
            raise SqsError("BatchEntryIdsNotDistinct", f"Id {entry_id} repeated.")
        seen.add(entry_id)
    return entries


def _failure(entry_id: str, error: SqsError) -> Result:
    return {
        "Id": entry_id,
        "SenderFault": error.kind.sender_fault,
        "Code": error.kind.code,
        "Message": error.message,
    }


@action("SendMessageBatch")
async def send_message_batch(ctx: Context, params: Params) -> Result:
    queue = await _queue(ctx, params)
    entries = _batch_entries(params, "SendMessageBatchRequestEntry")
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
            failed.append(_failure(entry["Id"], error))
    successful: list[Result] = []
    if good:
        ids = await _publish(ctx, queue, [p.outgoing for _, p in good])
        for (entry_id, prepared), message_id in zip(good, ids, strict=True):
            successful.append({"Id": entry_id, **_sent(prepared, message_id, kind)})
    return {"Successful": successful, "Failed": failed}


# -- receiving --------------------------------------------------------------------------------
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
    queue = await _queue(ctx, params)
    kind = kind_of(queue)
    count = _integer(
        params, "MaxNumberOfMessages", 1, MAX_RECEIVE, "Must be between 1 and 10, if provided."
    )
    visibility = _integer(
        params,
        "VisibilityTimeout",
        0,
        MAX_VISIBILITY_S,
        f"Must be >= 0 and <= {MAX_VISIBILITY_S}, if provided.",
    )
    wait = _integer(
        params, "WaitTimeSeconds", 0, MAX_WAIT_S, f"Must be >= 0 and <= {MAX_WAIT_S}, if provided."
    )
    attribute_names = _names(params, "MessageAttributeNames")
    system_names = set(_names(params, "AttributeNames")) | set(
        _names(params, "MessageSystemAttributeNames")
    )
    attempt_id = _fifo_id(params.get("ReceiveRequestAttemptId"), "ReceiveRequestAttemptId")
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
        current = None if parsed is None else await _current(ctx, queue, parsed[0])
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


# -- settling ----------------------------------------------------------------------------------
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


async def _current(ctx: Context, queue: Queue, message_id: str) -> Message | None:
    """The message as it is now (any state but dead-lettered), or None if it is gone."""
    try:
        message = await ctx.broker.call(queue.peek, message_id)
    except MessageNotFound:
        return None
    return None if message.state == "dead" else message


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
        current = await _current(ctx, queue, message_id)
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
    current = await _current(ctx, queue, message_id)
    if current is None:
        return
    if kind.fifo:
        raise _expired(handle)
    await ctx.broker.call(queue.delete, message_id)


@action("DeleteMessage")
async def delete_message(ctx: Context, params: Params) -> Result:
    queue = await _queue(ctx, params)
    await delete_one(ctx, queue, kind_of(queue), params.get("ReceiptHandle"))
    return {}


@action("DeleteMessageBatch")
async def delete_message_batch(ctx: Context, params: Params) -> Result:
    """Each entry checked as DeleteMessage checks it, then every valid handle acked at once
    (`Broker.ack_many`: one store call); an old handle is then settled as DeleteMessage
    settles it."""
    queue = await _queue(ctx, params)
    entries = _batch_entries(params, "DeleteMessageBatchRequestEntry")
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
            failed.append(_failure(entry["Id"], error))
    return {"Successful": successful, "Failed": failed}


def _visibility(params: Mapping[str, Any]) -> int:
    value = _integer(
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
        current = await _current(ctx, queue, message_id)
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
    current = await _current(ctx, queue, message_id)
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
    queue = await _queue(ctx, params)
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
    queue = await _queue(ctx, params)
    entries = _batch_entries(params, "ChangeMessageVisibilityBatchRequestEntry")
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


__all__ = ["Prepared", "QueueKind", "prepare", "queue_kind", "render_message"]
