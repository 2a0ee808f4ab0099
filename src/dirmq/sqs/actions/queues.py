"""Queue actions: CreateQueue, DeleteQueue, GetQueueUrl, ListQueues, GetQueueAttributes,
SetQueueAttributes, PurgeQueue, TagQueue, UntagQueue, ListQueueTags, ListDeadLetterSourceQueues,
AddPermission, RemovePermission.

Queues are the store's: whatever SQS creates, the native API, the library and Spark see, and
the other way round (see context.py for names and attributes.py for attributes).

Why it is long: thirteen actions, each a short function, grouped as AWS groups them.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from collections.abc import Callable
from typing import Any

from dirmq.errors import DirmqError, QueueExists, QueueNotFound
from dirmq.sqs import attributes as attrs
from dirmq.sqs import message_attributes, protocol_json
from dirmq.sqs.actions.registry import Params, Result, action
from dirmq.sqs.context import Context, valid_sqs_name
from dirmq.sqs.deleted import MESSAGE as DELETED_RECENTLY
from dirmq.sqs.deleted import deleted_recently
from dirmq.sqs.deleted import record as record_deletion
from dirmq.sqs.errors import SqsError, invalid_value, missing, no_such_queue
from dirmq.sqs.receive_attempts import memory_for
from dirmq.store import Queue, QueueConfig
from dirmq.store.layout import CONFIG_FILE
from dirmq.wire import jsondoc

PURGE_INTERVAL_S = 60.0
MAX_RESULTS = 1000
MAX_TAGS = 50
MAX_TAG_KEY = 128
MAX_TAG_VALUE = 256
MAX_PERMISSION_ACTIONS = 7
# What AddPermission may grant to another account; the other actions are the owner's alone.
SHAREABLE_ACTIONS = frozenset(
    {
        "*",
        "ChangeMessageVisibility",
        "DeleteMessage",
        "GetQueueAttributes",
        "GetQueueUrl",
        "ListDeadLetterSourceQueues",
        "PurgeQueue",
        "ReceiveMessage",
        "SendMessage",
    }
)
_NAME_RULES = "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length"
_FIFO_NAME_RULES = (
    "The name of a FIFO queue can only include alphanumeric characters, hyphens, or "
    "underscores, must end with .fifo suffix and be 1 to 80 in length."
)


# -- helpers --------------------------------------------------------------------------------------
def _name_param(params: Params) -> str:
    name = params.get("QueueName")
    if not isinstance(name, str) or not name:
        raise missing("QueueName")
    if not valid_sqs_name(name):
        raise SqsError("InvalidParameterValue", _NAME_RULES)
    return name


def _string_map(params: Params, key: str) -> dict[str, str]:
    value = params.get(key) or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise SqsError("InvalidParameterValue", f"The parameter {key} must map names to strings.")
    return value


async def _open(ctx: Context, params: Params) -> Queue:
    """The queue named by the request's QueueUrl (QueueDoesNotExist if there is none)."""
    name = ctx.name_from_url(params.get("QueueUrl"))
    try:
        queue = await ctx.broker.call(ctx.broker.queue, name)
        await ctx.broker.call(queue.reload_config)
    except QueueNotFound:
        raise no_such_queue() from None
    return queue


async def _configure(ctx: Context, name: str, **changes: Any) -> QueueConfig:
    try:
        return await ctx.broker.call(ctx.broker.store.configure, name, **changes)
    except QueueNotFound:
        raise no_such_queue() from None


async def _update_meta(
    ctx: Context, queue: Queue, update: Callable[[dict[str, Any]], None], **changes: Any
) -> QueueConfig:
    metadata = attrs.with_meta(queue.config, update)
    return await _configure(ctx, queue.name, metadata=metadata, **changes)


