"""Per-queue configuration, stored as `@queue.json` in the queue directory.

The file is replaced atomically (temp file, fsync, rename), so every process reads either the old
or the new configuration, never a mix. Unknown keys are kept, so newer versions can add settings.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum
from typing import Any

from dirmq.errors import ConfigError
from dirmq.store import bounds
from dirmq.store.names import validate_queue_name


class Durability(StrEnum):
    WRITETHROUGH = "writethrough"  # file and directory fsynced before put returns
    WRITEBACK = "writeback"  # visible at once, fsynced in the background within a bounded delay
    MEMORY = "memory"  # never fsynced: survives a process crash, not a machine crash


@dataclass(frozen=True, slots=True)
class QueueConfig:
    visibility_timeout_s: float = 30.0
    delay_s: float = 0.0
    max_receives: int | None = None
    dead_letter_queue: str | None = None
    capacity: int | None = None
    retention_s: float | None = None
    max_message_bytes: int = 16 * 1024 * 1024
    durability: Durability = Durability.WRITETHROUGH
    writeback_delay_s: float = 0.5
    peers: int = 0
    dedup_window_s: float = 300.0
    # Flow control and time to live (flow.py, expiry.py): issue 36.
    paused: bool = False
    delivery_rate_per_s: float | None = None
    message_ttl_s: float | None = None
    ttl_action: str = "dead-letter"
    # Priority levels 0 .. priority_levels - 1, the highest delivered first (FORMAT.md).
    priority_levels: int = 1
    # Settings of protocols above the store (SQS attributes and tags...), kept with the queue
    # and opaque to the store: {"sqs": {...}}.
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_seconds("visibility_timeout_s", self.visibility_timeout_s, 0.0)
        _check_seconds("delay_s", self.delay_s, 0.0)
        _check_seconds("writeback_delay_s", self.writeback_delay_s, 0.001)
        _check_seconds("dedup_window_s", self.dedup_window_s, 0.0)
        if self.retention_s is not None:
            _check_seconds("retention_s", self.retention_s, 0.001)
        if self.max_receives is not None:
            _check_int("max_receives", self.max_receives, 1, bounds.MAX_RECEIVE_COUNT)
        if self.capacity is not None:
            _check_int("capacity", self.capacity, 1, bounds.MAX_CAPACITY)
        _check_int("max_message_bytes", self.max_message_bytes, 1, bounds.MAX_MESSAGE_BYTES)
        _check_int("peers", self.peers, 0, bounds.MAX_PEERS)
        _check_int("priority_levels", self.priority_levels, 1, bounds.MAX_PRIORITY_LEVELS)
        if self.dead_letter_queue is not None:
            validate_queue_name(self.dead_letter_queue)
        _check_flow(self)
        if not isinstance(self.metadata, dict):
            raise ConfigError("metadata must be a JSON object")
        if not isinstance(self.durability, Durability):
            try:
                object.__setattr__(self, "durability", Durability(self.durability))
            except ValueError:
                choices = ", ".join(d.value for d in Durability)
                raise ConfigError(f"durability must be one of {choices}") from None

    @property
    def receive_limit(self) -> int:
        """Receives after which a returned or expired lease is dead-lettered: `max_receives`,
        else the most a file name can count (a message is never re-leased past it)."""
        return bounds.MAX_RECEIVE_COUNT if self.max_receives is None else self.max_receives

    def updated(self, **changes: Any) -> QueueConfig:
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["durability"] = self.durability.value
        return data

    @classmethod
    def from_json(cls, data: Any) -> QueueConfig:
        if not isinstance(data, dict):
            raise ConfigError("configuration must be a JSON object")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ConfigError(str(exc)) from exc

    def dumps(self) -> bytes:
        return (json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def loads(cls, raw: bytes) -> QueueConfig:
        try:
            return cls.from_json(json.loads(raw))
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, InvalidName
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"configuration is not valid: {exc}") from exc


TTL_ACTIONS = ("dead-letter", "drop")


def _check_flow(config: QueueConfig) -> None:
    """The keys of pause, delivery rate and time to live (docs/FORMAT.md, "Flow control")."""
    if not isinstance(config.paused, bool):
        raise ConfigError(f"paused must be true or false, got {config.paused!r}")
    rate = config.delivery_rate_per_s
    if rate is not None and (
        isinstance(rate, bool)
        or not isinstance(rate, int | float)
        or not 0 < rate <= bounds.MAX_DELIVERY_RATE
    ):
        raise ConfigError(
            f"delivery_rate_per_s must be a number above 0 and at most "
            f"{bounds.MAX_DELIVERY_RATE}, or null (no limit), got {rate!r}"
        )
    if config.message_ttl_s is not None:
        _check_seconds("message_ttl_s", config.message_ttl_s, 0.001)
    if config.ttl_action not in TTL_ACTIONS:
        raise ConfigError(
            f"ttl_action must be one of {', '.join(TTL_ACTIONS)}, got {config.ttl_action!r}"
        )


def _check_seconds(name: str, value: object, minimum: float) -> None:
    bounds.check_seconds(name, value, minimum=minimum, error=ConfigError)


def _check_int(name: str, value: object, minimum: int, maximum: int) -> None:
    bounds.check_count(name, value, minimum=minimum, maximum=maximum, error=ConfigError)
