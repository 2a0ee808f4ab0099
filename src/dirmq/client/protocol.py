"""What the sync and async clients share: building requests and reading answers, as pure
functions of (method, path, params, headers, body) and (status, headers, body).

Why it is long: every request of the native API is built, and every answer read, here, one
small function each; apart, each client would import many modules for what is one protocol."""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from dirmq import errors
from dirmq.store import Message, OutgoingMessage, QueueConfig, QueueStats
from dirmq.store.codec import check_headers, check_label
from dirmq.store.ids import is_id
from dirmq.store.layout import parse_receipt
from dirmq.store.names import validate_queue_name
from dirmq.wire import framing
from dirmq.wire.messages import (
    DEAD_HEADERS,
    STORED_HEADERS,
    STORED_PREFIX,
    dead_from_json,
    holder_from_json,
    parse_dead_headers,
)

LONG_POLL_MARGIN_S = 30.0
TOKEN_ENV = "DIRMQ_TOKEN"


def auth_headers(token: str | None) -> dict[str, str]:
    """The `Authorization` header a client sends: its `token`, else `$DIRMQ_TOKEN`, else none
    (an open server). `token=""` sends none whatever the environment says."""
    chosen = os.environ.get(TOKEN_ENV) if token is None else token
    if not chosen:
        return {}
    if any(c in chosen for c in "\r\n\x00") or chosen != chosen.strip():
        raise errors.InvalidArgument("a token cannot hold spaces around it, CR, LF or NUL")
    return {"Authorization": f"Bearer {chosen}"}


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    headers: dict[str, bytes] = field(default_factory=dict)
    body: bytes = b""
    timeout_s: float | None = None  # None: the client's default


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: list[tuple[str, str]]  # names lower-case, values UTF-8 decoded
    body: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    def json(self) -> Any:
        return json.loads(self.body)


def queue_path(name: str) -> str:
    validate_queue_name(name)
    return "/" + quote(name, safe="/")


def seconds(value: float) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise errors.InvalidArgument(f"not a number of seconds: {value!r}")
    if value < 0:
        raise errors.InvalidArgument(f"a duration cannot be negative: {value!r}")
    # Fixed notation: the server's duration grammar has no exponents (repr(1e-05) is "1e-05").
    return f"{value:.6f}".rstrip("0").rstrip(".")


def check_message(message: OutgoingMessage) -> None:
    """What the server would refuse (or silently drop), refused here with the library's error."""
    if not isinstance(message.body, bytes | bytearray | memoryview):
        raise errors.InvalidArgument(
            f"message body must be bytes, got {type(message.body).__name__}"
        )
    check_headers(message.headers)
    # Both travel in header lines: a CR or LF would split them (or a batch part) in two.
    check_label("group", message.group)
    check_label("dedup_id", message.dedup_id)
    for name in message.headers:
        lowered = name.lower()
        if lowered not in STORED_HEADERS and not lowered.startswith(STORED_PREFIX):
            raise errors.InvalidArgument(
                f"header {name!r} cannot travel over HTTP: use Content-Type, Content-Encoding "
                "or X-Attr-*"
            )
    if message.delay_s is not None:
        seconds(message.delay_s)
    if message.ttl_s is not None:
        seconds(message.ttl_s)


