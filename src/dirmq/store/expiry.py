"""Message time to live: a message not delivered before its deadline is dead-lettered (reason
`ttl-expired`) or dropped, as the queue's `ttl_action` says, and never delivered after it.

Theory of operation. The deadline is written once, in the message's file, at publish:
`Dirmq-Expires: <epoch ms>` (the publish's `ttl_s`, else the queue's `message_ttl_s` then;
docs/FORMAT.md, "Time to live"). No name changes, so nothing about the layout does: a backlog of
a million messages with a TTL is listed and refilled as one without. A claim reads the file
anyway (that is the delivery), so the deadline costs nothing to learn there: a get whose claim
finds its message past its deadline takes it out of the queue at once (under the lease it just
took, so no other process races for it) and delivers the others. The check is at every claim,
so an expired message is never delivered, whether or not anything swept; until a get reaches
it, it counts as ready in `stats`. A dead-lettered copy no longer carries the deadline
(deadletters.py), so the dead-letter queue keeps it and a redrive delivers it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from dirmq.store import layout
from dirmq.store.config import QueueConfig
from dirmq.store.events import REASON_TTL_EXPIRED
from dirmq.store.index import QueueIndex
from dirmq.store.message import Message, OutgoingMessage


class _Settling(Protocol):
    """What `take_expired` does with an expired lease: files.QueueFiles (which reads deadlines
    with this module, so it is not imported here)."""

    def remove(
        self, index: QueueIndex | None, directory: str, name: str, message_id: str
    ) -> bool: ...

    def dead_letter(
        self,
        index: QueueIndex,
        src_dir: str,
        name: str,
        config: QueueConfig,
        reason: str,
        detail: str | None = None,
    ) -> int: ...


EXPIRES = "Expires"  # the system header (Dirmq-Expires): epoch milliseconds
DROP = "drop"


def deadline_ms(message: OutgoingMessage, config: QueueConfig, at_ns: int) -> int | None:
    """The deadline of a message published at `at_ns` (a reading of `clock.now_ns`), or None
    (it lives until delivered). The publish plus the time to live, rounded down once: a message
    is never delivered past its time to live (rounded to the nearest millisecond it could be,
    by up to half of one), and is dead less than a millisecond before it (the publish's
    millisecond and the time to live each rounded down, by up to two: `1.001 * 1000` is
    1000.99...)."""
    ttl_s = message.ttl_s if message.ttl_s is not None else config.message_ttl_s
    return None if ttl_s is None else (at_ns + round(ttl_s * 1e9)) // 1_000_000


def read_deadline_s(system: Mapping[str, str]) -> float | None:
    """The deadline a file's system headers hold (epoch seconds), or None. A value that does not
    parse (a file edited by hand) is no deadline: the message itself is intact."""
    value = system.get(EXPIRES)
    if value is None or not (value.isascii() and value.isdigit()):
        return None
    return int(value) / 1000


def take_expired(
    files: _Settling,
    index: QueueIndex,
    config: QueueConfig,
    leased: list[tuple[str, Message]],
    at_ms: int,
) -> list[tuple[str, Message]]:
    """The (lease name, message) pairs of `leased` (just claimed) still within their TTL; the
    others are dead-lettered or dropped now, under their lease."""
    kept: list[tuple[str, Message]] = []
    for lease, message in leased:
        expires_s = message.expires_at_s
        if expires_s is None or expires_s * 1000 > at_ms:
            kept.append((lease, message))
        elif not lease:
            continue  # its lease is unknown here: not delivered, taken out at its next claim
        elif config.ttl_action == DROP:
            files.remove(index, layout.LEASED, lease, message.id)
        else:
            files.dead_letter(index, layout.LEASED, lease, config, REASON_TTL_EXPIRED)
    return kept


def any_expiring(messages: list[Message]) -> bool:
    """Whether any of `messages` has a deadline (most have none: nothing to look up then)."""
    return any(m.expires_at_s is not None for m in messages)
