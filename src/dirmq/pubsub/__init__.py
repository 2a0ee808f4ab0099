"""Publish/subscribe on a dirmq root: channels and subjects, three delivery modes, processing
outcomes reported to publishers. See docs/pubsub.md.

The names below are imported on first use (PEP 562): a `dirmq` command line that only needs
the model's enums (the CLI's parser) does not load the hub and its modules."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dirmq.pubsub.hub import PubSub, SweepReport
    from dirmq.pubsub.model import (
        Delivery,
        Envelope,
        Filter,
        Mode,
        Outcome,
        Persistence,
        Published,
    )
    from dirmq.pubsub.subscription import Subscription

_HOMES = {
    "PubSub": "dirmq.pubsub.hub",
    "SweepReport": "dirmq.pubsub.hub",
    "Delivery": "dirmq.pubsub.model",
    "Envelope": "dirmq.pubsub.model",
    "Filter": "dirmq.pubsub.model",
    "Mode": "dirmq.pubsub.model",
    "Outcome": "dirmq.pubsub.model",
    "Persistence": "dirmq.pubsub.model",
    "Published": "dirmq.pubsub.model",
    "Subscription": "dirmq.pubsub.subscription",
}

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


def __getattr__(name: str) -> object:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next lookup is a plain one
    return value
