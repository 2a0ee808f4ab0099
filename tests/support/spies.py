"""Spies: a function or method still doing its work, each of its calls recorded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


def spy(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, record: Callable[..., T]
) -> list[T]:
    """`record(*args, **kwargs)` of each call of `owner.name` from now on (a method's `self`
    first), taken before the real one runs; `owner` a module, or a class whose `name` is an instance
    method."""
    seen: list[T] = []
    real = getattr(owner, name)

    def spying(*args: Any, **kwargs: Any) -> Any:
        seen.append(record(*args, **kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spying)
    return seen
