"""What a Store tells its owner as it happens: the hooks of the server's failure metrics.

Each hook is called from whichever thread performed the transition, after it is done, and must
be quick and thread-safe (a metric's counter). None: nobody listens. A library user may pass
their own (`Store(events=StoreEvents(...))`) to count or log the same things.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

# Why a message was dead-lettered (the `X-Dead-Reason` it carries, docs/FORMAT.md).
REASON_MAX_RECEIVES = "max-receives"  # returned or expired with the queue's max receives used
REASON_REJECTED = "rejected"  # a consumer dead-lettered it (with or without a detail)
REASON_UNREADABLE = "unreadable"  # a consumer or a layer could not process what it read
REASON_TTL_EXPIRED = "ttl-expired"  # its time to live ran out
DEAD_REASONS = (REASON_MAX_RECEIVES, REASON_REJECTED, REASON_UNREADABLE, REASON_TTL_EXPIRED)


@dataclass(frozen=True, slots=True)
class StoreEvents:
    # A corrupt file of queue `name` was set aside in @corrupt.
    quarantined: Callable[[str], None] | None = None
    # A message of queue `name` was dead-lettered for `reason` (one of DEAD_REASONS).
    dead_lettered: Callable[[str, str], None] | None = None
    # `count` leases of queue `name` expired and were returned (or dead-lettered) by a sweep.
    leases_expired: Callable[[str, int], None] | None = None
    # `count` dead messages were redriven out of queue `name` (its @dead, or it as a DLQ).
    redriven: Callable[[str, int], None] | None = None


NO_EVENTS = StoreEvents()


def with_quarantined(
    events: StoreEvents | None, quarantined: Callable[[str], None] | None
) -> StoreEvents:
    """`events` (or none), with `quarantined` as its hook if given (`Store(on_quarantine=)`)."""
    events = events or NO_EVENTS
    return events if quarantined is None else replace(events, quarantined=quarantined)
