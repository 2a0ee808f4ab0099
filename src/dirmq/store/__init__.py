"""The storage core: queues as directories of files. Standard library only; no asyncio."""

from dirmq.store.config import Durability, QueueConfig
from dirmq.store.events import StoreEvents
from dirmq.store.message import Message, OutgoingMessage, QueueStats, SweepReport
from dirmq.store.queue import Queue
from dirmq.store.root import Store, default_root, init_root

__all__ = [
    "Durability",
    "Message",
    "OutgoingMessage",
    "Queue",
    "QueueConfig",
    "QueueStats",
    "Store",
    "StoreEvents",
    "SweepReport",
    "default_root",
    "init_root",
]