def publish_call(
    name: str, messages: list[OutgoingMessage], durability: str | None, timeout_s: float | None
) -> Call:
    for message in messages:
        check_message(message)
    params: dict[str, str] = {}
    if durability is not None:
        params["durability"] = str(getattr(durability, "value", durability))
    if timeout_s is not None:
        params["timeout"] = seconds(timeout_s)
    path = queue_path(name) + "/messages"
    if len(messages) == 1:
        (message,) = messages
        headers = {k: v.encode() for k, v in message.headers.items()}
        if message.delay_s is not None:
            params["delay"] = seconds(message.delay_s)
        if message.dedup_id is not None:
            headers["X-Dedup-Id"] = message.dedup_id.encode()
        if message.group is not None:
            headers["X-Group"] = message.group.encode()
        if message.ttl_s is not None:
            params["ttl"] = seconds(message.ttl_s)
        if message.priority:
            headers["X-Priority"] = str(message.priority).encode()
        return Call("POST", path, params, headers, bytes(message.body), _wait_budget(timeout_s))
    boundary = framing.new_boundary()
    parts = []
    for message in messages:
        part_headers = list(message.headers.items())
        if message.delay_s is not None:
            part_headers.append(("X-Delay", seconds(message.delay_s)))
        if message.dedup_id is not None:
            part_headers.append(("X-Dedup-Id", message.dedup_id))
        if message.group is not None:
            part_headers.append(("X-Group", message.group))
        if message.ttl_s is not None:
            part_headers.append(("X-TTL", seconds(message.ttl_s)))
        if message.priority:
            part_headers.append(("X-Priority", str(message.priority)))
        parts.append((part_headers, bytes(message.body)))
    body = framing.multipart_body(boundary, parts)
    content_type = f'multipart/mixed; boundary="{boundary}"'.encode()
    return Call("POST", path, params, {"Content-Type": content_type}, body, _wait_budget(timeout_s))


def _wait_budget(timeout_s: float | None) -> float | None:
    """A request that may wait server-side (at capacity) needs that long plus a margin."""
    return None if not timeout_s else timeout_s + LONG_POLL_MARGIN_S


def published_ids(answer: Answer) -> list[str]:
    data = answer.json()
    return [data["id"]] if "id" in data else list(data["ids"])


def receive_call(name: str, max_count: int, visibility_s: float | None, wait_s: float) -> Call:
    if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
        raise errors.InvalidArgument(f"max_count must be a positive integer, got {max_count!r}")
    params = {"max": str(max_count), "wait": seconds(wait_s)}
    if visibility_s is not None:
        params["visibility"] = seconds(visibility_s)
    return Call(
        "GET", queue_path(name) + "/messages", params, timeout_s=wait_s + LONG_POLL_MARGIN_S
    )


def received(answer: Answer) -> list[Message]:
    if answer.status == 204:
        return []
    content_type = answer.header("content-type") or ""
    if content_type.startswith("multipart/mixed"):
        return [
            message_from(list(headers.items()), body)
            for headers, body in framing.parse_multipart_fast(content_type, answer.body)
        ]
    return [message_from(answer.headers, answer.body)]


def message_from(headers: Iterable[tuple[str, str]], body: bytes) -> Message:
    own: dict[str, str] = {}
    stored: dict[str, str] = {}
    for name, value in headers:
        lowered = name.lower()
        if lowered in (
            "x-message-id",
            "x-receive-count",
            "x-published-at",
            "x-receipt",
            "x-lease-deadline",
            "x-group",
            "x-priority",
            *DEAD_HEADERS,
        ):
            own[lowered] = value
        elif lowered in STORED_HEADERS or lowered.startswith(STORED_PREFIX):
            stored[_canonical(name) if lowered in STORED_HEADERS else name] = value
    deadline = own.get("x-lease-deadline")
    receipt = own.get("x-receipt")
    return Message(
        id=own["x-message-id"],
        body=body,
        headers=stored,
        receive_count=int(own.get("x-receive-count", "0")),
        published_at_s=float(own.get("x-published-at", "0")),
        receipt=receipt,
        lease_deadline_s=float(deadline) if deadline else None,
        state="leased" if receipt else "ready",
        group=own.get("x-group"),
        dead=parse_dead_headers(own),
        priority=int(own.get("x-priority", "0")),
    )


def _canonical(name: str) -> str:
    return "-".join(part.capitalize() for part in name.lower().split("-"))


def browsed(answer: Answer) -> list[Message]:
    out = []
    for item in answer.json()["messages"]:
        body = (
            base64.b64decode(item["body_base64"])
            if "body_base64" in item
            else item["body"].encode()
        )
        out.append(
            Message(
                id=item["id"],
                body=body,
                headers=dict(item["headers"]),
                receive_count=item["receive_count"],
                published_at_s=item["published_at"],
                state=item["state"],
                group=item.get("group"),
                dead=dead_from_json(item.get("dead")),
                holder=holder_from_json(item.get("holder")),
                priority=int(item.get("priority", 0)),
            )
        )
    return out