def _page(params: Params, items: list[str], key: str) -> Result:
    """`items` (sorted) from NextToken on, MaxResults at a time (1000 without it)."""
    max_results = params.get("MaxResults")
    token = params.get("NextToken")
    if max_results is not None and (
        not isinstance(max_results, int) or not 1 <= max_results <= MAX_RESULTS
    ):
        raise invalid_value(
            "MaxResults", max_results, f"MaxResults must be an integer between 1 and {MAX_RESULTS}."
        )
    start = 0
    if token:
        after = _decode_token(token)
        start = next((i for i, item in enumerate(items) if item > after), len(items))
    size = max_results or MAX_RESULTS
    page = items[start : start + size]
    result: Result = {key: page} if page or key == "queueUrls" else {}
    if max_results is not None and start + size < len(items):
        result["NextToken"] = _encode_token(page[-1])
    return result


def _encode_token(after: str) -> str:
    return base64.urlsafe_b64encode(json.dumps({"after": after}).encode()).decode()


def _decode_token(token: Any) -> str:
    try:
        document = jsondoc.loads(base64.urlsafe_b64decode(str(token).encode()))
        after = document["after"] if isinstance(document, dict) else None
        if isinstance(after, str):
            return after
    except (ValueError, KeyError, TypeError, binascii.Error):
        pass
    raise invalid_value("NextToken", token, "Invalid or expired next token.")


async def _check_redrive(ctx: Context, name: str, fifo: bool, change: attrs.Change) -> str | None:
    """The dead-letter queue a RedrivePolicy names, after AWS's checks (exists, same type,
    its RedriveAllowPolicy lets this queue use it); None when the request has no policy."""
    if change.redrive is None:
        return None
    arn, _count = change.redrive
    text = change.redrive_text
    try:
        target = ctx.name_from_arn(arn, "RedrivePolicy")
    except SqsError:
        raise invalid_value(
            "RedrivePolicy", text, "Invalid value for deadLetterTargetArn."
        ) from None
    try:
        target_queue = await ctx.broker.call(ctx.broker.queue, target)
    except QueueNotFound:
        raise invalid_value("RedrivePolicy", text, "Dead letter target does not exist.") from None
    config = target_queue.config
    if attrs.is_fifo(config) != fifo:
        raise invalid_value(
            "RedrivePolicy", text, "Dead-letter queue must be same type of queue as the source."
        )
    allow = attrs.stored_attributes(config).get("RedriveAllowPolicy")
    if allow:
        document = json.loads(allow)
        source_arn = ctx.queue_arn(name)
        permission = document.get("redrivePermission")
        if permission == "denyAll" or (
            permission == "byQueue" and source_arn not in document.get("sourceQueueArns", [])
        ):
            raise invalid_value(
                "RedrivePolicy",
                text,
                f"Queue {ctx.queue_arn(target)} does not allow {source_arn} to use it as a "
                "dead-letter queue.",
            )
    return target


def _config_path(queue: Queue) -> str:
    return os.path.join(queue.path, CONFIG_FILE)


