"""The store's clock moved by a test: delays minutes apart without waiting minutes."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from dirmq.store import filebase


@contextmanager
def store_now(now_ms: Callable[[], int]) -> Iterator[None]:
    """`filebase.now_ms`, imported by name wherever the store reads it, replaced by `now_ms`
    in every store module loaded now."""
    modules = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("dirmq.store") and getattr(module, "now_ms", None) is filebase.now_ms
    ]
    with pytest.MonkeyPatch.context() as patch:
        for module in modules:
            patch.setattr(module, "now_ms", now_ms)
        # Due times are reckoned from it (`filebase.due_after_ms`): the same clock, whole ms.
        patch.setattr(filebase, "now_ns", lambda: now_ms() * 1_000_000)
        yield
