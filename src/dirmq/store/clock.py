"""The store's clock, and the times it writes: never early.

A time in a name (a lease's deadline, a delay's due time, pub/sub's deadlines and backoffs) is
whole milliseconds of the wall clock since the Unix epoch, reached when the clock's millisecond,
rounded down (`now_ms`), gets to it. A time `seconds` from now is therefore rounded up
(`due_ms`): added to `now_ms()`, it fell due up to 1 ms before its seconds were over (CI saw a
0.2 s nack delay delivered 0.18 ms short). A deadline passed only once that millisecond is
beyond it (pub/sub's accept windows and process deadlines) is the millisecond before
(`last_ms`). A duration of 0 is due at once (a get with a visibility of 0 leaves the message
to the very next get).

Every reader imports these names (`now_ms`, `now_ns`) by name, so a test replaces the clock in
each module that reads it (tests/support/store_now.py). A call that needs both the current
millisecond and a time from now reads the clock once (`now_ns`) and derives both.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """The wall clock's millisecond since the epoch, rounded down."""
    return time.time_ns() // 1_000_000


def now_ns() -> int:
    return time.time_ns()


def due_ms(at_ns: int, seconds: float) -> int:
    """The time `seconds` after `at_ns` (a reading of `now_ns`), in whole milliseconds rounded
    up, so it is never reached before `seconds` have passed; 0 s: `at_ns`'s own millisecond."""
    duration_ns = round(seconds * 1e9)
    if not duration_ns:
        return at_ns // 1_000_000
    return -(-(at_ns + duration_ns) // 1_000_000)


def due_after_ms(seconds: float) -> int:
    """`due_ms` from now."""
    return due_ms(now_ns(), seconds)


def last_ms(at_ns: int, seconds: float) -> int:
    """The last millisecond before `seconds` after `at_ns` are over: a deadline that is passed
    once the clock's millisecond is beyond it (pub/sub's accept windows and process
    deadlines), so passed no sooner than its seconds are over and less than a millisecond
    after (`due_ms` there was passed up to 2 ms late)."""
    return -(-(at_ns + round(seconds * 1e9)) // 1_000_000) - 1


def last_ms_after(seconds: float) -> int:
    """`last_ms` from now."""
    return last_ms(now_ns(), seconds)


def duration_ms(seconds: float) -> int:
    """`seconds` in whole milliseconds, rounded up (a duration stored in ms, never shorter than
    asked: `int(1.001 * 1000)` is 1000)."""
    return -(-round(seconds * 1e9) // 1_000_000)
