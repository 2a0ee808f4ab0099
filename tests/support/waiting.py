"""Waiting, bounded, for what a test cannot be told of by an event: a server's answer, a file
another process writes, a sample taken at the server's pace."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    check: Callable[[], T],
    timeout_s: float = 10.0,
    what: str = "the condition",
    interval_s: float = 0.05,
) -> T:
    """`check()`'s first truthy value, asked every `interval_s`; AssertionError naming `what`
    (and the last value) once `timeout_s` passed without one."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}: {found!r}")
        time.sleep(interval_s)
