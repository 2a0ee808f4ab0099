"""Durations as HTTP parameters: Go's `time.ParseDuration` syntax (`150ms`, `2s`, `1h2m3.5s`),
or plain seconds (`2`, `0.25`), which yaq and SQS users both expect."""

from __future__ import annotations

import math
import re

from dirmq.errors import InvalidArgument
from dirmq.store.bounds import MAX_DURATION_S  # the store's bound: no edge may be looser

_UNITS_S = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 MICRO SIGN
    "μs": 1e-6,  # U+03BC GREEK SMALL LETTER MU
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PLAIN = re.compile(r"[0-9]+(?:\.[0-9]*)?|\.[0-9]+")
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")


EXAMPLES = "e.g. 2.5, 150ms, 2s, 1h2m"


def duration_seconds(text: str) -> float | None:
    """Seconds in `text`, unbounded (inf or NaN never: those are not durations); None if it is
    not a duration."""
    text = text.strip()
    if text.startswith("+"):
        text = text[1:]
    if _PLAIN.fullmatch(text):
        return float(text)
    position, seconds = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _UNITS_S[match.group(2)]
        position = match.end()
    if position != len(text) or not text:
        return None
    return seconds


def parse_duration(text: str, name: str = "duration") -> float:
    """Seconds in `text`; InvalidArgument (naming the parameter) if it is not a duration."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise InvalidArgument(
            f"{name}={text!r} is not a duration: use seconds (2.5) or Go syntax (150ms, 2s, 1h2m)"
        )
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        raise InvalidArgument(f"{name}={text!r} is longer than a year")
    return seconds
