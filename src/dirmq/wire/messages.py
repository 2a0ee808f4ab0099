"""Messages to and from HTTP: which request headers are stored with a message, how a delivered
message is described in response headers, and the two batch formats (multipart/mixed and JSON
lines)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable

from dirmq.errors import InvalidArgument
from dirmq.store import Message, OutgoingMessage
from dirmq.store.deadletters import format_time, parse_time
from dirmq.store.message import DeadLetter, LeaseHolder
from dirmq.wire import framing, jsondoc
from dirmq.wire.durations import parse_duration

STORED_HEADERS = frozenset({"content-type", "content-encoding"})
STORED_PREFIX = "x-attr-"
DEFAULT_CONTENT_TYPE = "application/octet-stream"
# What a JSON-lines batch line may hold (another key is refused: a misspelt "dealy" would
# otherwise publish a message ready now).
JSON_LINE_KEYS = (
    "body",
    "body_base64",
    "headers",
    "delay",
    "dedup_id",
    "group",
    "ttl",
    "priority",
)


def stored_headers(raw_headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers kept with a published message: Content-Type, Content-Encoding, X-Attr-*."""
    kept: dict[str, str] = {}
    for name, value in raw_headers:
        lowered = name.lower()
        if lowered == "content-type" and not value.strip():
            continue  # no media type: stored, it would come back as a malformed header
        if lowered in STORED_HEADERS:
            kept["-".join(p.capitalize() for p in lowered.split("-"))] = value
        elif lowered.startswith(STORED_PREFIX):
            kept[name] = value
    return kept


def parse_priority(value: object, what: str = "priority") -> int:
    """A publish's priority as given (a decimal string, or an int from JSON): its range is the
    queue's (`priorities.check_priority`), checked where the message is validated."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 3:
        return int(value)
    raise InvalidArgument(
        f"{what} must be an integer from 0 to the queue's priority_levels - 1, got "
        f"{str(value)[:40]!r}"
    )


def delivery_headers(message: Message) -> list[tuple[str, str]]:
    """Response headers describing a delivered (or peeked) message, then its stored headers."""
    headers = [("X-Message-Id", message.id), ("X-Receive-Count", str(message.receive_count))]
    headers.append(("X-Published-At", f"{message.published_at_s:.6f}"))
    if message.receipt is not None:
        headers.append(("X-Receipt", message.receipt))
    if message.lease_deadline_s is not None:
        headers.append(("X-Lease-Deadline", f"{message.lease_deadline_s:.3f}"))
    if message.group is not None:
        headers.append(("X-Group", message.group))
    if message.priority:  # absent: 0, as in a queue of one level
        headers.append(("X-Priority", str(message.priority)))
    if message.dead is not None:
        headers.extend(dead_headers(message.dead))
    # No Content-Type is invented: a message published without one is delivered without one.
    headers.extend(message.headers.items())
    return headers


# A dead letter's provenance (docs/FORMAT.md "Dead letters"), named as on every native answer.
DEAD_HEADERS = (
    "x-dead-reason",
    "x-dead-source",
    "x-dead-receive-count",
    "x-dead-at",
    "x-dead-detail",
)


def dead_headers(dead: DeadLetter) -> list[tuple[str, str]]:
    """`X-Dead-Reason`, `-Source`, `-Receive-Count`, `-At` (RFC 3339) and, if a consumer
    gave one, `-Detail`."""
    headers = [
        ("X-Dead-Reason", dead.reason),
        ("X-Dead-Source", dead.source),
        ("X-Dead-Receive-Count", str(dead.receive_count)),
        ("X-Dead-At", format_time(dead.at_s)),
    ]
    if dead.detail is not None:
        headers.append(("X-Dead-Detail", dead.detail))
    return headers


def parse_dead_headers(own: dict[str, str]) -> DeadLetter | None:
    """The provenance in a delivery's headers (lower-cased names), or None."""
    reason = own.get("x-dead-reason")
    if reason is None:
        return None
    count = own.get("x-dead-receive-count", "0")
    return DeadLetter(
        reason=reason,
        source=own.get("x-dead-source", ""),
        receive_count=int(count) if count.isascii() and count.isdigit() else 0,
        at_s=parse_time(own.get("x-dead-at", "")),
        detail=own.get("x-dead-detail"),
    )


