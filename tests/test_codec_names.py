"""Property tests of the message codec, queue names and file-name layout."""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dirmq
from dirmq.store import codec, layout
from dirmq.store.ids import is_id, new_id
from dirmq.store.names import queue_path, validate_queue_name

header_names = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True).filter(
    lambda n: (
        n.lower() not in ("content-length", "body-crc32") and not n.lower().startswith("dirmq-")
    )
)
header_values = st.text(
    # Any text an HTTP field value can carry back: no control character but tab.
    alphabet=st.characters(
        blacklist_characters="".join(map(chr, [*range(9), *range(10, 32), 127])),
        blacklist_categories=("Cs",),
    ),
    max_size=50,
)


@given(st.binary(max_size=4096), st.dictionaries(header_names, header_values, max_size=5))
def test_codec_round_trips_any_body_and_headers(body: bytes, headers: dict[str, str]) -> None:
    lowered = {k.lower() for k in headers}
    if len(lowered) != len(headers):
        return
    codec.check_headers(headers)
    decoded = codec.decode(codec.encode(body, headers, {"Slot": "7"}))
    assert decoded.body == body
    assert decoded.headers == headers
    assert decoded.system == {"Slot": "7"}


@given(st.binary(min_size=1, max_size=512), st.data())
def test_codec_detects_any_truncation(body: bytes, data: st.DataObject) -> None:
    encoded = codec.encode(body, {"Content-Type": "x"})
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(dirmq.CorruptMessage):
        codec.decode(encoded[:cut])


@given(st.binary(min_size=1, max_size=512), st.data())
def test_codec_detects_a_flipped_body_byte(body: bytes, data: st.DataObject) -> None:
    encoded = bytearray(codec.encode(body, {}))
    position = data.draw(
        st.integers(min_value=len(encoded) - len(body), max_value=len(encoded) - 1)
    )
    encoded[position] ^= 0x01
    with pytest.raises(dirmq.CorruptMessage):
        codec.decode(bytes(encoded))


@given(st.binary(max_size=4096), st.data())
def test_bare_messages_take_the_fast_path_and_keep_every_check(
    body: bytes, data: st.DataObject
) -> None:
    message_id = new_id()
    encoded = codec.encode(body, {}, message_id=message_id)
    decoded = codec.decode(encoded, message_id)
    assert (decoded.body, decoded.headers, decoded.system) == (body, {}, {"Id": message_id})
    with pytest.raises(dirmq.CorruptMessage):  # another message's file
        codec.decode(encoded, new_id())
    cut = data.draw(st.integers(min_value=0, max_value=len(encoded) - 1))
    with pytest.raises(dirmq.CorruptMessage):
        codec.decode(encoded[:cut], message_id)
    if body:
        flipped = bytearray(encoded)
        flipped[data.draw(st.integers(len(encoded) - len(body), len(encoded) - 1))] ^= 0x01
        with pytest.raises(dirmq.CorruptMessage):
            codec.decode(bytes(flipped), message_id)


def test_message_file_is_readable_with_cat() -> None:
    encoded = codec.encode(b"swordfish", {"Content-Type": "text/plain; charset=UTF-8"})
    assert encoded == (
        b"Dirmq-Format: 1\nContent-Length: 9\nBody-CRC32: "
        + f"{zlib.crc32(b'swordfish'):08x}".encode()
        + b"\nContent-Type: text/plain; charset=UTF-8\n\nswordfish"
    )


@given(st.text(max_size=60))
def test_any_accepted_name_stays_under_the_root(name: str) -> None:
    root = "/srv/dirmq-root"
    try:
        validate_queue_name(name)
    except dirmq.InvalidName:
        return
    path = os.path.normpath(queue_path(root, name))
    assert path.startswith(root + "/")
    assert "@" not in {seg[:1] for seg in name.split("/")}


@given(st.lists(st.from_regex(r"[a-z0-9 _.-]{1,12}", fullmatch=True), min_size=1, max_size=4))
def test_ordinary_nested_names_are_accepted(segments: list[str]) -> None:
    name = "/".join(segments)
    if any(s in (".", "..") for s in segments):
        with pytest.raises(dirmq.InvalidName):
            validate_queue_name(name)
    else:
        assert validate_queue_name(name) == name


def test_long_names_are_refused() -> None:
    with pytest.raises(dirmq.InvalidName, match="limit"):
        validate_queue_name("a/" * 600 + "a")
    with pytest.raises(dirmq.InvalidName, match="255"):
        validate_queue_name("x" * 256)


def test_state_names_round_trip() -> None:
    message_id = new_id()
    assert is_id(message_id)
    assert layout.parse_entry(layout.ready_name(message_id, 0)) == layout.Entry(message_id, 0, None)
    assert layout.parse_entry(layout.ready_name(message_id, 3)) == layout.Entry(message_id, 3, None)
    timed = layout.parse_entry(layout.timed_name(message_id, 2, 1_700_000_000_123))
    assert timed == layout.Entry(message_id, 2, 1_700_000_000_123)
    assert layout.parse_entry("garbage") is None
    assert layout.parse_receipt(f"{message_id}.2") == (message_id, 2)
    assert layout.parse_receipt(f"{message_id}/../x.2") is None


@pytest.mark.parametrize("digit", ["\u0661", "\u06f1", "\u0967", "\uff11"])  # each a "1"
def test_digits_outside_ascii_are_no_part_of_any_name(digit: str) -> None:
    """Python's `\\d` and `int()` accept any script's digits: a file named with them would
    have been read as a lease that no name dirmq makes could ever match (so never acked, nor
    expired by the name it is looked up by). Names, receipts, ids and durations are ASCII."""
    from dirmq.wire.durations import parse_duration

    message_id = new_id()
    assert layout.parse_entry(f"{message_id}.{digit}.1700000000123") is None
    assert layout.parse_entry(f"{message_id}.1.170000000012{digit}") is None
    assert layout.parse_entry(f"{message_id}.{digit}") is None
    assert layout.parse_receipt(f"{message_id}.{digit}") is None
    assert not is_id(digit + message_id[1:])
    assert not layout.is_bare_id(digit + message_id[1:])
    with pytest.raises(dirmq.InvalidArgument):
        parse_duration(f"{digit}s")
    with pytest.raises(dirmq.InvalidArgument):
        parse_duration(digit)


def test_ids_are_unique_and_ordered_under_threads() -> None:
    import threading

    out: list[list[str]] = [[] for _ in range(4)]

    def mint(slot: list[str]) -> None:
        slot.extend(new_id() for _ in range(5000))

    threads = [threading.Thread(target=mint, args=(slot,)) for slot in out]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for slot in out for i in slot]
    assert len(set(every)) == len(every)
    for slot in out:
        assert slot == sorted(slot)


@given(st.text(alphabet="ab/.@\\\x00é", max_size=12))
def test_a_remembered_verdict_on_a_name_is_the_verdict_again(name: str) -> None:
    """Names that pass are remembered (every request checks its queue's name twice): a name
    gets the same verdict and the same message each time, remembered or not, and a str
    subclass is judged as its text."""

    def verdict(candidate: str) -> str:
        try:
            validate_queue_name(candidate)
        except dirmq.InvalidName as exc:
            return str(exc)
        return "valid"

    class Named(str):
        __hash__ = str.__hash__

    class Lying(str):  # its __str__ says a valid name, whatever its text
        def __str__(self) -> str:
            return "valid"

    first = verdict(name)
    assert verdict(name) == first
    assert verdict(Named(name)) == first
    assert verdict(Lying(name)) == first
