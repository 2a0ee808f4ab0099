"""Where pub/sub keeps its files under a root (`<root>/@pubsub/`), and how entries are named.

    @pubsub/
      @tmp/                          named temp files where O_TMPFILE is unavailable
      messages/<id>                  the one written file of each message: publishing
      messages/<id>.live             ... routed (its `queued` outcome is out)
      messages/<id>.end              ... finished; kept for the dedup window, then removed
      anyone/<key>.<accept-ms>[.<n>[.<due-ms>]]   `anyone` messages waiting for a subscriber
      broadcast/<seq, 16 digits>     the `everyone` log, pruned after the accept timeout
      broadcast.floor                its lowest remaining sequence number
      retained/<seq, 16 digits>      the `future` log: dense sequence numbers from 1, kept
      present/<subscriber>           one per attached subscription; mtime is its heartbeat
      swept                          mtime: when any process last swept
      outbox/<key>~<sub>~<outcome>~<n>   an outcome decided but not yet reported
      subs/<subscriber>/subscription.json   its filter, when it attached
      subs/<subscriber>/cursor       its positions in the two logs (JSON)
      subs/<subscriber>/taken/<key>.<deadline-ms>.<n> `anyone` deliveries it holds (accepted)

Every entry is a hard link to the message's one file, first written as `messages/<id>`:
fan-out costs one write and one link whatever the number of subscribers, because subscriptions
read the logs from their own cursors. `<key>` is `<publish-µs, 16 digits>_<id>`, so names sort
by publish time; a delivery from a log has the key `<key>+<b|r><seq>`. `<accept-ms>` is the
epoch millisecond after which an entry nobody accepted times out. `<n>` counts the deliveries
of an `anyone` message so far (absent: none); `<due-ms>`, on an entry given back, is when it may
be delivered again (its backoff, policy.py).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

PUBSUB_DIR = "@pubsub"
SEQ_DIGITS = 16


@dataclass(frozen=True, slots=True)
class PubSubPaths:
    base: str

    @classmethod
    def under(cls, root: str) -> PubSubPaths:
        return cls(os.path.join(root, PUBSUB_DIR))

    @property
    def tmp(self) -> str:
        return os.path.join(self.base, "@tmp")

    @property
    def messages(self) -> str:
        return os.path.join(self.base, "messages")

    @property
    def anyone(self) -> str:
        return os.path.join(self.base, "anyone")

    @property
    def retained(self) -> str:
        return os.path.join(self.base, "retained")

    @property
    def broadcast(self) -> str:
        return os.path.join(self.base, "broadcast")

    @property
    def present(self) -> str:
        return os.path.join(self.base, "present")

    @property
    def outbox(self) -> str:
        return os.path.join(self.base, "outbox")

    @property
    def subs(self) -> str:
        return os.path.join(self.base, "subs")

    def shared_dirs(self) -> list[str]:
        return [
            self.tmp,
            self.messages,
            self.anyone,
            self.retained,
            self.broadcast,
            self.present,
            self.outbox,
            self.subs,
        ]

    def sub(self, name: str) -> str:
        return os.path.join(self.subs, name)

    def taken(self, name: str) -> str:
        return os.path.join(self.subs, name, "taken")

    def cursor(self, name: str) -> str:
        return os.path.join(self.subs, name, "cursor")

    def subscription_file(self, name: str) -> str:
        return os.path.join(self.subs, name, "subscription.json")

    def retained_entry(self, seq: int) -> str:
        return os.path.join(self.retained, seq_name(seq))

    def canonical(self, message_id: str, state: str = "") -> str:
        return os.path.join(self.messages, message_id + (f".{state}" if state else ""))


def listed(directory: str) -> list[str]:
    """The names in a pub/sub directory; none for one not made yet (or removed)."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def seq_name(seq: int) -> str:
    return f"{seq:0{SEQ_DIGITS}d}"


def timed_name(key: str, ms: int) -> str:
    """`<key>.<ms>`: an entry with a deadline in its name (renamed to move the deadline)."""
    return f"{key}.{ms}"


def split_timed(name: str) -> tuple[str, int] | None:
    """(key, ms) of a `timed_name` or an `entry_name`, or None for a foreign file."""
    found = split_entry(name)
    return None if found is None else (found.key, found.ms)


@dataclass(frozen=True, slots=True)
class EntryName:
    """What the name of an `anyone/` or `taken/` entry says."""

    key: str
    ms: int  # accept deadline (anyone/) or process deadline (taken/)
    deliveries: int = 0  # deliveries so far
    due_ms: int = 0  # not delivered again before (0: at once)

    def name(self) -> str:
        return entry_name(self.key, self.ms, self.deliveries, self.due_ms)


def entry_name(key: str, ms: int, deliveries: int = 0, due_ms: int = 0) -> str:
    """`<key>.<ms>[.<deliveries>[.<due-ms>]]`: a `timed_name` that also counts deliveries."""
    name = timed_name(key, ms)
    if deliveries or due_ms:
        name += f".{deliveries}"
    if due_ms:
        name += f".{due_ms}"
    return name


def split_entry(name: str) -> EntryName | None:
    """The parts of an `entry_name` (or a plain `timed_name`), or None for a foreign file."""
    key, *numbers = name.split(".")
    if not key or not 1 <= len(numbers) <= 3:
        return None
    if not all(n.isascii() and n.isdigit() for n in numbers):
        return None
    return EntryName(key, *(int(n) for n in numbers))


RETAINED = "r"
BROADCAST = "b"
_DELIVERY_KEY_RE = re.compile(r"[0-9]{16}_[A-Za-z0-9_-]{1,128}(\+[rb][0-9]+)?")


def is_delivery_key(text: str) -> bool:
    """True for a key a subscription hands out (`<key>` or `<key>+<r|b><seq>`)."""
    return _DELIVERY_KEY_RE.fullmatch(text) is not None


def log_key(message_key: str, log: str, seq: int) -> str:
    """The key of a delivery from log `log` (RETAINED or BROADCAST)."""
    return f"{message_key}+{log}{seq}"


def split_log_key(key: str) -> tuple[str, int] | None:
    """(log, seq) of a delivery from a log, or None for an `anyone` delivery."""
    _, plus, tail = key.rpartition("+")
    if not plus or len(tail) < 2 or tail[0] not in (RETAINED, BROADCAST) or not tail[1:].isdigit():
        return None
    return tail[0], int(tail[1:])


def key_id(key: str) -> str:
    """The message id in a key (`<µs>_<id>[+<seq>]`)."""
    return key.split("_", 1)[1].split("+", 1)[0]


def outbox_name(key: str, subscriber: str, outcome: str, attempt: int) -> str:
    return f"{key}~{subscriber or '-'}~{outcome}~{attempt}"


def split_outbox(name: str) -> tuple[str, str, str, int] | None:
    parts = name.split("~")
    if len(parts) != 4 or not parts[3].isdigit():
        return None
    key, subscriber, outcome, attempt = parts
    return key, ("" if subscriber == "-" else subscriber), outcome, int(attempt)
