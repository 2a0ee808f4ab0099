"""What the message actions share (sending.py, receiving.py, settling.py): SQS's limits, the
queue's SQS settings (`QueueKind`), the parameter checks, a batch's entries and a batch entry's
failure, and the message a receipt names as it is now.

Headers written besides the attributes:

    X-Sqs-Message-Deduplication-Id   FIFO: the deduplication id (explicit or content-based)
    X-Sqs-Message-Group-Id           standard queues: MessageGroupId (fair queues; the store's
                                     groups would impose FIFO order, which standard queues lack)
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dirmq.errors import MessageNotFound
from dirmq.sqs import attributes as queue_attributes
from dirmq.sqs.actions.registry import Params, Result
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError
from dirmq.store import Message, Queue, QueueConfig

MAX_MESSAGE_BYTES = 1024 * 1024
MAX_BATCH_ENTRIES = 10
MAX_VISIBILITY_S = 12 * 60 * 60
MAX_WAIT_S = 20
DEDUP_HEADER = "X-Sqs-Message-Deduplication-Id"
GROUP_HEADER = "X-Sqs-Message-Group-Id"
_FIFO_ID_RE = re.compile(r"[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}")
_BATCH_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,80}")


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
def integer_param(
    params: Mapping[str, Any], name: str, low: int, high: int, reason: str
) -> int | None:
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


def fifo_id(value: object, parameter: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _FIFO_ID_RE.fullmatch(value):
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {parameter} is invalid. Reason: {parameter} can only "
            "include alphanumeric and punctuation characters. 1 to 128 in length.",
        )
    return value


async def queue_of(ctx: Context, params: Params) -> Queue:
    name = ctx.name_from_url(params.get("QueueUrl"))
    # On the event loop, as the native API does: an open queue is cached (at most a stat every
    # 0.5 s), and a thread-pool round trip per message request cost more than the call.
    return ctx.broker.queue(name)


# -- batches ----------------------------------------------------------------------------------
def batch_entries(params: Params, entry_name: str) -> list[Mapping[str, Any]]:
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


def entry_failure(entry_id: str, error: SqsError) -> Result:
    return {
        "Id": entry_id,
        "SenderFault": error.kind.sender_fault,
        "Code": error.kind.code,
        "Message": error.message,
    }


# -- the message a receipt names ---------------------------------------------------------------
async def current_message(ctx: Context, queue: Queue, message_id: str) -> Message | None:
    """The message as it is now (any state but dead-lettered), or None if it is gone."""
    try:
        message = await ctx.broker.call(queue.peek, message_id)
    except MessageNotFound:
        return None
    return None if message.state == "dead" else message


__all__ = [
    "DEDUP_HEADER",
    "GROUP_HEADER",
    "MAX_BATCH_ENTRIES",
    "MAX_MESSAGE_BYTES",
    "MAX_VISIBILITY_S",
    "MAX_WAIT_S",
    "QueueKind",
    "batch_entries",
    "current_message",
    "entry_failure",
    "fifo_id",
    "integer_param",
    "kind_of",
    "queue_kind",
    "queue_of",
]
