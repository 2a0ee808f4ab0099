"""The SQS view of a dirmq queue: queue attributes to and from `QueueConfig`.

`QueueConfig` stays the single source of truth. Attributes the store enforces map onto its
settings; the others are SQS's business and live in `config.metadata["sqs"]`:

    VisibilityTimeout              visibility_timeout_s
    DelaySeconds                   delay_s
    MessageRetentionPeriod         retention_s (a queue without retention reports 1209600)
    MaximumMessageSize             max_message_bytes (reported at most 1048576, SQS's limit)
    RedrivePolicy                  dead_letter_queue + max_receives
    everything else                metadata["sqs"]["attributes"], as strings

metadata["sqs"] also keeps the queue's tags, its creation and modification times (seconds) and
when it was last purged. A queue made by the native API or the library has no SQS metadata and
reads as a standard queue with SQS's defaults for what it does not say.

The helpers at the top (`is_fifo`, `content_based_dedup`, ...) are what the message actions read.

Why it is long: one entry per SQS queue attribute (its check, its mapping onto QueueConfig, its
default): a table that is only useful whole.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dirmq.sqs.errors import SqsError, invalid_value
from dirmq.store import QueueConfig
from dirmq.wire import jsondoc

META_KEY = "sqs"
MAX_MESSAGE_SIZE = 1_048_576  # AWS's limit and default
DEFAULT_RETENTION_S = 345_600  # 4 days
MAX_RETENTION_S = 1_209_600  # 14 days
DEFAULT_VISIBILITY_S = 30
DEFAULT_KMS_REUSE_S = "300"
MAX_MAX_RECEIVE_COUNT = 1000
MAX_SOURCE_QUEUE_ARNS = 10

# What a queue created through SQS starts with, in the store's terms.
SQS_DEFAULT_CONFIG = {
    "visibility_timeout_s": float(DEFAULT_VISIBILITY_S),
    "delay_s": 0.0,
    "retention_s": float(DEFAULT_RETENTION_S),
    "max_message_bytes": MAX_MESSAGE_SIZE,
    "dedup_window_s": 300.0,  # SQS's 5-minute deduplication interval
}

# Integer attributes and their valid ranges.
RANGES = {
    "DelaySeconds": (0, 900),
    "MaximumMessageSize": (1024, MAX_MESSAGE_SIZE),
    "MessageRetentionPeriod": (60, MAX_RETENTION_S),
    "ReceiveMessageWaitTimeSeconds": (0, 20),
    "VisibilityTimeout": (0, 43_200),
    "KmsDataKeyReusePeriodSeconds": (60, 86_400),
}
BOOLEANS = ("FifoQueue", "ContentBasedDeduplication", "SqsManagedSseEnabled")
CHOICES = {
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
SETTABLE = (
    "DelaySeconds",
    "MaximumMessageSize",
    "MessageRetentionPeriod",
    "Policy",
    "ReceiveMessageWaitTimeSeconds",
    "VisibilityTimeout",
    "RedrivePolicy",
    "RedriveAllowPolicy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    "FifoQueue",
    "ContentBasedDeduplication",
    "DeduplicationScope",
    "FifoThroughputLimit",
)
COUNTERS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)
READ_ONLY = ("QueueArn", *COUNTERS, "CreatedTimestamp", "LastModifiedTimestamp")
NAMES = frozenset(("All", *SETTABLE, *READ_ONLY))  # every name GetQueueAttributes accepts
FIFO_ONLY = ("FifoQueue", "ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
STORED = (  # attributes kept in metadata (the rest map onto the store's settings)
    "Policy",
    "ReceiveMessageWaitTimeSeconds",
    "RedriveAllowPolicy",
    "KmsMasterKeyId",
    "KmsDataKeyReusePeriodSeconds",
    "SqsManagedSseEnabled",
    *FIFO_ONLY,
)


# -- reading a queue's SQS settings (also for the message actions) -------------------------------
def sqs_meta(config: QueueConfig) -> dict[str, Any]:
    meta = config.metadata.get(META_KEY)
    return meta if isinstance(meta, dict) else {}


def stored_attributes(config: QueueConfig) -> dict[str, str]:
    stored = sqs_meta(config).get("attributes")
    return (
        {k: v for k, v in stored.items() if isinstance(v, str)} if isinstance(stored, dict) else {}
    )


def is_fifo(config: QueueConfig) -> bool:
    return stored_attributes(config).get("FifoQueue") == "true"


def content_based_dedup(config: QueueConfig) -> bool:
    return is_fifo(config) and stored_attributes(config).get("ContentBasedDeduplication") == "true"


def dedup_scope(config: QueueConfig) -> str:
    """ "queue" or "messageGroup" (FIFO queues)."""
    return stored_attributes(config).get("DeduplicationScope", "queue")


def throughput_limit(config: QueueConfig) -> str:
    """ "perQueue" or "perMessageGroupId" (FIFO queues)."""
    return stored_attributes(config).get("FifoThroughputLimit", "perQueue")


def receive_wait_default(config: QueueConfig) -> int:
    """ReceiveMessageWaitTimeSeconds: the long poll of a ReceiveMessage that sets none."""
    return _int(stored_attributes(config).get("ReceiveMessageWaitTimeSeconds"), 0)


def max_message_size(config: QueueConfig) -> int:
    """MaximumMessageSize: body plus message attributes, in bytes."""
    return min(config.max_message_bytes, MAX_MESSAGE_SIZE)


def visibility_timeout(config: QueueConfig) -> int:
    return round(config.visibility_timeout_s)


def delay_seconds(config: QueueConfig) -> int:
    return round(config.delay_s)


def retention_period(config: QueueConfig) -> int:
    if config.retention_s is None:
        return MAX_RETENTION_S
    return round(config.retention_s)


def tags(config: QueueConfig) -> dict[str, str]:
    stored = sqs_meta(config).get("tags")
    return (
        {k: v for k, v in stored.items() if isinstance(v, str)} if isinstance(stored, dict) else {}
    )


def redrive_target(config: QueueConfig) -> str | None:
    """The dead-letter queue of a RedrivePolicy (a dirmq queue name), if any."""
    if config.dead_letter_queue is None or config.max_receives is None:
        return None
    return config.dead_letter_queue


def timestamps(config: QueueConfig, config_path: str) -> tuple[int, int]:
    """(CreatedTimestamp, LastModifiedTimestamp) in seconds. Queues made outside SQS have
    neither recorded: their configuration file's modification time stands in."""
    meta = sqs_meta(config)
    created, modified = meta.get("created"), meta.get("modified")
    if isinstance(created, int) and isinstance(modified, int):
        return created, modified
    try:
        stamp = int(os.stat(config_path).st_mtime)
    except OSError:
        stamp = 0
    return (
        created if isinstance(created, int) else stamp,
        modified if isinstance(modified, int) else stamp,
    )