def stats_from(answer: Answer) -> QueueStats:
    stats = dict(answer.json()["stats"])
    stats.pop("total", None)
    return QueueStats(**stats)


def config_from(answer: Answer) -> QueueConfig:
    return QueueConfig.from_json(answer.json()["config"])


def config_body(config: QueueConfig | Mapping[str, Any] | None) -> bytes:
    if config is None:
        return b""
    data = config.to_json() if isinstance(config, QueueConfig) else dict(config)
    return json.dumps(data).encode()


_ERRORS: dict[str, type[errors.DirmqError]] = {
    cls.__name__: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, errors.DirmqError)
}


def error_type(name: str) -> type[errors.DirmqError]:
    """The library's error class the server named (DirmqError for a name it does not know)."""
    return _ERRORS.get(name, errors.DirmqError)


def raise_for(answer: Answer) -> None:
    """Raise the library error the server reported (by its name), if the answer is an error."""
    if answer.status < 400:
        return
    try:
        data = answer.json()
        code, message = str(data.get("error", "")), str(data.get("message", ""))
    except (ValueError, AttributeError):
        code, message = "", answer.body.decode("utf-8", "replace")[:300]
    fallback = errors.StorageError if answer.status == 503 else errors.DirmqError
    raise error_named(code, message or f"HTTP {answer.status}", fallback)


def error_named(
    code: str, message: str, fallback: type[errors.DirmqError] = errors.DirmqError
) -> errors.DirmqError:
    """The library error the server named `code` (`fallback` for a name it does not know)."""
    error_type = _ERRORS.get(code, fallback)
    if issubclass(error_type, errors.StorageError):
        return error_type(0, message)
    return error_type(message)


def ref(text: str, *, need_id: bool = False, need_receipt: bool = False) -> str:
    """A message id or receipt for a URL path, checked first so nothing else reaches the path."""
    if not isinstance(text, str):
        raise errors.InvalidArgument(f"not a message id or receipt: {text!r}")
    if need_id and not is_id(text):
        raise errors.InvalidArgument(f"not a dirmq message id: {text[:80]!r}")
    if need_receipt and parse_receipt(text) is None:
        raise errors.InvalidArgument(f"not a dirmq receipt: {text[:80]!r}")
    if not is_id(text) and parse_receipt(text) is None:
        raise errors.InvalidArgument(f"not a dirmq receipt: {text[:80]!r}")
    return text


# -- the remaining calls, one builder (and reader) each, as the sync client spells them inline ----
def queue_call(name: str) -> Call:
    """A queue's stats and configuration (QueueNotFound if absent): `stats_from`, `config_from`."""
    return Call("GET", queue_path(name))


def put_queue_call(name: str, config: QueueConfig | Mapping[str, Any] | None) -> Call:
    """Create a queue with `config`, or reconfigure an existing one with these changes."""
    return Call("PUT", queue_path(name), body=config_body(config))


def delete_queue_call(name: str) -> Call:
    return Call("DELETE", queue_path(name))


def list_call(prefix: str) -> Call:
    return Call("GET", "/", {"prefix": prefix} if prefix else {})


def queue_names(answer: Answer) -> list[str]:
    return list(answer.json()["queues"])


def _message_path(name: str, message_ref: str, action: str | None = None) -> str:
    path = f"{queue_path(name)}/messages/{message_ref}"
    return path if action is None else f"{path}/{action}"


def ack_call(name: str, receipt: str) -> Call:
    return Call("DELETE", _message_path(name, ref(receipt)))


def nack_call(name: str, receipt: str, delay_s: float) -> Call:
    params = {"delay": seconds(delay_s)}
    return Call("POST", _message_path(name, ref(receipt, need_receipt=True), "nack"), params)


