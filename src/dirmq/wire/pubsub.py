"""Pub/sub on the wire (`/@pubsub`): the server-sent events of a subscription, a delivery and a
retained entry as JSON (the body in base64), the answers to a publish and a heartbeat, and the
retained page's lines and headers. Each encoder (the server's) sits beside its decoder (the
client's, and the Spark source's through it), and each field is named once, below.

A decoder trusts nothing it is given: text that is not what the encoder writes (not JSON, nested
too deep, a field missing or of another type, bad base64, a mode or outcome unknown, a number
negative or not finite) raises `ProtocolError` naming the field, never KeyError or TypeError.
Pure functions; no sockets.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import reprlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from dirmq.errors import ProtocolError
from dirmq.pubsub.layout import is_delivery_key
from dirmq.pubsub.model import Delivery, Envelope, Mode, Outcome, Persistence, Published
from dirmq.pubsub.retained import LostEntry, RetainedItem
from dirmq.pubsub.transitions import Entry
from dirmq.wire import jsondoc

_E = TypeVar("_E", bound=StrEnum)

# -- field names (the one place each is spelt) ---------------------------------------------------
KEY = "key"
ID = "id"
CHANNEL = "channel"
SUBJECT = "subject"
MODE = "mode"
SEQ = "seq"
DEADLINE_MS = "deadline_ms"
HEADERS = "headers"
BODY_BASE64 = "body_base64"
PUBLISHED_US = "published_us"
ACCEPT_TIMEOUT_S = "accept_timeout_s"
PROCESS_TIMEOUT_S = "process_timeout_s"
PERSISTENCE = "persistence"
ACKS = "acks"
REPLY_TO = "reply_to"
MISSING = "missing"  # a retained line for an entry that cannot be read: why
ERROR = "error"
NAME = "name"
CURSOR = "cursor"
SUBSCRIBERS = "subscribers"
HEAD = "head"

# -- the event stream (`GET /@pubsub/subscribe`) -------------------------------------------------
EVENT_STREAM = "text/event-stream"
SSE_HEADERS = [
    ("Content-Type", EVENT_STREAM),
    ("Cache-Control", "no-cache"),
    ("X-Accel-Buffering", "no"),  # proxies such as nginx must not hold events back
]
ATTACHED = "attached"  # the first event: the subscription's name and retained cursor
MESSAGE = "message"  # one per delivery, its id the delivery key
KEEPALIVE = b": keepalive\n\n"  # a comment, every 15 s of silence

# -- the retained log (`GET /@pubsub/retained`, `/retained/head`) --------------------------------
NDJSON = "application/x-ndjson"
NEXT_SEQ_HEADER = "X-Next-Seq"  # where the next page starts
HEAD_HEADER = "X-Retained-Head"  # the log's head when the page was read
MISSING_COUNT_HEADER = "X-Missing-Count"  # how many MISSING lines the page holds


def _dumps(data: object) -> str:
    # Compact, and always one line: json.dumps escapes every control character.
    return json.dumps(data, separators=(",", ":"))


# -- envelope (shared by deliveries and retained entries) ----------------------------------------
def _envelope_head(envelope: Envelope) -> dict[str, object]:
    return {
        ID: envelope.id,
        CHANNEL: envelope.channel,
        SUBJECT: envelope.subject,
        MODE: envelope.mode.value,
    }


def _envelope_rest(envelope: Envelope) -> dict[str, object]:
    """The rest of the envelope, so a client can rebuild the library's `Delivery` or `Entry`."""
    return {
        PUBLISHED_US: envelope.published_us,
        ACCEPT_TIMEOUT_S: envelope.accept_timeout_s,
        PROCESS_TIMEOUT_S: envelope.process_timeout_s,
        PERSISTENCE: envelope.persistence.value,
        ACKS: sorted(a.value for a in envelope.acks),
        REPLY_TO: envelope.reply_to,
    }


def _body(body: bytes) -> str:
    return base64.b64encode(body).decode("ascii")


