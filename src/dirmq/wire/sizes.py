"""Sizes as options and settings take them: plain bytes (`1048576`) or a number with a unit,
SI (`kB` = 1000, `MB`, `GB`, `TB`) or IEC (`KiB` = 1024, `MiB`, `GiB`, `TiB`), spelled exactly
so. A spelling that could mean either (`10K`, `10KB`, `10M`, `10mb`) is refused rather than
guessed, as is a fraction of a byte (`0.1KiB`) and anything negative."""

from __future__ import annotations

import re

from dirmq.errors import InvalidArgument

UNITS: dict[str, int] = {
    "B": 1,
    "kB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}
MAX_SIZE_BYTES = 2**63 - 1  # what a file offset (and every limit compared with one) can hold
FORMS = (
    "bytes (1048576) or a number with a unit: kB, MB, GB, TB (1000s), KiB, MiB, GiB, TiB (1024s)"
)

# Digits are ASCII only (Python's int() would read any script's), and at most 24 of them: a
# longer number is too large anyway, and never reaches int()'s digit limit.
_SIZE = re.compile(r"([0-9]{1,24})(?:\.([0-9]{1,24}))?[ \t]*([A-Za-z]*)")


def parse_size(text: str, name: str = "size") -> int:
    """Bytes in `text`; InvalidArgument (naming the setting, saying the accepted forms) if it is
    not a size, is ambiguous, or is not a whole number of bytes. `name` "": the text alone (an
    option's refusal, which argparse prefixes with the option)."""
    subject = f"{name}={text!r}" if name else repr(text)
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise InvalidArgument(f"{subject} is not a size: use {FORMS}")
    whole, fraction, unit = match.groups()
    if unit and unit not in UNITS:
        raise InvalidArgument(f"{subject} has {_unit_problem(unit)}: use {FORMS}")
    from fractions import Fraction  # here: 20 ms to import, and few calls parse a size

    number = Fraction(f"{whole}.{fraction}" if fraction else whole)
    value = number * UNITS[unit or "B"]
    if value.denominator != 1:
        raise InvalidArgument(f"{subject} is not a whole number of bytes")
    if value > MAX_SIZE_BYTES:
        raise InvalidArgument(f"{subject} is larger than {MAX_SIZE_BYTES} bytes")
    return int(value)


def format_size(size_bytes: int) -> str:
    """The shortest exact spelling `parse_size` reads back: `64MiB`, `10MB`, `1500`."""
    for unit in ("TiB", "TB", "GiB", "GB", "MiB", "MB", "KiB", "kB"):
        scale = UNITS[unit]
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return str(size_bytes)


def _unit_problem(unit: str) -> str:
    """Why `unit` is refused: ambiguous (K, KB, mb: 1000 or 1024?) or unknown."""
    folded = unit.lower().removesuffix("b").removesuffix("i")
    if folded in ("k", "m", "g", "t"):
        letter = folded.upper()
        si = "k" if letter == "K" else letter
        return f"an ambiguous unit {unit!r} ({si}B is 1000s, {letter}iB 1024s)"
    return f"an unknown unit {unit!r}"
