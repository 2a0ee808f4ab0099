"""A waiter line's arming (longpolls.py): subscribe to the queue's changes, then look, so that
nothing published in between goes unnoticed; what it found out (`Armed`). Run on the event loop
or on the pool's cold lane."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dirmq.store import Message, Queue


@dataclass(frozen=True, slots=True)
class Armed:
    """What arming a line found out (`subscribe_and_look`)."""

    unsubscribe: Callable[[], None]
    polled: bool
    due_s: float | None
    got: list[Message]


def subscribe_and_look(
    queue: Queue,
    listener: Callable[[], None],
    max_count: int,
    visibility_s: float | None,
    max_per_group: int | None,
    consumer: str | None,
) -> Armed:
    """Arm a line (on the loop or the cold lane): subscribe first, then look, so that nothing
    published in between goes unnoticed."""
    unsubscribe = queue.subscribe(listener)
    try:
        polled = queue.polled()
        due_s = queue.next_due_s()
        got = queue.get(
            max_count, visibility_s=visibility_s, max_per_group=max_per_group, consumer=consumer
        )
    except BaseException:
        unsubscribe()
        raise
    return Armed(unsubscribe, polled, due_s, got)