# -- queues ---------------------------------------------------------------------------------------
@action("CreateQueue")
async def create_queue(ctx: Context, params: Params) -> Result:
    name = params.get("QueueName")
    if not isinstance(name, str) or not name:
        raise missing("QueueName")
    requested = _string_map(params, "Attributes")
    fifo = str(requested.get("FifoQueue", "")).strip().lower() == "true"
    if fifo and (not name.endswith(".fifo") or not valid_sqs_name(name)):
        raise SqsError("InvalidParameterValue", _FIFO_NAME_RULES)
    if not valid_sqs_name(name) or (not fifo and name.endswith(".fifo")):
        raise SqsError("InvalidParameterValue", _NAME_RULES)
    new_tags = _string_map(params, "tags")
    _check_tags(new_tags)
    _check_tag_count(name, new_tags, {})
    change = attrs.validate(requested, fifo=fifo, creating=True, current=None)
    store = ctx.broker.store
    try:
        existing = await ctx.broker.call(ctx.broker.queue, name)
    except QueueNotFound:
        existing = None
    if existing is None:
        root = ctx.broker.store.root
        wait_s = ctx.deleted_wait_s
        if wait_s is not None and await ctx.broker.call(deleted_recently, root, name, wait_s):
            raise SqsError("QueueDeletedRecently", DELETED_RECENTLY)
        target = await _check_redrive(ctx, name, fifo, change)
        now = int(time.time())
        settings: dict[str, Any] = {**attrs.SQS_DEFAULT_CONFIG, **change.config}
        if target is not None and change.redrive is not None:
            settings["dead_letter_queue"] = target
            settings["max_receives"] = change.redrive[1]
        stored = {k: v for k, v in change.stored.items() if v is not None}
        meta: dict[str, Any] = {"attributes": stored, "created": now, "modified": now}
        if new_tags:
            meta["tags"] = new_tags
        config = QueueConfig(**settings, metadata={attrs.META_KEY: meta})
        try:
            await ctx.broker.call(store.create_queue, name, config, exist_ok=False)
            return {"QueueUrl": ctx.queue_url(name)}
        except QueueExists:  # created meanwhile: compare with that one
            existing = await ctx.broker.call(ctx.broker.queue, name)
    await ctx.broker.call(existing.reload_config)
    view = attrs.queue_view(existing.config, ctx.queue_arn)
    if fifo != attrs.is_fifo(existing.config):
        different: str | None = "FifoQueue"
    else:
        different = attrs.differing(view, change.normalized)
    if different is not None:
        raise SqsError(
            "QueueNameExists",
            f"A queue already exists with the same name and a different value for attribute "
            f"{different}",
        )
    return {"QueueUrl": ctx.queue_url(name)}


@action("GetQueueUrl")
async def get_queue_url(ctx: Context, params: Params) -> Result:
    name = params.get("QueueName")
    if not isinstance(name, str) or not name:
        raise missing("QueueName")
    # QueueOwnerAWSAccountId is accepted whatever it says: one store, one account.
    if not valid_sqs_name(name):
        raise await ctx.broker.call(ctx.unreachable, name)
    if not await ctx.broker.call(ctx.broker.store.exists, name):
        raise no_such_queue()
    return {"QueueUrl": ctx.queue_url(name)}


@action("DeleteQueue")
async def delete_queue(ctx: Context, params: Params) -> Result:
    name = ctx.name_from_url(params.get("QueueUrl"))
    try:
        await ctx.broker.call(ctx.broker.store.delete_queue, name)
    except QueueNotFound:
        raise no_such_queue() from None
    root = ctx.broker.store.root
    await ctx.broker.call(memory_for(ctx.broker, ctx.broker.store).forget_queue, name)
    if ctx.deleted_wait_s is not None:
        await ctx.broker.call(record_deletion, root, name, ctx.broker.store.access)
    return {}


@action("ListQueues")
async def list_queues(ctx: Context, params: Params) -> Result:
    prefix = params.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise invalid_value("QueueNamePrefix", prefix, "Must be a string.")
    names = await ctx.broker.call(ctx.broker.store.list_queues, prefix)
    shown = [n for n in names if valid_sqs_name(n) and ctx.visible(n)]
    page = _page(params, shown, "QueueUrls")
    if "QueueUrls" in page:
        page["QueueUrls"] = [ctx.queue_url(n) for n in page["QueueUrls"]]
    return page