def _decode_envelope(doc: _Document) -> Envelope:
    return Envelope(
        id=doc.text(ID),
        channel=doc.text(CHANNEL),
        subject=doc.text(SUBJECT),
        mode=doc.choice(MODE, Mode),
        published_us=doc.count(PUBLISHED_US),
        accept_timeout_s=doc.seconds(ACCEPT_TIMEOUT_S),
        process_timeout_s=doc.seconds(PROCESS_TIMEOUT_S),
        persistence=doc.choice(PERSISTENCE, Persistence),
        acks=frozenset(doc.choices(ACKS, Outcome)),
        reply_to=doc.optional_text(REPLY_TO),
    )


# -- server-sent events --------------------------------------------------------------------------
def event(name: str, data: str, event_id: str | None = None) -> bytes:
    """One server-sent event; `data` must be one line (JSON from `_dumps` is)."""
    lines = [f"event: {name}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append("data: " + data)
    return ("\n".join(lines) + "\n\n").encode()


def read_events(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(event, data) of each server-sent event in `lines` (without their line ends); comments
    (keep-alives) are skipped.

    Parsed here rather than with httpx-sse: the stream is our own server's (one-line `data`,
    `event`, `id`, comments), which takes these few lines, and it spares a dependency."""
    name, data = MESSAGE, list[str]()
    for line in lines:
        if not line:
            if data:
                yield name, "\n".join(data)
            name, data = MESSAGE, list[str]()
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)


@dataclass(frozen=True, slots=True)
class Attached:
    name: str  # the subscription's name (an anonymous one's is made up by the server)
    cursor: int  # the next retained sequence number it will look at


def attached_event(attached: Attached) -> bytes:
    return event(ATTACHED, _dumps({NAME: attached.name, CURSOR: attached.cursor}))


def decode_attached(data: str | bytes) -> Attached:
    doc = _Document.parse(data, "the attached event")
    return Attached(doc.text(NAME), doc.count(CURSOR))


def encode_delivery(delivery: Delivery) -> str:
    """A delivery as one line of JSON: what a `message` event carries."""
    envelope = delivery.envelope
    head = _envelope_head(envelope)
    return _dumps(
        {
            KEY: delivery.key,
            **head,
            SEQ: delivery.seq,
            DEADLINE_MS: delivery.deadline_ms,
            HEADERS: delivery.headers,
            BODY_BASE64: _body(delivery.body),
            **_envelope_rest(envelope),
        }
    )


def message_event(delivery: Delivery) -> bytes:
    return event(MESSAGE, encode_delivery(delivery), delivery.key)


def decode_delivery(data: str | bytes) -> Delivery:
    doc = _Document.parse(data, "a delivery")
    return Delivery(
        key=doc.delivery_key(KEY),
        envelope=_decode_envelope(doc),
        body=doc.base64(BODY_BASE64),
        headers=doc.text_map(HEADERS),
        deadline_ms=doc.count(DEADLINE_MS),
        seq=doc.optional_count(SEQ),
    )


# -- answers -------------------------------------------------------------------------------------
def encode_published(published: Published) -> dict[str, object]:
    """The answer to `POST /@pubsub/publish`, as a JSON document."""
    return {
        ID: published.id,
        MODE: published.mode.value,
        SEQ: published.seq,
        SUBSCRIBERS: published.subscribers,
    }


def decode_published(body: str | bytes) -> Published:
    doc = _Document.parse(body, "the publish answer")
    return Published(
        doc.text(ID),
        doc.choice(MODE, Mode),
        doc.optional_count(SEQ),
        doc.optional_count(SUBSCRIBERS),
    )


def encode_deadline(deadline_ms: int) -> dict[str, object]:
    """The answer to a heartbeat: the delivery's new deadline."""
    return {DEADLINE_MS: deadline_ms}


def decode_deadline(body: str | bytes) -> int:
    return _Document.parse(body, "the heartbeat answer").count(DEADLINE_MS)


def encode_head(head: int) -> dict[str, object]:
    """The answer to `GET /@pubsub/retained/head` (the same number is in HEAD_HEADER)."""
    return {HEAD: head}


# -- retained pages ------------------------------------------------------------------------------
def encode_retained(item: RetainedItem) -> bytes:
    """One line of a retained page (without its newline): an entry, or a MISSING marker."""
    if isinstance(item, LostEntry):
        marker: dict[str, object] = {SEQ: item.seq, MISSING: item.why}
        if item.error is not None:
            marker[ERROR] = item.error
        return _dumps(marker).encode()
    seq, entry = item
    envelope = entry.envelope
    line = {
        SEQ: seq,
        **_envelope_head(envelope),
        HEADERS: entry.headers,
        BODY_BASE64: _body(entry.body),
        **_envelope_rest(envelope),
    }
    return _dumps(line).encode()


def decode_retained(line: str | bytes) -> RetainedItem:
    doc = _Document.parse(line, "a retained line")
    seq = doc.count(SEQ)
    if MISSING in doc.data:
        return LostEntry(seq, doc.text(MISSING), doc.optional_text(ERROR))
    entry = Entry(_decode_envelope(doc), doc.base64(BODY_BASE64), doc.text_map(HEADERS))
    return seq, entry


def decode_page(body: bytes) -> list[RetainedItem]:
    """The lines of a retained page, in order (blank lines are ignored)."""
    return [decode_retained(line) for line in body.splitlines() if line.strip()]


def page_headers(next_seq: int, head: int, missing: int) -> list[tuple[str, str]]:
    return [
        ("Content-Type", NDJSON),
        (NEXT_SEQ_HEADER, str(next_seq)),
        (HEAD_HEADER, str(head)),
        (MISSING_COUNT_HEADER, str(missing)),
    ]


def decode_count_header(name: str, value: str | None) -> int:
    """The number in header `name` (NEXT_SEQ_HEADER, HEAD_HEADER...), whose `value` may be
    absent (None)."""
    if value is None or not (value.isascii() and value.isdigit()):
        raise ProtocolError(f"the server's answer has no valid {name} header: {value!r}")
    return int(value)


# -- decoding ------------------------------------------------------------------------------------
class _Document:
    """The fields of one JSON object a peer sent, each read as the type the encoder writes."""

    def __init__(self, data: dict[str, object], what: str) -> None:
        self.data = data
        self.what = what

    @classmethod
    def parse(cls, text: str | bytes, what: str) -> _Document:
        try:
            data = jsondoc.loads(text)
        except ValueError as exc:  # also jsondoc's InvalidArgument, and UnicodeDecodeError
            raise ProtocolError(f"{what} is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ProtocolError(f"{what} is not a JSON object: {_show(data)}")
        return cls(data, what)

    def _wrong(self, name: str, expected: str) -> ProtocolError:
        if name not in self.data:
            return ProtocolError(f"{self.what} has no {name!r} field")
        found = _show(self.data[name])
        return ProtocolError(f"{self.what}: {name!r} must be {expected}, not {found}")

    def text(self, name: str) -> str:
        value = self.data.get(name)
        if not isinstance(value, str):
            raise self._wrong(name, "a string")
        return value

    def delivery_key(self, name: str) -> str:
        # Checked: the client puts it back into the path of its settle requests.
        value = self.data.get(name)
        if not isinstance(value, str) or not is_delivery_key(value):
            raise self._wrong(name, "a delivery key")
        return value

    def optional_text(self, name: str) -> str | None:
        return None if self.data.get(name) is None else self.text(name)

    def count(self, name: str) -> int:
        value = self.data.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._wrong(name, "an integer, 0 or more")
        return value

    def optional_count(self, name: str) -> int | None:
        return None if self.data.get(name) is None else self.count(name)

    def seconds(self, name: str) -> float:
        value = self.data.get(name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value < 0
        ):
            raise self._wrong(name, "a finite number of seconds, 0 or more")
        return float(value)

    def choice(self, name: str, kind: type[_E]) -> _E:
        value = self.data.get(name)
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
        raise self._wrong(name, "one of " + ", ".join(kind))

    def choices(self, name: str, kind: type[_E]) -> list[_E]:
        values = self.data.get(name)
        if isinstance(values, list) and all(isinstance(v, str) for v in values):
            try:
                return [kind(v) for v in values]
            except ValueError:
                pass
        raise self._wrong(name, "a list of " + ", ".join(kind))

    def text_map(self, name: str) -> dict[str, str]:
        value = self.data.get(name)
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self._wrong(name, "an object of strings")
        return dict(value)

    def base64(self, name: str) -> bytes:
        text = self.text(name)
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raise self._wrong(name, "base64") from None


def _show(value: object) -> str:
    """A peer's value in an error message, cut short (it may be huge)."""
    return reprlib.repr(value)
