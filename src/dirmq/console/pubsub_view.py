"""What the overview shows of publish/subscribe: its subscriptions, with how far each is
behind the retained log (its lag), as `dirmq.pubsub` tells them; nothing when the root has
never used pub/sub (the overview creates nothing)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dirmq.pubsub.hub import PubSub
from dirmq.server.credentials import SEE, SUBSCRIPTION_PREFIX
from dirmq.store import layout

if TYPE_CHECKING:
    from dirmq.console.call import Console


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    name: str
    attached: bool
    taken: int
    lag: int | None  # retained entries not yet delivered to it


@dataclass(frozen=True, slots=True)
class PubSubSummary:
    retained: int
    broadcast: int
    waiting: int
    subscriptions: list[SubscriptionRow]


def pubsub_summary(console: Console, principal: str) -> PubSubSummary | None:
    if not os.path.isdir(os.path.join(console.store.root, layout.PUBSUB_DIR)):
        return None
    hub = console.hub
    if not isinstance(hub, PubSub):
        hub = console.hub = PubSub(console.store)  # kept: it opens logs and an outbox
    stats = hub.stats()
    head = stats["retained"]
    rows = []
    for found in hub.subscriptions():
        name = str(found["name"])
        if not console.access.allows(principal, SEE, SUBSCRIPTION_PREFIX + name):
            continue
        position = found.get("retained_next")
        lag = max(0, head + 1 - position) if isinstance(position, int) else None
        taken = found.get("taken")
        rows.append(
            SubscriptionRow(
                name, bool(found["attached"]), taken if isinstance(taken, int) else 0, lag
            )
        )
    return PubSubSummary(head, stats["broadcast"], stats["anyone_waiting"], rows)