def _int(value: str | None, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except ValueError:
        return default


# -- the attributes a queue reports ---------------------------------------------------------------
def queue_view(config: QueueConfig, arn_of: Any) -> dict[str, str]:
    """Every attribute but the counters, timestamps and ARN, as GetQueueAttributes reports it.
    `arn_of(name)` gives a queue's ARN."""
    stored = stored_attributes(config)
    view = {
        "VisibilityTimeout": str(visibility_timeout(config)),
        "MaximumMessageSize": str(max_message_size(config)),
        "MessageRetentionPeriod": str(retention_period(config)),
        "DelaySeconds": str(delay_seconds(config)),
        "ReceiveMessageWaitTimeSeconds": str(receive_wait_default(config)),
    }
    target = redrive_target(config)
    if target is not None:
        view["RedrivePolicy"] = redrive_policy_text(arn_of(target), config.max_receives or 1)
    for name in ("Policy", "RedriveAllowPolicy"):
        if stored.get(name):
            view[name] = stored[name]
    if stored.get("KmsMasterKeyId"):
        view["KmsMasterKeyId"] = stored["KmsMasterKeyId"]
        view["KmsDataKeyReusePeriodSeconds"] = stored.get(
            "KmsDataKeyReusePeriodSeconds", DEFAULT_KMS_REUSE_S
        )
        view["SqsManagedSseEnabled"] = "false"
    else:
        view["SqsManagedSseEnabled"] = stored.get("SqsManagedSseEnabled", "true")
    if is_fifo(config):
        view["FifoQueue"] = "true"
        view["ContentBasedDeduplication"] = stored.get("ContentBasedDeduplication", "false")
        view["DeduplicationScope"] = dedup_scope(config)
        view["FifoThroughputLimit"] = throughput_limit(config)
    return view


def redrive_policy_text(target_arn: str, max_receive_count: int) -> str:
    return json.dumps(
        {"deadLetterTargetArn": target_arn, "maxReceiveCount": max_receive_count},
        separators=(",", ":"),
    )


def select(everything: Mapping[str, str], names: list[str] | None) -> dict[str, str]:
    """The attributes GetQueueAttributes asked for (`All`: every one); an unknown name is
    InvalidAttributeName, a known one the queue does not have is left out."""
    for name in names or ():
        if name not in NAMES:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if not names:
        return {}
    if "All" in names:
        return dict(everything)
    return {name: everything[name] for name in names if name in everything}


# -- changing attributes --------------------------------------------------------------------------
@dataclass
class Change:
    """What CreateQueue or SetQueueAttributes asks for, validated: the normalized values (to
    compare with an existing queue), the store settings and stored attributes they become, and
    the redrive policy's target (whose existence the caller checks)."""

    normalized: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    stored: dict[str, str | None] = field(default_factory=dict)  # None: remove
    redrive: tuple[str, int] | None = None  # (target ARN, maxReceiveCount)
    redrive_removed: bool = False
    redrive_text: str = ""  # as sent, for error messages


def validate(
    attributes: Mapping[str, Any], *, fifo: bool, creating: bool, current: QueueConfig | None
) -> Change:
    """Check `attributes` (name -> string value) against AWS's rules for a FIFO or standard
    queue and turn them into a Change. Raises AWS's errors."""
    change = Change()
    for name, raw in attributes.items():
        if name not in SETTABLE:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if not fifo and name in ("FifoQueue", "ContentBasedDeduplication"):
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
        if not fifo and name in ("DeduplicationScope", "FifoThroughputLimit"):
            raise SqsError(
                "InvalidAttributeName",
                f"You can specify the {name} only when FifoQueue is set to true.",
            )
        value = raw if isinstance(raw, str) else str(raw)
        change.normalized[name] = _normalize(name, value)
    values = change.normalized
    if values.get("FifoQueue", "true") != "true":
        if creating:
            raise SqsError("InvalidAttributeValue", "Invalid value for the parameter FifoQueue.")
        raise SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter FifoQueue. "
            "Reason: Modifying queue type is not supported.",
        )
    if values.get("KmsMasterKeyId") and values.get("SqsManagedSseEnabled") == "true":
        raise SqsError(
            "InvalidAttributeName",
            "You can use one type of server-side encryption (SSE) at one time. "
            "You can either enable KMS SSE or SQS SSE.",
        )
    scope = values.get("DeduplicationScope")
    if scope is None and current is not None:
        scope = dedup_scope(current)
    if values.get("FifoThroughputLimit") == "perMessageGroupId" and scope != "messageGroup":
        raise SqsError(
            "InvalidAttributeValue",
            "Invalid value for the parameter FifoThroughputLimit. Reason: perMessageGroupId is "
            "allowed only when the value for DeduplicationScope is messageGroup.",
        )
    _to_config(change, attributes)
    return change


