"""Values that cross the store's API: what is published, what is delivered, what stats say."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """A message to publish. `delay_s=None` takes the queue's default delay. A message with a
    `dedup_id` already published within the queue's dedup window is not stored again."""

    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    delay_s: float | None = None
    dedup_id: str | None = None
    group: str | None = None  # messages of one group are delivered in order, one at a time
    ttl_s: float | None = None  # None: the queue's message_ttl_s (expiry.py)
    priority: int = 0  # 0 (lowest) to the queue's priority_levels - 1: higher goes first


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """Why and whence a message was dead-lettered: kept in its file (`Dirmq-Dead-*` system
    headers, docs/FORMAT.md), shown on delivery (native `X-Dead-*` headers, SQS attributes).

    `reason`: one of `events.DEAD_REASONS`; `source`: the queue it died in; `receive_count`:
    how often it had been received then; `at_s`: when (epoch seconds); `detail`: the text a
    consumer gave when it rejected the message, if any."""

    reason: str
    source: str
    receive_count: int
    at_s: float
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds a lease (docs/FORMAT.md, "Lease holders"): the record its lease name's token
    names. `known` is False for a lease whose name names nobody (taken by an older version,
    or where the record could not be written) or whose record is gone: then only `token`, if
    any, is set. `label`: the principal or consumer name the lease was taken for, if any."""

    token: str | None
    label: str | None = None
    host: str | None = None
    pid: int | None = None
    program: str | None = None
    created_s: float | None = None
    known: bool = False


@dataclass(frozen=True, slots=True)
class Message:
    """A delivered (or peeked) message.

    `receipt` is set only for a leased message: pass it to ack/nack/extend/dead_letter. It names
    this lease, not the message: once the lease has expired and someone else received the message,
    the old receipt is refused (`StaleReceipt`).
    """

    id: str
    body: bytes
    headers: dict[str, str]
    receive_count: int
    published_at_s: float
    receipt: str | None = None
    lease_deadline_s: float | None = None
    state: str = "ready"
    group: str | None = None
    dead: DeadLetter | None = None  # set on a message that was dead-lettered (and since)
    holder: LeaseHolder | None = None  # who holds it: set by peek and browse of a leased one
    expires_at_s: float | None = None  # its time to live ends then (epoch s; expiry.py)
    priority: int = 0  # its priority level (in its file name, FORMAT.md)

    @property
    def content_type(self) -> str | None:
        return _lookup(self.headers, "content-type")

    @property
    def content_encoding(self) -> str | None:
        return _lookup(self.headers, "content-encoding")


def _lookup(headers: Mapping[str, str], lowered: str) -> str | None:
    for name, value in headers.items():
        if name.lower() == lowered:
            return value
    return None


@dataclass(frozen=True, slots=True)
class QueueStats:
    ready: int
    in_flight: int
    delayed: int
    dead: int
    oldest_ready_age_s: float | None

    @property
    def total(self) -> int:
        """Messages that count towards capacity (ready, in flight and delayed)."""
        return self.ready + self.in_flight + self.delayed


@dataclass(frozen=True, slots=True)
class SweepReport:
    orphans_removed: int = 0
    leases_requeued: int = 0
    delayed_delivered: int = 0
    dead_lettered: int = 0
    expired_removed: int = 0
    slots_released: int = 0
    pools_reclaimed: int = 0  # recycled-file pools of dead processes emptied (see pool.py)
