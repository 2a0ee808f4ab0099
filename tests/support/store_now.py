"""The store's clock moved by a test: delays minutes apart without waiting minutes, and readings
between two milliseconds (where a time rounded the wrong way comes early)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from dirmq.store import clock


@contextmanager
def store_now_ns(now_ns: Callable[[], int]) -> Iterator[None]:
    """`clock.now_ns`, and `clock.now_ms` (its millisecond, rounded down), imported by name
    wherever dirmq reads them (the store, pub/sub), replaced by `now_ns` in every module loaded
    now."""
    real_ms, real_ns = clock.now_ms, clock.now_ns

    def now_ms() -> int:
        return now_ns() // 1_000_000

    with pytest.MonkeyPatch.context() as patch:
        for name, module in list(sys.modules.items()):
            if not name.startswith("dirmq."):
                continue
            if getattr(module, "now_ms", None) is real_ms:
                patch.setattr(module, "now_ms", now_ms)
            if getattr(module, "now_ns", None) is real_ns:
                patch.setattr(module, "now_ns", now_ns)
        yield


@contextmanager
def store_now(now_ms: Callable[[], int]) -> Iterator[None]:
    """`store_now_ns` with a clock of whole milliseconds."""
    with store_now_ns(lambda: now_ms() * 1_000_000):
        yield
