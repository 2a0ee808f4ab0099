"""What a server fast path's `settle` callback was given (the broker's `*_nowait` calls, a parked
long poll), and an event a test can await: tests/test_quiet_lines.py, test_armed_lines.py."""

from __future__ import annotations

import asyncio


class Settled:
    """A `settle` callback that keeps its outcomes and sets an event at each."""

    def __init__(self) -> None:
        self.outcomes: list[object] = []
        self.event = asyncio.Event()

    def __call__(self, outcome: object) -> None:
        self.outcomes.append(outcome)
        self.event.set()

    def bodies(self) -> list[bytes]:
        """The bodies of the one outcome given, a list of messages."""
        (outcome,) = self.outcomes
        assert isinstance(outcome, list)
        return [m.body for m in outcome]