def dead_json(dead: DeadLetter) -> dict[str, object]:
    data: dict[str, object] = {
        "reason": dead.reason,
        "source": dead.source,
        "receive_count": dead.receive_count,
        "at": format_time(dead.at_s),
    }
    if dead.detail is not None:
        data["detail"] = dead.detail
    return data


def dead_from_json(data: object) -> DeadLetter | None:
    if not isinstance(data, dict):
        return None
    return DeadLetter(
        reason=str(data.get("reason", "")),
        source=str(data.get("source", "")),
        receive_count=int(data.get("receive_count", 0)),
        at_s=parse_time(str(data.get("at", ""))),
        detail=None if data.get("detail") is None else str(data["detail"]),
    )


def holder_json(holder: LeaseHolder) -> dict[str, object]:
    """Who holds a lease, for browse: `known` false (and nothing else but a `token` the name
    carried) when the store cannot tell (docs/FORMAT.md, "Lease holders")."""
    data: dict[str, object] = {"known": holder.known}
    for key, value in (
        ("token", holder.token),
        ("label", holder.label),
        ("host", holder.host),
        ("pid", holder.pid),
        ("program", holder.program),
    ):
        if value is not None:
            data[key] = value
    if holder.created_s is not None:
        data["since"] = format_time(holder.created_s)
    return data


def holder_from_json(data: object) -> LeaseHolder | None:
    if not isinstance(data, dict):
        return None

    def text(key: str) -> str | None:
        value = data.get(key)
        return value if isinstance(value, str) else None

    pid = data.get("pid")
    since = text("since")
    return LeaseHolder(
        token=text("token"),
        label=text("label"),
        host=text("host"),
        pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
        program=text("program"),
        created_s=None if since is None else parse_time(since),
        known=data.get("known") is True,
    )


def multipart_messages(messages: list[Message]) -> tuple[str, bytes]:
    """(Content-Type, body) of a multipart/mixed response holding `messages`: byte for byte
    `framing.multipart_body` of each one's `delivery_headers` and body. A leased message in no
    group, of level 0 and no dead letter (a batch receive's every message, as a rule) has its
    part's head written in one format string, not a list of header pairs joined: a batch of 50
    is built once, in pieces joined once."""
    boundary = framing.new_boundary()
    delimiter = f"--{boundary}\r\n"
    pieces: list[bytes] = []
    append = pieces.append
    for m in messages:
        if (
            m.receipt is not None
            and m.lease_deadline_s is not None
            and m.group is None
            and not m.priority
            and m.dead is None
        ):
            head = (
                f"{delimiter}X-Message-Id: {m.id}\r\nX-Receive-Count: {m.receive_count}\r\n"
                f"X-Published-At: {m.published_at_s:.6f}\r\nX-Receipt: {m.receipt}\r\n"
                f"X-Lease-Deadline: {m.lease_deadline_s:.3f}\r\n"
            )
            for name, value in m.headers.items():
                head += f"{name}: {value}\r\n"
        else:
            head = delimiter + "".join(f"{n}: {v}\r\n" for n, v in delivery_headers(m))
        append(f"{head}\r\n".encode())
        append(m.body)
        append(b"\r\n")
    append(framing.multipart_end(boundary))
    return f'multipart/mixed; boundary="{boundary}"', b"".join(pieces)