def _normalize(name: str, value: str) -> str:
    """The value as the queue will report it; InvalidAttributeValue if AWS would refuse it."""
    if name in RANGES:
        low, high = RANGES[name]
        text = value.strip()
        if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
            raise _bad_value(name)
        return str(int(text))
    if name in BOOLEANS:
        lowered = value.strip().lower()
        if lowered not in ("true", "false"):
            raise _bad_value(name)
        return lowered
    if name in CHOICES:
        if value not in CHOICES[name]:
            raise _bad_value(name)
        return value
    if name == "Policy" and value:
        try:
            document = jsondoc.loads(value)
        except ValueError:
            raise _bad_value(name) from None
        if not isinstance(document, dict):
            raise _bad_value(name)
        return value
    if name == "RedriveAllowPolicy" and value:
        return _normalize_redrive_allow(value)
    return value  # RedrivePolicy (checked in _to_config), KmsMasterKeyId


def _bad_value(name: str) -> SqsError:
    return SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}.")


def _normalize_redrive_allow(value: str) -> str:
    def bad(reason: str) -> SqsError:
        return invalid_value("RedriveAllowPolicy", value, reason)

    try:
        document = jsondoc.loads(value)
    except ValueError:
        raise bad("Redrive allow policy is not a valid JSON map.") from None
    if not isinstance(document, dict):
        raise bad("Redrive allow policy is not a valid JSON map.")
    permission = document.get("redrivePermission")
    if permission not in ("allowAll", "denyAll", "byQueue"):
        raise bad("redrivePermission must be one of allowAll, denyAll, byQueue.")
    normalized: dict[str, Any] = {"redrivePermission": permission}
    arns = document.get("sourceQueueArns")
    if permission == "byQueue":
        if (
            not isinstance(arns, list)
            or not arns
            or not all(isinstance(a, str) and a.startswith("arn:") for a in arns)
        ):
            raise bad(
                "sourceQueueArns must be a list of queue ARNs when redrivePermission is byQueue."
            )
        if len(arns) > MAX_SOURCE_QUEUE_ARNS:
            raise bad(f"You can specify up to {MAX_SOURCE_QUEUE_ARNS} source queue ARNs.")
        normalized["sourceQueueArns"] = arns
    elif arns is not None:
        raise bad("sourceQueueArns can be specified only when redrivePermission is byQueue.")
    return json.dumps(normalized, separators=(",", ":"))