def extend_call(name: str, receipt: str, visibility_s: float) -> Call:
    params = {"visibility": seconds(visibility_s)}
    return Call("POST", _message_path(name, ref(receipt, need_receipt=True), "extend"), params)


MAX_SETTLE = 1000  # receipts per batch request: the server's bound


@dataclass(slots=True)
class SettleMany:
    """A batch settle (`ack_many`, `extend_many`) as requests of at most MAX_SETTLE receipts,
    and the failures known before any is sent (what is no string never reaches the server)."""

    calls: list[Call]
    failures: dict[str, Exception]


_SETTLE_DURATION = {"nack": "delay", "extend": "visibility"}


def settle_many(
    name: str, action: str, receipts: Iterable[str], duration_s: float | None = None
) -> SettleMany:
    """`POST /{queue}/messages/{action}` (ack, nack or extend) for `receipts`, each once;
    `duration_s`: an extend's visibility, a nack's delay."""
    failures: dict[str, Exception] = {}
    distinct: list[str] = []
    for receipt in dict.fromkeys(receipts):
        if isinstance(receipt, str):
            distinct.append(receipt)
        else:  # as the library answers it, without a request
            failures[receipt] = errors.InvalidArgument(f"not a dirmq receipt: {str(receipt)!r}")
    document: dict[str, Any] = {}
    if duration_s is not None:
        document[_SETTLE_DURATION[action]] = seconds(duration_s)
    path = f"{queue_path(name)}/messages/{action}"
    headers = {"Content-Type": b"application/json"}
    calls = [
        Call(
            "POST", path, headers=headers, body=_settle_body(distinct[i : i + MAX_SETTLE], document)
        )
        for i in range(0, len(distinct), MAX_SETTLE)
    ]
    return SettleMany(calls, failures)


def _settle_body(receipts: list[str], document: dict[str, Any]) -> bytes:
    return json.dumps({"receipts": receipts, **document}, separators=(",", ":")).encode()


def settle_failures(answer: Answer) -> dict[str, Exception]:
    """The failures by receipt of a batch settle's answer, as the library's errors."""
    return {
        str(item["receipt"]): error_named(str(item["error"]), str(item["message"]))
        for item in answer.json()["failed"]
    }


def dead_letter_call(name: str, receipt: str, detail: str | None, reason: str) -> Call:
    params = {} if detail is None else {"reason": detail}
    if reason != "rejected":
        params["kind"] = reason
    path = _message_path(name, ref(receipt, need_receipt=True), "dead-letter")
    return Call("POST", path, params)


def settled_outcome(answer: Answer) -> str | None:
    """What a nack did (`X-Outcome`: returned, delayed, dead-lettered), if the server says."""
    return answer.header("x-outcome")


def delete_call(name: str, message_id: str) -> Call:
    """Delete by id; the server answers MessageNotFound if there is no such message."""
    return Call("DELETE", _message_path(name, ref(message_id, need_id=True)))


def peek_call(name: str, message_id: str) -> Call:
    return Call("GET", _message_path(name, ref(message_id, need_id=True)))


def peeked(answer: Answer) -> Message:
    return received(answer)[0]


MAX_BROWSE = 1000  # messages per browse answer: the server's cap


def browse_call(
    name: str, limit: int | None, after: str | None = None, state: str = "ready"
) -> Call:
    """Browse messages of `state` as JSON (`browsed`): one answer of at most 1000 (the server's
    cap), those after the message id `after` when given (the next page)."""
    count = MAX_BROWSE if limit is None else max(1, min(limit, MAX_BROWSE))
    params = {"peek": "1", "max": str(count)}
    if after is not None:
        params["after"] = ref(after, need_id=True)
    if state != "ready":
        params["state"] = state
    return Call("GET", queue_path(name) + "/messages", params)


def purge_call(name: str, dead: bool = False) -> Call:
    return Call("DELETE", queue_path(name) + "/messages", {"state": "dead"} if dead else {})


def purged(answer: Answer) -> int:
    return int(answer.json()["purged"])
