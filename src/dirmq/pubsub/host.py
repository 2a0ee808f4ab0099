"""What a `Subscription` needs from the hub that attaches it, as a protocol.

`PubSub` (hub.py) creates subscriptions, so it imports subscription.py; a subscription only
reads the hub's paths, logs and presence, reports through its transitions and calls back into
its sweep. Naming that here, below both, lets subscription.py import nothing from hub.py: no
import circle, and the subscription's dependencies are written down in one place. `PubSub` is
the one implementation (it matches structurally; nothing registers).
"""

from __future__ import annotations

from typing import Protocol

from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.model import Outcome
from dirmq.pubsub.presence import PresenceIndex
from dirmq.pubsub.seqlogs import SeqLog
from dirmq.pubsub.transitions import Transitions
from dirmq.store.root import Store


class SubscriptionHost(Protocol):
    store: Store  # for its watch settings (mode, poll interval, the shared inotify hub)
    paths: PubSubPaths
    retained: SeqLog
    broadcast: SeqLog
    presence: PresenceIndex
    transitions: Transitions
    sweep_interval_s: float

    def maybe_sweep(self) -> object:
        """Sweep if no process has lately (a waiting `receive` calls it)."""
        ...

    def abort_entry(self, path: str, subscriber: str, why: str) -> Outcome | None:
        """Give back a taken `anyone` entry under the subscription's delivery policy (aborted,
        or dismissed after its last delivery allowed); None if it was settled meanwhile."""
        ...

    def delete_subscription(self, name: str) -> None:
        """Remove a detached subscription (an anonymous one's close calls it)."""
        ...