def parse_redrive_policy(value: str) -> tuple[str, int]:
    """(deadLetterTargetArn, maxReceiveCount) of a RedrivePolicy document."""

    def bad(reason: str) -> SqsError:
        return invalid_value("RedrivePolicy", value, reason)

    try:
        document = jsondoc.loads(value)
    except ValueError:
        raise bad("Redrive policy is not a valid JSON map.") from None
    if not isinstance(document, dict):
        raise bad("Redrive policy is not a valid JSON map.")
    arn = document.get("deadLetterTargetArn")
    count = document.get("maxReceiveCount")
    if not isinstance(arn, str) or not arn:
        raise bad("Dead-letter target ARN is missing.")
    if count is None:
        raise bad("Maximum receive count is missing.")
    text = str(count).strip()
    if isinstance(count, bool) or not (text.isascii() and text.isdigit()):
        number = None
    else:
        number = int(text)
    if number is None or not 1 <= number <= MAX_MAX_RECEIVE_COUNT:
        raise bad(
            f"Invalid value for maxReceiveCount: {count}, valid values are from 1 to "
            f"{MAX_MAX_RECEIVE_COUNT} both inclusive."
        )
    return arn, number


def _to_config(change: Change, attributes: Mapping[str, Any]) -> None:
    values = change.normalized
    if "VisibilityTimeout" in values:
        change.config["visibility_timeout_s"] = float(values["VisibilityTimeout"])
    if "DelaySeconds" in values:
        change.config["delay_s"] = float(values["DelaySeconds"])
    if "MessageRetentionPeriod" in values:
        change.config["retention_s"] = float(values["MessageRetentionPeriod"])
    if "MaximumMessageSize" in values:
        change.config["max_message_bytes"] = int(values["MaximumMessageSize"])
    if "RedrivePolicy" in values:
        text = values["RedrivePolicy"]
        change.redrive_text = str(attributes["RedrivePolicy"])
        if text:
            change.redrive = parse_redrive_policy(text)
        else:
            change.redrive_removed = True
            change.config["dead_letter_queue"] = None
            change.config["max_receives"] = None
    for name in STORED:
        if name not in values:
            continue
        value = values[name]
        removes = (name in ("Policy", "RedriveAllowPolicy", "KmsMasterKeyId") and not value) or (
            name == "KmsDataKeyReusePeriodSeconds" and value == DEFAULT_KMS_REUSE_S
        )
        change.stored[name] = None if removes else value
    if values.get("KmsMasterKeyId"):
        change.stored["SqsManagedSseEnabled"] = "false"
    elif values.get("SqsManagedSseEnabled") == "true":
        change.stored["KmsMasterKeyId"] = None


def differing(view: Mapping[str, str], requested: Mapping[str, str]) -> str | None:
    """The first requested attribute whose value differs from the queue's (CreateQueue on an
    existing queue), or None."""
    for name, value in requested.items():
        if name == "RedrivePolicy":
            current = view.get(name, "")
            if (parse_redrive_policy(value) if value else None) != (
                parse_redrive_policy(current) if current else None
            ):
                return name
            continue
        if name == "KmsDataKeyReusePeriodSeconds":
            if view.get(name, DEFAULT_KMS_REUSE_S) != value:
                return name
            continue
        if view.get(name, "") != value:
            return name
    return None


def with_meta(config: QueueConfig, update: Any) -> dict[str, Any]:
    """A copy of config.metadata with metadata["sqs"] replaced by `update(copy of it)`."""
    metadata: dict[str, Any] = json.loads(json.dumps(config.metadata))
    meta = metadata.get(META_KEY)
    if not isinstance(meta, dict):
        meta = {}
    update(meta)
    metadata[META_KEY] = meta
    return metadata


def apply_stored(meta: dict[str, Any], stored: Mapping[str, str | None]) -> None:
    attributes = meta.get("attributes")
    if not isinstance(attributes, dict):
        attributes = meta["attributes"] = {}
    for name, value in stored.items():
        if value is None:
            attributes.pop(name, None)
        else:
            attributes[name] = value
