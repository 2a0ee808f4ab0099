"""The bounds of every duration, count and size the store accepts, in one place.

Why there are bounds at all. A message's state lives in its file name (layout.py): a receive
count of at most `COUNT_DIGITS` digits, a lease deadline or due time of at most `AT_MS_DIGITS`
digits of epoch milliseconds. A value past those bounds makes a name no process can parse: the
message vanishes from every index though its file is intact. So the store checks every value
where it accepts it (`QueueConfig`, and `Queue`'s put, get, extend, nack and named claims), and
every door (library, CLI, HTTP, yaq, SQS, pub/sub, Spark) reaches the disk through those checks.
An edge may keep stricter limits of its own (SQS: 900 s delay, 12 h visibility), never looser.

`MAX_DURATION_S` (a year) keeps `now + duration` within 15 digits of milliseconds until the
year 33658. The other bounds keep what the store writes, or loops over, of a sane size.
"""

from __future__ import annotations

import math

from dirmq.errors import DirmqError, InvalidArgument

MAX_DURATION_S = 365 * 24 * 3600.0  # any duration: visibility, delay, wait, retention, windows
COUNT_DIGITS = 9  # a receive count in a name
AT_MS_DIGITS = 15  # a lease deadline or due time in a name, epoch milliseconds
MAX_RECEIVE_COUNT = 10**COUNT_DIGITS - 1  # past it a returned lease is dead-lettered
MAX_AT_MS = 10**AT_MS_DIGITS - 1
MAX_CAPACITY = 10**COUNT_DIGITS - 1  # messages in one queue (capacity tokens are names too)
MAX_MESSAGE_BYTES = 4 * 1024**3  # every door holds a body in memory whole
MAX_DELIVERY_RATE = 100_000  # a queue's delivery_rate_per_s: one slot file per delivery (flow.py)
MAX_PEERS = 1024  # a get looks at the oldest peers + 1 ready messages
MAX_PRIORITY_LEVELS = 10  # priority levels 0-9: one digit in a name (FORMAT.md)


def check_seconds(
    name: str,
    value: object,
    *,
    minimum: float = 0.0,
    error: type[DirmqError] = InvalidArgument,
) -> float:
    """`value` as float seconds if it is a number within [`minimum`, `MAX_DURATION_S`]; else
    `error` saying which bound. NaN, infinities, bools and integers too large for a float are
    refused (compared before any conversion, so no OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{name} must be a number of seconds, got {_shown(value)}")
    if not minimum <= value <= MAX_DURATION_S:  # False for NaN too
        raise error(
            f"{name} must be between {minimum:g} and {MAX_DURATION_S:.0f} seconds (a year), "
            f"got {_shown(value)}"
        )
    return float(value)


def check_optional_seconds(name: str, value: object) -> None:
    """`check_seconds` of a duration that may be left out (None: the queue's default)."""
    if value is not None:
        check_seconds(name, value)


def check_timeout(name: str, value: object) -> None:
    """How long a call may block: never in a name, so only non-negative (inf: no limit)."""
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
    ):
        raise InvalidArgument(f"{name} must be a non-negative number of seconds, got {value!r}")


def check_count(
    name: str,
    value: object,
    *,
    minimum: int,
    maximum: int,
    error: type[DirmqError] = InvalidArgument,
) -> int:
    """`value` if it is an integer within [`minimum`, `maximum`]; else `error` naming the
    bounds."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise error(f"{name} must be an integer from {minimum} to {maximum}, got {_shown(value)}")
    return value


def _shown(value: object) -> str:
    """A short repr: an error message must not itself fail or grow with the input."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    try:
        text = repr(value)
    except ValueError:  # an int past the interpreter's digit limit
        return "a huge integer"
    return text if len(text) <= 40 else f"{text[:37]}..."
