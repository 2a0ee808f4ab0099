"""Queue actions: CreateQueue, GetQueueUrl, DeleteQueue, ListQueues (more to come)."""

from __future__ import annotations

from dirmq.errors import QueueExists, QueueNotFound
from dirmq.sqs.actions import Params, Result, action
from dirmq.sqs.context import Context, valid_sqs_name
from dirmq.sqs.errors import SqsError
from dirmq.store import QueueConfig


def _name_param(params: Params) -> str:
    name = params.get("QueueName")
    if not isinstance(name, str) or not name:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueName.")
    if not valid_sqs_name(name):
        raise SqsError(
            "InvalidParameterValue",
            "Can only include alphanumeric characters, hyphens, or underscores. 1 to 80 in length",
        )
    return name


@action("CreateQueue")
async def create_queue(ctx: Context, params: Params) -> Result:
    name = _name_param(params)
    store = ctx.broker.store
    try:
        await ctx.broker.call(store.create_queue, name, QueueConfig(), exist_ok=False)
    except QueueExists:
        pass  # same attributes: the existing queue (attribute checks come with attributes)
    return {"QueueUrl": ctx.queue_url(name)}


@action("GetQueueUrl")
async def get_queue_url(ctx: Context, params: Params) -> Result:
    name = _name_param(params)
    if not await ctx.broker.call(ctx.broker.store.exists, name):
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    return {"QueueUrl": ctx.queue_url(name)}


@action("DeleteQueue")
async def delete_queue(ctx: Context, params: Params) -> Result:
    name = ctx.name_from_url(params.get("QueueUrl"))
    try:
        await ctx.broker.call(ctx.broker.store.delete_queue, name)
    except QueueNotFound:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None
    return {}


@action("ListQueues")
async def list_queues(ctx: Context, params: Params) -> Result:
    prefix = params.get("QueueNamePrefix") or ""
    names = await ctx.broker.call(ctx.broker.store.list_queues)
    urls = [ctx.queue_url(n) for n in names if valid_sqs_name(n) and n.startswith(prefix)]
    return {"QueueUrls": urls} if urls else {}
