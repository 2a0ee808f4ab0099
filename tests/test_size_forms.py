"""Sizes as the CLI, `serve` and its config file take them (`dirmq.wire.sizes`): plain bytes or
a number with an SI or IEC unit, spelled exactly; anything ambiguous refused, saying the forms."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dirmq.errors import InvalidArgument
from dirmq.wire.sizes import FORMS, MAX_SIZE_BYTES, UNITS, format_size, parse_size

sizes = st.integers(min_value=0, max_value=MAX_SIZE_BYTES)


@given(sizes)
def test_plain_bytes_are_read_as_they_are(size: int) -> None:
    assert parse_size(str(size)) == size


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(sorted(UNITS)))
def test_a_whole_number_of_units_is_that_many_times_the_unit(number: int, unit: str) -> None:
    assert parse_size(f"{number}{unit}") == number * UNITS[unit]
    assert parse_size(f" {number} {unit} ") == number * UNITS[unit]


@given(sizes)
def test_format_size_is_read_back_exactly_and_is_never_longer(size: int) -> None:
    shown = format_size(size)
    assert parse_size(shown) == size
    assert len(shown) <= len(str(size))


@given(st.integers(min_value=1, max_value=10**6), st.sampled_from(sorted(UNITS)))
def test_a_fraction_is_taken_only_when_it_is_whole_bytes(number: int, unit: str) -> None:
    text = f"{number / 8}{unit}"
    if number * UNITS[unit] % 8 == 0:
        assert parse_size(text) == number * UNITS[unit] // 8
    else:
        with pytest.raises(InvalidArgument, match="not a whole number of bytes"):
            parse_size(text)


@given(
    st.integers(min_value=0, max_value=999),
    st.sampled_from(["K", "k", "KB", "Kb", "kb", "M", "mb", "Mb", "G", "gb", "T", "tB"]),
)
def test_ambiguous_units_are_refused_saying_both_readings(number: int, unit: str) -> None:
    with pytest.raises(InvalidArgument, match="ambiguous unit") as refused:
        parse_size(f"{number}{unit}")
    assert FORMS in str(refused.value)


@pytest.mark.parametrize(
    "text",
    ["", "-1", "-1KiB", "+5", "1e6", "0x10", "10 bits", "1,000", "10MiB!", "\u0661MB", "inf"],
)
def test_what_is_not_a_size_is_refused_saying_the_forms(text: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        parse_size(text, "max_body_bytes")
    said = str(refused.value)
    assert said.startswith(f"max_body_bytes={text!r} ") and FORMS in said


def test_sizes_beyond_a_file_offset_are_refused_and_never_reach_int_limits() -> None:
    assert parse_size(str(MAX_SIZE_BYTES)) == MAX_SIZE_BYTES
    with pytest.raises(InvalidArgument, match="larger than"):
        parse_size(str(MAX_SIZE_BYTES + 1))
    with pytest.raises(InvalidArgument, match="larger than"):
        parse_size("9" * 24 + "TiB")
    with pytest.raises(InvalidArgument, match="not a size"):
        parse_size("9" * 5000)  # int() refuses 4300+ digits: refused before it gets there
