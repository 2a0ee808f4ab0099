"""What waits in a queue's waiter line (longpolls.py): a `Waiter` (a long poll, or a stream
waiting with credit) and the `SideDelivery` a stream takes the direct path's messages through
while it stays in the line."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from dirmq.store import Message


class SideDelivery(Protocol):
    """A waiter that takes messages one at a time besides its own answer (a stream with credit,
    dialects/native/stream.py): the direct path leases a publish for it while it stays in the
    line, its `max_count` one less (`LongPolls.take_waiter`)."""

    def taken(self) -> None:
        """One message is on its way to `arrived` (count it against the credit now)."""

    def arrived(self, messages: list[Message]) -> bool:
        """What was on its way (maybe nothing: the publish failed); False: the consumer has
        gone, and the line gives the messages back."""


@dataclass(slots=True, eq=False)  # one waiter is itself only: removed by identity, not fields
class Waiter:
    max_count: int
    visibility_s: float | None
    future: asyncio.Future[list[Message]] = field(repr=False)
    max_per_group: int | None = 1
    consumer: str | None = None  # whom the leases name as their holder (`Queue.get`)
    side: SideDelivery | None = None


def expire(future: asyncio.Future[list[Message]]) -> None:
    """A long poll's wait is over: it answers empty (unless messages got there first)."""
    if not future.done():
        future.set_result([])
