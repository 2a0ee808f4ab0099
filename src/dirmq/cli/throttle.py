"""Warnings that repeat, rate-limited: a message that fails over and over (or many that fail
alike) must not flood stderr with one line per failure.

Each kind of warning prints at most one line every `every_s`; the ones held back meanwhile are
counted and their number said with the next line of that kind, or by `flush` at exit.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

EVERY_S = 10.0


def warn(message: str) -> None:
    print(f"dirmq: warning: {message}", file=sys.stderr, flush=True)


@dataclass
class _Kind:
    next_at: float = 0.0
    held_back: int = 0
    last: str = ""


@dataclass
class ThrottledWarnings:
    every_s: float = EVERY_S
    clock: Callable[[], float] = time.monotonic
    write: Callable[[str], None] = warn
    _kinds: dict[str, _Kind] = field(default_factory=dict)

    def warn(self, kind: str, message: str) -> None:
        """Say `message` now, unless a warning of `kind` was said less than `every_s` ago."""
        state = self._kinds.setdefault(kind, _Kind())
        now = self.clock()
        if now < state.next_at:
            state.held_back += 1
            state.last = message
            return
        if state.held_back:
            message += f" ({_similar(state.held_back)} held back)"
        self.write(message)
        state.next_at, state.held_back, state.last = now + self.every_s, 0, ""

    def flush(self) -> None:
        """Say how many warnings of each kind were held back since its last line."""
        for state in self._kinds.values():
            if state.held_back:
                self.write(f"{_similar(state.held_back)} held back, the last: {state.last}")
                state.held_back = 0


def _similar(count: int) -> str:
    return f"{count} similar warning{'s' if count != 1 else ''}"
