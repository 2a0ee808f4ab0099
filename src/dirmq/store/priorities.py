"""Message priorities (docs/FORMAT.md "Priorities"): what a publish may ask for.

A queue declares `priority_levels` (1 to 10, `QueueConfig`); a message's priority is 0 (the
lowest, and the default) to `priority_levels - 1`. The level is in every state name of the
message (`^<level>`, layout.py), so a nack, an expiry or a due delay puts it back at its level
without opening its file; the index (index.py) keeps a heap per level and the backlog
(backlog.py) a tree per level, so a get takes the highest level's oldest message without
listing anything.
"""

from __future__ import annotations

from dirmq.errors import InvalidArgument
from dirmq.store.config import QueueConfig


def check_priority(queue: str, priority: object, config: QueueConfig) -> int:
    """`priority` if queue `queue` (of `config`) has that level; else InvalidArgument saying the
    levels it has."""
    top = config.priority_levels - 1
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= top:
        if top == 0:
            raise InvalidArgument(
                f"priority must be 0: queue {queue!r} has one priority level (set its "
                f"priority_levels, up to 10, to publish with priorities), got {priority!r}"
            )
        raise InvalidArgument(
            f"priority must be an integer from 0 to {top} (queue {queue!r} has "
            f"{config.priority_levels} priority levels), got {priority!r}"
        )
    return priority
