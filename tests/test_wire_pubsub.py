"""Pub/sub's wire format (`dirmq.wire.pubsub`): whatever the server encodes, the client decodes
back to the same value; whatever else a decoder is given, it answers with a ProtocolError that
names the problem (never a KeyError, TypeError or binascii.Error)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dirmq.errors import ProtocolError
from dirmq.pubsub.layout import is_delivery_key
from dirmq.pubsub.model import Delivery, Envelope, Mode, Outcome, Persistence, Published
from dirmq.pubsub.retained import ABSENT, DAMAGED, LostEntry, RetainedItem
from dirmq.pubsub.transitions import Entry
from dirmq.wire import pubsub as wire

texts = st.text(max_size=40)
counts = st.integers(min_value=0, max_value=2**62)
seconds = st.floats(min_value=0, max_value=1e9, allow_nan=False, allow_infinity=False)
headers = st.dictionaries(texts, texts, max_size=4)
envelopes = st.builds(
    Envelope,
    id=texts,
    channel=texts,
    subject=texts,
    mode=st.sampled_from(Mode),
    published_us=counts,
    accept_timeout_s=seconds,
    process_timeout_s=seconds,
    persistence=st.sampled_from(Persistence),
    acks=st.frozensets(st.sampled_from(Outcome)),
    reply_to=st.none() | texts,
)
deliveries = st.builds(
    Delivery,
    key=st.from_regex(r"[0-9]{16}_[A-Za-z0-9_-]{1,128}(\+[rb][0-9]+)?", fullmatch=True),
    envelope=envelopes,
    body=st.binary(max_size=256),
    headers=headers,
    deadline_ms=counts,
    seq=st.none() | counts,
)
entries = st.tuples(counts, st.builds(Entry, envelopes, st.binary(max_size=256), headers))
lost = st.builds(
    LostEntry, counts, st.sampled_from([ABSENT, DAMAGED]), st.none() | st.text(max_size=40)
)
retained_items: st.SearchStrategy[RetainedItem] = entries | lost


def _frames(stream: bytes) -> list[tuple[str, str]]:
    return list(wire.read_events(stream.decode().split("\n")))


# -- round trips ---------------------------------------------------------------------------------
@given(deliveries)
def test_a_delivery_event_round_trips(delivery: Delivery) -> None:
    assert is_delivery_key(delivery.key)
    frame = wire.message_event(delivery)
    assert frame.isascii()  # one line of JSON whatever the text: nothing can break the frame
    assert _frames(frame) == [(wire.MESSAGE, wire.encode_delivery(delivery))]
    assert f"\nid: {delivery.key}\n".encode() in frame
    assert wire.decode_delivery(_frames(frame)[0][1]) == delivery


@given(texts, counts)
def test_the_attached_event_round_trips(name: str, cursor: int) -> None:
    attached = wire.Attached(name, cursor)
    [(event, data)] = _frames(wire.attached_event(attached))
    assert event == wire.ATTACHED
    assert wire.decode_attached(data) == attached


@given(st.lists(retained_items, max_size=6))
def test_a_retained_page_round_trips(items: list[RetainedItem]) -> None:
    body = b"".join(wire.encode_retained(item) + b"\n" for item in items)
    assert wire.decode_page(body) == items
    for item in items:
        assert wire.decode_retained(wire.encode_retained(item)) == item


@given(texts, st.sampled_from(Mode), st.none() | counts, st.none() | counts)
def test_the_publish_answer_round_trips(
    message_id: str, mode: Mode, seq: int | None, subscribers: int | None
) -> None:
    published = Published(message_id, mode, seq, subscribers)
    body = json.dumps(wire.encode_published(published)).encode()
    assert wire.decode_published(body) == published


@given(counts)
def test_the_heartbeat_answer_and_the_page_headers_round_trip(number: int) -> None:
    assert wire.decode_deadline(json.dumps(wire.encode_deadline(number))) == number
    found = dict(wire.page_headers(number, number + 1, number + 2))
    assert found["Content-Type"] == wire.NDJSON
    for name, expected in (
        (wire.NEXT_SEQ_HEADER, number),
        (wire.HEAD_HEADER, number + 1),
        (wire.MISSING_COUNT_HEADER, number + 2),
    ):
        assert wire.decode_count_header(name, found[name]) == expected


def test_the_encoding_is_the_documented_one() -> None:
    """Field order and spelling as docs/http-api.md shows them (clients in other languages
    parse this)."""
    acks = frozenset({Outcome.DONE, Outcome.ACCEPTED})
    envelope = Envelope(
        "m1", "orders", "eu.fr", Mode.FUTURE, 1795302311289153, 60.0, 30.0,
        Persistence.WRITETHROUGH, acks, "shop/outcomes",
    )  # fmt: skip
    line = wire.encode_retained((3, Entry(envelope, b"v3", {"Content-Type": "text/plain"})))
    assert line == (
        b'{"seq":3,"id":"m1","channel":"orders","subject":"eu.fr","mode":"future",'
        b'"headers":{"Content-Type":"text/plain"},"body_base64":"djM=",'
        b'"published_us":1795302311289153,"accept_timeout_s":60.0,"process_timeout_s":30.0,'
        b'"persistence":"writethrough","acks":["accepted","done"],"reply_to":"shop/outcomes"}'
    )
    assert wire.encode_retained(LostEntry(2, ABSENT)) == b'{"seq":2,"missing":"absent"}'
    damaged = LostEntry(4, DAMAGED, "bad crc")
    assert wire.encode_retained(damaged) == b'{"seq":4,"missing":"damaged","error":"bad crc"}'
    delivery = Delivery("1795302311289153_m1+r3", envelope, b"v3", {}, 1795302371289, 3)
    assert wire.message_event(delivery) == (
        b"event: message\nid: 1795302311289153_m1+r3\ndata: "
        + wire.encode_delivery(delivery).encode()
        + b"\n\n"
    )
    assert wire.encode_delivery(delivery).startswith(
        '{"key":"1795302311289153_m1+r3","id":"m1","channel":"orders","subject":"eu.fr",'
        '"mode":"future","seq":3,"deadline_ms":1795302371289,"headers":{},"body_base64":"djM=",'
        '"published_us":1795302311289153,'
    )
    assert wire.attached_event(wire.Attached("s", 1)) == (
        b'event: attached\ndata: {"name":"s","cursor":1}\n\n'
    )


def test_events_skip_comments_and_join_data_lines() -> None:
    lines = [
        ": keepalive",
        "",
        "event: attached",
        'data: {"name":"s",',
        'data: "cursor":1}',
        "",
        "data:no space",
        "",
        "",
    ]
    assert list(wire.read_events(lines)) == [
        ("attached", '{"name":"s",\n"cursor":1}'),
        ("message", "no space"),
    ]
    assert list(wire.read_events(wire.KEEPALIVE.decode().split("\n"))) == []


# -- hostile input -------------------------------------------------------------------------------
def _valid_delivery() -> dict[str, Any]:
    envelope = Envelope("m1", "c", "s", Mode.ANYONE, 1, 1.0, 2.0, Persistence.NONE)
    delivery = Delivery("0000000000000001_m1", envelope, b"x", {"A": "b"}, 5, None)
    document: dict[str, Any] = json.loads(wire.encode_delivery(delivery))
    return document


def _valid_retained() -> dict[str, Any]:
    envelope = Envelope("m1", "c", "s", Mode.FUTURE, 1, 1.0, 2.0, Persistence.NONE)
    document: dict[str, Any] = json.loads(wire.encode_retained((1, Entry(envelope, b"x", {}))))
    return document


# (decoder, a valid document, its optional fields: null or absent)
DECODERS: list[tuple[Callable[[str], object], Callable[[], dict[str, Any]], set[str]]] = [
    (wire.decode_delivery, _valid_delivery, {"reply_to", "seq"}),
    (wire.decode_retained, _valid_retained, {"reply_to"}),
    (wire.decode_attached, lambda: {"name": "s", "cursor": 1}, set()),
    (
        wire.decode_published,
        lambda: {"id": "m", "mode": "future", "seq": 1, "subscribers": None},
        {"seq", "subscribers"},
    ),
    (wire.decode_deadline, lambda: {"deadline_ms": 1}, set()),
]
# A value of another type (or out of range) for every kind of field some decoder reads.
WRONG = [None, True, -1, 1.5, float("nan"), "x", "", [], ["done", 1], {}, {"a": 1}]


@pytest.mark.parametrize("decode", [d for d, _, _ in DECODERS])
@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        b"\xff\xfe",
        "[]",
        "null",
        '"a string"',
        "1e400",
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 100 + "1" + "}" * 100,
        '{"seq": ' + "9" * 5000 + "}",
    ],
)
def test_what_is_not_a_json_object_is_refused(
    decode: Callable[[str | bytes], object], text: str | bytes
) -> None:
    with pytest.raises(ProtocolError):
        decode(text)


@pytest.mark.parametrize(("decode", "valid", "optional"), DECODERS)
def test_every_field_missing_or_of_another_type_is_named(
    decode: Callable[[str], object], valid: Callable[[], dict[str, Any]], optional: set[str]
) -> None:
    assert decode(json.dumps(valid())) is not None
    for name in valid():
        document = valid()
        del document[name]
        if name in optional:
            decode(json.dumps(document))
            continue
        with pytest.raises(ProtocolError, match=f"no '{name}' field"):
            decode(json.dumps(document))
        for wrong in WRONG:
            document[name] = wrong
            try:
                decode(json.dumps(document))
            except ProtocolError as exc:
                assert repr(name) in str(exc)
            # A few values fit some fields: "" is a channel, [] no acks, {} no headers.


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("key", "../../x", "a delivery key"),
        ("key", "0000000000000001_m1+r1\ninjected: 1", "a delivery key"),
        ("body_base64", "not base64!", "base64"),
        ("body_base64", "YQ", "base64"),  # no padding
        ("body_base64", "é", "base64"),
        ("mode", "sometimes", "one of anyone, everyone, future"),
        ("persistence", "forever", "one of"),
        ("acks", ["done", "maybe"], "a list of"),
        ("acks", "done", "a list of"),
        ("accept_timeout_s", float("inf"), "finite"),
        ("process_timeout_s", -0.5, "0 or more"),
        ("deadline_ms", True, "an integer"),
        ("deadline_ms", 1.0, "an integer"),
        ("published_us", -1, "0 or more"),
        ("headers", {"A": 1}, "an object of strings"),
        ("headers", ["A", "b"], "an object of strings"),
        ("seq", "7", "an integer"),
    ],
)
def test_hostile_values_in_a_delivery_are_refused_by_name(
    field: str, value: object, expected: str
) -> None:
    document = _valid_delivery()
    document[field] = value
    with pytest.raises(ProtocolError, match=f"'{field}' must be .*{expected}"):
        wire.decode_delivery(json.dumps(document))


def test_a_retained_marker_is_checked_too() -> None:
    assert wire.decode_retained('{"seq":2,"missing":"absent"}') == LostEntry(2, ABSENT)
    for bad in ('{"seq":2,"missing":5}', '{"seq":-2,"missing":"absent"}', '{"missing":"x"}'):
        with pytest.raises(ProtocolError):
            wire.decode_retained(bad)
    with pytest.raises(ProtocolError, match="'error' must be a string"):
        wire.decode_retained('{"seq":2,"missing":"damaged","error":[1]}')
    with pytest.raises(ProtocolError):
        wire.decode_page(b'{"seq":1,"missing":"absent"}\nnot json\n')


@pytest.mark.parametrize("value", [None, "", "-1", "1.5", " 1", "1e3", "\u00b2", "\u0661", "0x1"])
def test_a_count_header_must_be_ascii_digits(value: str | None) -> None:
    with pytest.raises(ProtocolError, match="X-Next-Seq"):
        wire.decode_count_header(wire.NEXT_SEQ_HEADER, value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


@given(st.data())
def test_any_mutation_of_a_valid_document_decodes_or_is_a_protocol_error(
    data: st.DataObject,
) -> None:
    decode, valid, _optional = data.draw(st.sampled_from(DECODERS))
    document = valid()
    for name in data.draw(st.lists(st.sampled_from(sorted(document)), max_size=3)):
        document[name] = data.draw(json_values)
    try:
        decode(json.dumps(document))
    except ProtocolError:
        pass


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_a_protocol_error(raw: bytes) -> None:
    for decode, _valid, _optional in DECODERS:
        try:
            decode(raw)  # type: ignore[arg-type]
        except ProtocolError:
            pass
    try:
        wire.decode_page(raw)
    except ProtocolError:
        pass
