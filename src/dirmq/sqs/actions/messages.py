"""Message actions: SendMessage, ReceiveMessage, DeleteMessage (more to come)."""

from __future__ import annotations

import hashlib

from dirmq.sqs.actions import Params, Result, action
from dirmq.sqs.context import Context
from dirmq.sqs.errors import SqsError
from dirmq.sqs.ids import sqs_message_id
from dirmq.store import OutgoingMessage


@action("SendMessage")
async def send_message(ctx: Context, params: Params) -> Result:
    name = ctx.name_from_url(params.get("QueueUrl"))
    body = params.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    data = body.encode("utf-8")
    queue = ctx.broker.queue(name)
    (message_id,) = await ctx.broker.publish(queue, [OutgoingMessage(data)])
    return {
        "MessageId": sqs_message_id(message_id),
        "MD5OfMessageBody": hashlib.md5(data).hexdigest(),
    }


@action("ReceiveMessage")
async def receive_message(ctx: Context, params: Params) -> Result:
    name = ctx.name_from_url(params.get("QueueUrl"))
    queue = ctx.broker.queue(name)
    count = int(params.get("MaxNumberOfMessages", 1))
    wait_s = float(params.get("WaitTimeSeconds", 0))
    visibility = params.get("VisibilityTimeout")
    got = await ctx.broker.receive(
        queue, count, None if visibility is None else float(visibility), wait_s
    )
    messages = [
        {
            "MessageId": sqs_message_id(m.id),
            "ReceiptHandle": m.receipt,
            "MD5OfBody": hashlib.md5(m.body).hexdigest(),
            "Body": m.body.decode("utf-8", "replace"),
        }
        for m in got
    ]
    return {"Messages": messages} if messages else {}


@action("DeleteMessage")
async def delete_message(ctx: Context, params: Params) -> Result:
    name = ctx.name_from_url(params.get("QueueUrl"))
    handle = params.get("ReceiptHandle")
    if not isinstance(handle, str) or not handle:
        raise SqsError("MissingParameter", "The request must contain the parameter ReceiptHandle.")
    queue = ctx.broker.queue(name)
    await ctx.broker.call(queue.ack, handle)
    return {}
