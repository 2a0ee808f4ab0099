"""The stream client's frame splitter (`dirmq.client.frames`) against wsproto alone.

Whatever the server sends and however the socket cuts it, a client reading through the splitter
must see what wsproto alone would have made of the same bytes: the same deliveries, reports,
pings and closes in the same order, and the same refusal of a frame wsproto refuses.
"""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto.connection import Connection, ConnectionType
from wsproto.events import (
    CloseConnection,
    Message,
    Ping,
    Pong,
    TextMessage,
)

from dirmq.client.frames import FrameSplitter

Seen = list[tuple[str, Any]]


def frame(first: int, payload: bytes, *, mask: bytes | None = None, width: int = 0) -> bytes:
    """A frame as a server writes it: `width` forces the 2- or 8-byte length form."""
    length = len(payload)
    mask_bit = 0x80 if mask is not None else 0
    if width == 8 or (not width and length > 0xFFFF):
        head = bytes([first, mask_bit | 127]) + struct.pack("!Q", length)
    elif width == 2 or (not width and length > 125):
        head = bytes([first, mask_bit | 126]) + struct.pack("!H", length)
    else:
        head = bytes([first, mask_bit | length])
    if mask is None:
        return head + payload
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


def take(events: Any, seen: Seen, parts: list[Any]) -> None:
    """Events as whole messages (how wsproto cuts a message into events depends on the reads)."""
    for event in events:
        if isinstance(event, Message):
            parts.append(event.data)
            if event.message_finished:
                kind = "text" if isinstance(event, TextMessage) else "bytes"
                joined = "".join(parts) if kind == "text" else b"".join(map(bytes, parts))
                seen.append((kind, joined))
                parts.clear()
        elif isinstance(event, Ping | Pong):
            seen.append((type(event).__name__, bytes(event.payload)))
        elif isinstance(event, CloseConnection):
            seen.append(("close", event.code))
        else:
            seen.append((type(event).__name__, None))


def through_wsproto(stream: bytes) -> Seen:
    ws = Connection(ConnectionType.CLIENT)
    seen: Seen = []
    ws.receive_data(stream)
    take(ws.events(), seen, [])
    return seen


def through_splitter(stream: bytes, cuts: list[int]) -> Seen:
    ws = Connection(ConnectionType.CLIENT)
    splitter = FrameSplitter(ws)
    seen: Seen = []
    parts: list[Any] = []
    at = 0
    for cut in [*sorted(cuts), len(stream)]:
        for payload in splitter.feed(stream[at:cut]):
            if payload is None:
                take(ws.events(), seen, parts)
            else:
                seen.append(("bytes", payload))
        at = cut
    return seen


def until_closed(seen: Seen) -> Seen:
    """What a client acts on: the events up to the first close (after a refused frame, the
    client ends the stream; what wsproto might make of later bytes is read by nobody)."""
    for at, (kind, _value) in enumerate(seen):
        if kind == "close":
            return seen[: at + 1]
    return seen


GOOD_FRAMES = st.one_of(
    st.binary(max_size=300).map(lambda b: frame(0x82, b)),  # a delivery
    st.binary(min_size=126, max_size=400).map(lambda b: frame(0x82, b, width=2)),
    st.binary(min_size=70_000, max_size=70_001).map(lambda b: frame(0x82, b)),
    st.text(max_size=80).map(lambda t: frame(0x81, t.encode())),  # a report
    st.binary(max_size=125).map(lambda b: frame(0x89, b)),  # ping
    st.binary(max_size=125).map(lambda b: frame(0x8A, b)),  # pong
    st.lists(st.binary(max_size=50), min_size=2, max_size=4).map(  # a fragmented delivery
        lambda parts: b"".join(
            frame((0x02 if i == 0 else 0x00) | (0x80 if i == len(parts) - 1 else 0), part)
            for i, part in enumerate(parts)
        )
    ),
)
BAD_FRAMES = st.sampled_from(
    [
        frame(0x82, b"masked", mask=b"\x01\x02\x03\x04"),  # a server must not mask
        frame(0x82, b"short", width=2),  # a length not in its shortest form
        frame(0x82, b"x" * 200, width=8),
        frame(0xC2, b"rsv1"),  # a reserved bit
        frame(0x83, b"opcode 3"),  # a reserved opcode
        frame(0x09, b"a fragmented ping"),
        frame(0x89, b"p" * 126, width=2),  # a control frame over 125 bytes
        frame(0x80, b"a continuation of nothing"),
        frame(0x02, b"begun") + frame(0x82, b"a new message before the end"),
        bytes([0x82, 127]) + struct.pack("!Q", 1 << 63),  # no such length
    ]
)
CLOSE = frame(0x88, struct.pack("!H", 1000) + b"bye")


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(GOOD_FRAMES, max_size=8),
    bad=st.one_of(st.none(), BAD_FRAMES),
    close=st.booleans(),
    data=st.data(),
)
def test_the_splitter_sees_what_wsproto_alone_sees_however_the_reads_cut_the_stream(
    frames: list[bytes], bad: bytes | None, close: bool, data: st.DataObject
) -> None:
    stream = b"".join(frames) + (bad or b"") + (CLOSE if close else b"")
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    assert until_closed(through_splitter(stream, cuts)) == until_closed(through_wsproto(stream))


def test_a_delivery_frame_is_handed_out_without_wsproto() -> None:
    class Refuses:
        def receive_data(self, data: bytes | None) -> None:
            raise AssertionError(f"wsproto was given {data!r}")

    splitter = FrameSplitter(Refuses())
    stream = frame(0x82, b"one") + frame(0x82, b"t" * 300) + frame(0x82, b"x" * 70_000)
    got = list(splitter.feed(stream[:7])) + list(splitter.feed(stream[7:]))
    assert got == [b"one", b"t" * 300, b"x" * 70_000]


def test_a_frame_wsproto_refuses_by_its_header_is_not_waited_for() -> None:
    """A header announcing 2**62 bytes with a reserved bit set: wsproto closes at once (1002),
    and so must the splitter, rather than wait for the payload."""
    ws = Connection(ConnectionType.CLIENT)
    splitter = FrameSplitter(ws)
    header = bytes([0xC2, 127]) + struct.pack("!Q", 1 << 62)
    assert list(splitter.feed(frame(0x82, b"before") + header)) == [b"before", None]
    assert [type(e) for e in ws.events()] == [CloseConnection]
    assert splitter.raw
