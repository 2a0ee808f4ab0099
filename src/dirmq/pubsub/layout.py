"""Where pub/sub keeps its files under a root (`<root>/@pubsub/`), and how entries are named.

    @pubsub/
      @tmp/                          named temp files where O_TMPFILE is unavailable
      messages/<id>                  the one written file of each message: publishing
      messages/<id>.live             ... routed (its `queued` outcome is out)
      messages/<id>.end              ... finished; kept for the dedup window, then removed
      anyone/<key>.<accept-ms>       `anyone` messages waiting for a subscriber
      retained/<seq, 16 digits>      the `future` log: dense sequence numbers from 1, kept
      present/<subscriber>           one per attached subscription; mtime is its heartbeat
      swept                          mtime: when any process last swept
      outbox/<key>~<sub>~<outcome>~<n>   an outcome decided but not yet reported
      subs/<subscriber>/subscription.json   its filter
      subs/<subscriber>/cursor       next retained sequence number to deliver
      subs/<subscriber>/inbox/<key>.<accept-ms>   `everyone` copies, and returned deliveries
      subs/<subscriber>/taken/<key>.<deadline-ms> deliveries it holds (accepted)

Every entry except `retained/`'s and the queue of outcomes is a hard link to the message's one
file in `messages/`: fan-out to N subscribers costs one write and N links. `<key>` is
`<publish-µs, 16 digits>_<id>`, plus `+<seq>` for a delivery of a retained message, so names
sort by publish time. `<accept-ms>` is the epoch millisecond after which an entry nobody accepted
times out (0: never).
"""

from __future__ import annotations

import os
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
            self.present,
            self.outbox,
            self.subs,
        ]

    def sub(self, name: str) -> str:
        return os.path.join(self.subs, name)

    def inbox(self, name: str) -> str:
        return os.path.join(self.subs, name, "inbox")

    def taken(self, name: str) -> str:
        return os.path.join(self.subs, name, "taken")

    def cursor(self, name: str) -> str:
        return os.path.join(self.subs, name, "cursor")

    def subscription_file(self, name: str) -> str:
        return os.path.join(self.subs, name, "subscription.json")

    def canonical(self, message_id: str, state: str = "") -> str:
        return os.path.join(self.messages, message_id + (f".{state}" if state else ""))

    def retained_entry(self, seq: int) -> str:
        return os.path.join(self.retained, seq_name(seq))


def seq_name(seq: int) -> str:
    return f"{seq:0{SEQ_DIGITS}d}"


def timed_name(key: str, ms: int) -> str:
    """`<key>.<ms>`: an entry with a deadline in its name (renamed to move the deadline)."""
    return f"{key}.{ms}"


def split_timed(name: str) -> tuple[str, int] | None:
    """(key, ms) of a `timed_name`, or None for a foreign file."""
    key, dot, ms = name.rpartition(".")
    if not dot or not key or not ms.isdigit():
        return None
    return key, int(ms)


def retained_key(message_key: str, seq: int) -> str:
    return f"{message_key}+{seq}"


def key_seq(key: str) -> int | None:
    """The retained sequence number in a delivery key, if it has one."""
    _, plus, seq = key.rpartition("+")
    return int(seq) if plus and seq.isdigit() else None


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