# -- attributes -----------------------------------------------------------------------------------
@action("GetQueueAttributes")
async def get_queue_attributes(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    names = params.get("AttributeNames") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SqsError("InvalidAttributeName", "AttributeNames must be a list of names.")
    attrs.select({}, names)  # unknown names fail before any work
    if not names:
        return {}
    config = queue.config
    everything: dict[str, str] = {"QueueArn": ctx.queue_arn(queue.name)}
    if "All" in names or any(n in attrs.COUNTERS for n in names):
        stats = await ctx.broker.call(queue.stats)
        everything["ApproximateNumberOfMessages"] = str(stats.ready)
        everything["ApproximateNumberOfMessagesNotVisible"] = str(stats.in_flight)
        everything["ApproximateNumberOfMessagesDelayed"] = str(stats.delayed)
    created, modified = await ctx.broker.call(attrs.timestamps, config, _config_path(queue))
    everything["CreatedTimestamp"] = str(created)
    everything["LastModifiedTimestamp"] = str(modified)
    everything.update(attrs.queue_view(config, ctx.queue_arn))
    selected = attrs.select(everything, names)
    return {"Attributes": selected} if selected else {}


@action("SetQueueAttributes")
async def set_queue_attributes(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    requested = _string_map(params, "Attributes")
    if not requested:
        raise missing("Attribute.1.Name")
    config = queue.config
    fifo = attrs.is_fifo(config)
    change = attrs.validate(requested, fifo=fifo, creating=False, current=config)
    settings = dict(change.config)
    target = await _check_redrive(ctx, queue.name, fifo, change)
    if target is not None and change.redrive is not None:
        settings["dead_letter_queue"] = target
        settings["max_receives"] = change.redrive[1]
    now = int(time.time())

    def update(meta: dict[str, Any]) -> None:
        attrs.apply_stored(meta, change.stored)
        meta.setdefault("created", attrs.timestamps(config, _config_path(queue))[0])
        meta["modified"] = now

    await _update_meta(ctx, queue, update, **settings)
    return {}


@action("PurgeQueue")
async def purge_queue(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    last = attrs.sqs_meta(queue.config).get("purged")
    now = time.time()
    if isinstance(last, int | float) and 0 <= now - last < PURGE_INTERVAL_S:
        raise SqsError(
            "PurgeQueueInProgress",
            f"Only one PurgeQueue operation on {queue.name} is allowed every 60 seconds.",
        )

    def update(meta: dict[str, Any]) -> None:
        meta["purged"] = now

    await _update_meta(ctx, queue, update)
    await ctx.broker.call(queue.purge)
    return {}


# -- tags -----------------------------------------------------------------------------------------
def _check_tags(new: dict[str, str]) -> None:
    for key, value in new.items():
        # The rule of message bodies: a lone surrogate (a query-protocol byte that was not
        # UTF-8) or a control character would be stored in the queue's config. The text itself
        # stays out of the message: it may not even be encodable.
        for part, text in (("key", key), ("value", value)):
            bad = message_attributes.first_invalid_character(text)
            if bad is not None:
                raise SqsError(
                    "InvalidParameterValue",
                    f"Invalid binary character '{message_attributes.describe_character(bad)}' "
                    f"was found in a tag {part}, the set of allowed characters is "
                    f"{message_attributes.ALLOWED_CHARACTERS}",
                )
        if not 1 <= len(key) <= MAX_TAG_KEY:
            raise invalid_value("Tags", key, f"Tag keys must be 1 to {MAX_TAG_KEY} characters.")
        if len(value) > MAX_TAG_VALUE:
            raise invalid_value(
                "Tags", value, f"Tag values must be at most {MAX_TAG_VALUE} characters."
            )


def _check_tag_count(name: str, new: dict[str, str], current: dict[str, str]) -> None:
    if len({**current, **new}) > MAX_TAGS:
        raise SqsError("InvalidParameterValue", f"Too many tags added for queue {name}.")


@action("TagQueue")
async def tag_queue(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    new = _string_map(params, "Tags")
    if not new:
        raise missing("Tags")
    current = attrs.tags(queue.config)
    _check_tags(new)
    _check_tag_count(queue.name, new, current)

    def update(meta: dict[str, Any]) -> None:
        current = meta.get("tags")
        meta["tags"] = {**(current if isinstance(current, dict) else {}), **new}

    await _update_meta(ctx, queue, update)
    return {}


@action("UntagQueue")
async def untag_queue(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    keys = params.get("TagKeys") or []
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise SqsError("InvalidParameterValue", "TagKeys must be a list of tag keys.")
    if not keys:
        raise missing("TagKeys")

    def update(meta: dict[str, Any]) -> None:
        current = meta.get("tags")
        kept = current if isinstance(current, dict) else {}
        meta["tags"] = {k: v for k, v in kept.items() if k not in keys}

    await _update_meta(ctx, queue, update)
    return {}


@action("ListQueueTags")
async def list_queue_tags(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    current = attrs.tags(queue.config)
    return {"Tags": current} if current else {}


# -- dead-letter queues ---------------------------------------------------------------------------
@action("ListDeadLetterSourceQueues")
async def list_dead_letter_source_queues(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    store = ctx.broker.store

    def sources() -> list[str]:
        found = []
        for name in store.list_queues():
            if not valid_sqs_name(name) or not ctx.visible(name):
                continue
            try:
                config = store.queue(name).config
            except DirmqError:  # gone meanwhile, or an unreadable configuration: not a source
                continue
            if attrs.redrive_target(config) == queue.name:
                found.append(name)
        return found

    page = _page(params, await ctx.broker.call(sources), "queueUrls")
    page["queueUrls"] = [ctx.queue_url(n) for n in page["queueUrls"]]
    return page


# -- permissions (kept in the Policy attribute; dirmq does not enforce them) -----------------------
@action("AddPermission")
async def add_permission(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    label = params.get("Label")
    accounts = params.get("AWSAccountIds") or []
    actions = params.get("Actions") or []
    if not isinstance(label, str) or not valid_sqs_name(label) or label.endswith(".fifo"):
        raise invalid_value("Label", label, _NAME_RULES)
    if not actions:
        raise missing("Actions")
    if not accounts:
        raise invalid_value("PrincipalId", "[]", "Unable to verify.")
    if len(actions) > MAX_PERMISSION_ACTIONS:
        raise SqsError(
            "OverLimit",
            f"{len(actions)} Actions were found, maximum allowed is {MAX_PERMISSION_ACTIONS}.",
        )
    for granted_action in actions:
        if granted_action not in SHAREABLE_ACTIONS:
            known = granted_action in protocol_json.service_model().operation_names
            raise invalid_value(
                "ActionName",
                f"SQS:{granted_action}",
                "Only the queue owner is allowed to invoke this action."
                if known
                else "Please refer to the appropriate WSDL for a list of valid actions.",
            )
    arn = ctx.queue_arn(queue.name)
    stored = attrs.stored_attributes(queue.config).get("Policy")
    policy: dict[str, Any] = (
        json.loads(stored)
        if stored
        else {"Version": "2012-10-17", "Id": f"{arn}/SQSDefaultPolicy", "Statement": []}
    )
    statements = policy.setdefault("Statement", [])
    if any(isinstance(s, dict) and s.get("Sid") == label for s in statements):
        raise invalid_value("Label", label, "Already exists.")
    principals = [f"arn:aws:iam::{a}:root" for a in accounts]
    granted = [f"SQS:{a}" for a in actions]
    statements.append(
        {
            "Sid": label,
            "Effect": "Allow",
            "Principal": {"AWS": principals[0] if len(principals) == 1 else principals},
            "Action": granted[0] if len(granted) == 1 else granted,
            "Resource": arn,
        }
    )
    text = json.dumps(policy, separators=(",", ":"))

    def update(meta: dict[str, Any]) -> None:
        attrs.apply_stored(meta, {"Policy": text})

    await _update_meta(ctx, queue, update)
    return {}


@action("RemovePermission")
async def remove_permission(ctx: Context, params: Params) -> Result:
    queue = await _open(ctx, params)
    label = params.get("Label")
    stored = attrs.stored_attributes(queue.config).get("Policy")
    policy = json.loads(stored) if stored else {}
    statements = policy.get("Statement", []) if isinstance(policy, dict) else []
    kept = [s for s in statements if not (isinstance(s, dict) and s.get("Sid") == label)]
    if len(kept) == len(statements):
        raise invalid_value("Label", label, "can't find label.")
    policy["Statement"] = kept
    text = json.dumps(policy, separators=(",", ":")) if kept else None

    def update(meta: dict[str, Any]) -> None:
        attrs.apply_stored(meta, {"Policy": text})

    await _update_meta(ctx, queue, update)
    return {}
