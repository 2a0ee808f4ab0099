"""Publish/subscribe on a dirmq root: channels and subjects, three delivery modes, processing
outcomes reported to publishers. See docs/pubsub.md."""

from dirmq.pubsub.hub import PubSub, SweepReport
from dirmq.pubsub.model import Delivery, Envelope, Filter, Mode, Outcome, Persistence, Published
from dirmq.pubsub.subscription import Subscription

__all__ = [
    "Delivery",
    "Envelope",
    "Filter",
    "Mode",
    "Outcome",
    "Persistence",
    "PubSub",
    "Published",
    "Subscription",
    "SweepReport",
]
