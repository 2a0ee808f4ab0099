"""The streaming receive's messages (`GET /{queue}/messages` as a WebSocket; docs/http-api.md
"Streaming receive"), encoded and decoded here for both the server and the client.

Server to client, one binary message per delivery: a JSON object on one line, `\\n`, then the
body's bytes as they are:

    {"tag":1,"id":"...","receipt":"...","receive_count":1,"published_at":1700000000.123456,
     "lease_deadline":1700000030.123,"headers":{"Content-Type":"text/plain"},"group":"g"}

(`headers` only when the message has some, `group` only when it has one, `dead`, a dead
letter's provenance as in a browse, only when it was dead-lettered). Server to client,
text: `{"failed": [{"tag": 3, "receipt": "...", "error": "StaleReceipt", "message": "..."}]}`
for settlements that did not take. Client to server, text: a JSON object with any of `ack` (a
list of delivery tags or receipts), `ack_through` (a tag: every delivery up to it), `nack` (a
list, with an optional `delay` in seconds) and `credit` (a number of further deliveries allowed).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dirmq.errors import InvalidArgument
from dirmq.store import Message
from dirmq.wire.messages import dead_from_json, dead_json

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def encode_delivery(tag: int, message: Message) -> bytes:
    """One delivery's binary message. Ids and receipts are digits, hex, `-` and `.`: nothing
    to escape, so only headers and a group go through the JSON encoder."""
    head = b'{"tag":%d,"id":"%s","receipt":"%s","receive_count":%d,"published_at":%.6f' % (
        tag,
        message.id.encode(),
        (message.receipt or "").encode(),
        message.receive_count,
        message.published_at_s,
    )
    if message.lease_deadline_s is not None:
        head += b',"lease_deadline":%.3f' % message.lease_deadline_s
    if message.headers:
        head += b',"headers":' + _dumps(message.headers).encode()
    if message.group is not None:
        head += b',"group":' + _dumps(message.group).encode()
    if message.dead is not None:
        head += b',"dead":' + _dumps(dead_json(message.dead)).encode()
    return head + b"}\n" + message.body


def decode_delivery(payload: bytes) -> tuple[int, Message]:
    """(delivery tag, the leased message) of one delivery's binary message."""
    end = payload.find(b"\n")
    if end < 0:
        raise InvalidArgument("a delivery without its header line")
    # Decoded first: json.loads of bytes would guess their encoding each time (it is UTF-8).
    head: dict[str, Any] = json.loads(payload[:end].decode("utf-8", "surrogatepass"))
    deadline = head.get("lease_deadline")
    return int(head["tag"]), Message(
        id=head["id"],
        body=payload[end + 1 :],
        headers=dict(head.get("headers") or {}),
        receive_count=int(head["receive_count"]),
        published_at_s=float(head["published_at"]),
        receipt=head["receipt"],
        lease_deadline_s=None if deadline is None else float(deadline),
        state="leased",
        group=head.get("group"),
        dead=dead_from_json(head.get("dead")),
    )


def encode_settle(
    ack: Sequence[int | str] | None = None,
    ack_through: int | None = None,
    nack: Sequence[int | str] | None = None,
    credit: int | None = None,
    delay: float | None = None,
) -> str:
    """A client's text message (the keys given)."""
    document: dict[str, object] = {}
    if ack:
        document["ack"] = list(ack)
    if ack_through is not None:
        document["ack_through"] = ack_through
    if nack:
        document["nack"] = list(nack)
        if delay:
            document["delay"] = delay
    if credit:
        document["credit"] = credit
    return json.dumps(document, separators=(",", ":"))


def encode_failed(failures: list[dict[str, object]]) -> str:
    return json.dumps({"failed": failures}, separators=(",", ":"))
