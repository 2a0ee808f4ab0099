"""A subscription's delivery policy: how soon a message it gave back comes again, and how often.

A message that keeps failing (its handler crashes, its `--exec` command exits non-zero) must not
spin: each return (abort, a passed deadline, a closed subscription) waits a backoff before the
message is delivered again, growing from `backoff_s` by doubling up to `backoff_max_s`, with up
to a fifth taken off at random so that messages that failed together do not all come back
together. After `max_deliveries` deliveries the next return gives up instead: the message is
dismissed (its `dismissed` outcome reported) or, when the policy names a `dead_letter` queue,
put there with its provenance and dismissed.

Deliveries are counted per message and subscription: an `anyone` message, which one subscription
at a time holds, counts in its file's name (whichever subscription takes it; see layout.py), a
log delivery (`everyone`, `future`) in the subscription's positions. The policy is stored with
the subscription (`subscription.json`), so a sweeper in any process applies it to a dead
session's deliveries.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass

from dirmq.errors import InvalidArgument
from dirmq.store.bounds import MAX_DURATION_S
from dirmq.store.clock import duration_ms

DEFAULT_MAX_DELIVERIES = 5
DEFAULT_BACKOFF_S = 1.0
DEFAULT_BACKOFF_MAX_S = 300.0
MAX_DELIVERIES_LIMIT = 999_999
JITTER = 0.2  # at most this share of a backoff is taken off at random


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    """Backoff after each failed delivery, and the most deliveries (0: no limit)."""

    max_deliveries: int = DEFAULT_MAX_DELIVERIES
    backoff_s: float = DEFAULT_BACKOFF_S
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S
    dead_letter: str | None = None  # a queue name: where a message given up on goes

    def __post_init__(self) -> None:
        n = self.max_deliveries
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_DELIVERIES_LIMIT:
            raise InvalidArgument(
                f"max deliveries must be an integer from 0 (no limit) to {MAX_DELIVERIES_LIMIT}, "
                f"got {n!r}"
            )
        for name, value in (("backoff", self.backoff_s), ("backoff max", self.backoff_max_s)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
            if not 0 <= value <= MAX_DURATION_S:
                raise InvalidArgument(f"{name} must be from 0 to {MAX_DURATION_S:.0f} seconds")
        if self.backoff_max_s < self.backoff_s:
            raise InvalidArgument(
                f"backoff max ({self.backoff_max_s:g}s) is below the backoff "
                f"({self.backoff_s:g}s): raise it or lower the backoff"
            )

    def exhausted(self, deliveries: int) -> bool:
        """True when a message delivered `deliveries` times and given back is given up on."""
        return self.max_deliveries > 0 and deliveries >= self.max_deliveries

    def backoff_ms(self, deliveries: int) -> int:
        """How long a message given back after its `deliveries`-th delivery waits (ms)."""
        if self.backoff_s <= 0:
            return 0
        doublings = min(max(deliveries - 1, 0), 62)
        full = min(self.backoff_max_s, self.backoff_s * 2.0**doublings)
        return duration_ms(full * (1 - JITTER * random.random()))

    def to_json(self) -> dict[str, object]:
        return {
            "max_deliveries": self.max_deliveries,
            "backoff_ms": duration_ms(self.backoff_s),
            "backoff_max_ms": duration_ms(self.backoff_max_s),
            "dead_letter": self.dead_letter,
        }

    @classmethod
    def from_json(cls, data: object) -> DeliveryPolicy:
        """The policy stored with a subscription; the defaults for a record without one (made
        by an earlier version) or a damaged one (fsck reports records it cannot read)."""
        if not isinstance(data, Mapping):
            return cls()
        try:
            dead = data.get("dead_letter")
            return cls(
                max_deliveries=int(data.get("max_deliveries", DEFAULT_MAX_DELIVERIES)),
                backoff_s=int(data.get("backoff_ms", DEFAULT_BACKOFF_S * 1000)) / 1000,
                backoff_max_s=int(data.get("backoff_max_ms", DEFAULT_BACKOFF_MAX_S * 1000)) / 1000,
                dead_letter=dead if isinstance(dead, str) and dead else None,
            )
        except (TypeError, ValueError, InvalidArgument):
            return cls()


def read_policy(subscription_file: str) -> DeliveryPolicy:
    """The policy stored in a subscription's record (`subscription.json`); the defaults when
    there is none (a record of an earlier version, or the subscription was deleted)."""
    try:
        with open(subscription_file, "rb") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return DeliveryPolicy()
    return DeliveryPolicy.from_json(data.get("delivery") if isinstance(data, dict) else None)