def parse_batch(content_type: str, body: bytes) -> list[OutgoingMessage]:
    """The messages of a batch publish body; InvalidArgument says what is wrong with which."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "multipart/mixed":
        messages = []
        for index, (headers, part_body) in enumerate(framing.parse_multipart(content_type, body)):
            delay = _part_delay(headers, index)
            lowered = {k.lower(): v for k, v in headers.items()}
            messages.append(
                OutgoingMessage(
                    part_body,
                    stored_headers(headers.items()),
                    delay,
                    lowered.get("x-dedup-id"),
                    lowered.get("x-group"),
                    ttl_s=_part_duration(lowered, "x-ttl", f"X-TTL of part {index}"),
                    priority=_part_priority(lowered, index),
                )
            )
        return messages
    if kind in ("application/x-ndjson", "application/jsonl", "application/json-lines"):
        return [_json_line(line, i) for i, line in enumerate(body.splitlines()) if line.strip()]
    raise InvalidArgument(f"not a batch content type: {kind!r}")


def is_batch(content_type: str | None) -> bool:
    if not content_type:
        return False
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind in (
        "multipart/mixed",
        "application/x-ndjson",
        "application/jsonl",
        "application/json-lines",
    )


def _part_priority(lowered: dict[str, str], index: int) -> int:
    value = lowered.get("x-priority")
    return 0 if value is None else parse_priority(value, f"X-Priority of part {index}")


def _part_delay(headers: dict[str, str], index: int) -> float | None:
    for name, value in headers.items():
        if name.lower() == "x-delay":
            return parse_duration(value, f"X-Delay of part {index}")
    return None


def _part_duration(lowered: dict[str, str], name: str, what: str) -> float | None:
    value = lowered.get(name)
    return None if value is None else parse_duration(value, what)


def _json_line(line: bytes, index: int) -> OutgoingMessage:
    try:
        item = jsondoc.loads(line)
    except ValueError as exc:
        raise InvalidArgument(f"line {index + 1} is not JSON: {exc}") from exc
    if not isinstance(item, dict):
        raise InvalidArgument(f"line {index + 1} must be a JSON object")
    for key in item:
        if key not in JSON_LINE_KEYS:
            raise InvalidArgument(
                f"line {index + 1}: unknown key {key[:100]!r}; a line takes "
                + ", ".join(JSON_LINE_KEYS)
            )
    if "body_base64" in item:
        try:
            body = base64.b64decode(str(item["body_base64"]), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise InvalidArgument(f"line {index + 1}: body_base64 is not base64") from exc
    elif isinstance(item.get("body"), str):
        body = item["body"].encode("utf-8")
    else:
        raise InvalidArgument(f"line {index + 1} needs a string 'body' or 'body_base64'")
    headers = item.get("headers", {})
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidArgument(f"line {index + 1}: 'headers' must map names to strings")
    headers = {k: v for k, v in headers.items() if k.lower() != "content-type" or v.strip()}
    delay = item.get("delay")
    delay_s = None if delay is None else parse_duration(str(delay), f"delay of line {index + 1}")
    dedup_id, group = item.get("dedup_id"), item.get("group")
    for key, value in (("dedup_id", dedup_id), ("group", group)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgument(f"line {index + 1}: {key!r} must be a string")
    ttl = item.get("ttl")
    ttl_s = None if ttl is None else parse_duration(str(ttl), f"ttl of line {index + 1}")
    priority = item.get("priority")
    level = 0 if priority is None else parse_priority(priority, f"priority of line {index + 1}")
    return OutgoingMessage(body, headers, delay_s, dedup_id, group, ttl_s=ttl_s, priority=level)


def message_json(message: Message) -> dict[str, object]:
    """A message as JSON (browse): the body as UTF-8 text when it is, else base64."""
    data: dict[str, object] = {
        "id": message.id,
        "group": message.group,
        "receive_count": message.receive_count,
        "published_at": message.published_at_s,
        "state": message.state,
        "headers": message.headers,
    }
    if message.priority:
        data["priority"] = message.priority
    if message.dead is not None:
        data["dead"] = dead_json(message.dead)
    if message.holder is not None:
        data["holder"] = holder_json(message.holder)
    try:
        data["body"] = message.body.decode("utf-8")
    except UnicodeDecodeError:
        data["body_base64"] = base64.b64encode(message.body).decode("ascii")
    return data
