"""dirmq: a durable message queue whose storage is plain directories of files."""

from dirmq.errors import (
    ConfigError,
    CorruptMessage,
    DirmqError,
    DiskFull,
    InvalidArgument,
    InvalidName,
    MessageNotFound,
    MessageTooLarge,
    QueueExists,
    QueueFull,
    QueueNotFound,
    StaleReceipt,
    StorageError,
)
from dirmq.store import (
    Durability,
    Message,
    OutgoingMessage,
    Queue,
    QueueConfig,
    QueueStats,
    Store,
    StoreEvents,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "CorruptMessage",
    "DirmqError",
    "DiskFull",
    "Durability",
    "InvalidArgument",
    "InvalidName",
    "Message",
    "MessageNotFound",
    "MessageTooLarge",
    "OutgoingMessage",
    "Queue",
    "QueueConfig",
    "QueueExists",
    "QueueFull",
    "QueueNotFound",
    "QueueStats",
    "StaleReceipt",
    "StorageError",
    "Store",
    "StoreEvents",
    "__version__",
]
