"""A subscription's reading of one log (`broadcast/` or `retained/`): its position, what it
holds and what it gave back, all in memory (saved in the subscription's `cursor`).

A log delivery changes no file: the subscription remembers the sequence numbers it holds
(`held`), those it gave back and may deliver again (`retry`, a heap, oldest first), those given
back that wait out their backoff (`waiting`, by due time), and how often each was delivered
(`deliveries`). `head` finds the next entry to offer: a returned one first, else the next
wanted entry of the log, skipping pruned, missing and damaged ones.
"""

from __future__ import annotations

import heapq
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dirmq.errors import CorruptMessage
from dirmq.pubsub.layout import log_key
from dirmq.pubsub.model import Envelope
from dirmq.pubsub.seqlogs import SeqLog, is_tombstone
from dirmq.pubsub.transitions import Entry, read_entry

log = logging.getLogger("dirmq.pubsub")


@dataclass(slots=True)
class Feed:
    """This subscription's reading of one log."""

    letter: str  # RETAINED or BROADCAST
    log: SeqLog
    next_seq: int
    held: set[int] = field(default_factory=set)
    retry: list[int] = field(default_factory=list)  # heap of returned sequence numbers
    returned: dict[int, tuple[Entry, int]] = field(
        default_factory=dict
    )  # seq -> (entry, accept ms)
    waiting: list[tuple[int, int]] = field(default_factory=list)  # heap of returned (due ms, seq)
    deliveries: dict[int, int] = field(default_factory=dict)  # held or returned seq -> count
    pending_after_attach: list[int] = field(default_factory=list)  # returned by a past session
    peeked: tuple[int, Entry] | None = None
    # `broadcast` after re-attaching: entries up to `skip_through` published while it was away
    # (after `away_since_us`) were not for it.
    skip_through: int = 0
    away_since_us: int | None = None
    maybe_pruned: bool = True
    # Something may have been appended since the last probe found nothing (an inotify event,
    # a rescan): probing an idle log on every receive would cost an open and a stat.
    dirty: bool = True

    @classmethod
    def from_saved(cls, letter: str, seq_log: SeqLog, saved: object, start: int) -> Feed:
        """The feed as a past session saved it (`state`), or a new one reading from `start`."""
        if not isinstance(saved, dict):
            return cls(letter, seq_log, start)
        feed = cls(letter, seq_log, max(1, int(saved.get("next", start))))
        feed.pending_after_attach = [int(s) for s in saved.get("pending", []) if int(s) > 0]
        counts = saved.get("deliveries")
        if isinstance(counts, dict):
            for seq, n in counts.items():
                if str(seq).isdigit() and isinstance(n, int) and n > 0:
                    feed.deliveries[int(seq)] = n
        return feed

    def state(self) -> dict[str, Any]:
        pending = self.held | set(self.retry) | {seq for _due, seq in self.waiting}
        counts = {str(seq): n for seq, n in sorted(self.deliveries.items()) if n > 1}
        return {"next": self.next_seq, "pending": sorted(pending), "deliveries": counts}

    def give_back(self, seq: int, entry: Entry, accept_ms: int, due_ms: int) -> None:
        """A held delivery returns: deliverable again from `due_ms` (0: at once), accepted by
        `accept_ms` (0: never times out)."""
        self.held.discard(seq)
        self.returned[seq] = (entry, accept_ms)
        if due_ms:
            heapq.heappush(self.waiting, (due_ms, seq))
        else:
            heapq.heappush(self.retry, seq)

    def release_due(self, at_ms: int) -> None:
        """Returned deliveries whose backoff is over become deliverable again."""
        while self.waiting and self.waiting[0][0] <= at_ms:
            heapq.heappush(self.retry, heapq.heappop(self.waiting)[1])

    def head(self, wanted: Callable[[int, Envelope], bool]) -> tuple[str, int, Entry] | None:
        """The next delivery this feed offers: (key, seq, entry), without taking it; a returned
        one first (load `pending_after_attach` before), else the next entry `wanted` accepts."""
        if self.retry:
            seq = self.retry[0]
            entry = self.returned[seq][0]
            return log_key(entry.envelope.key, self.letter, seq), seq, entry
        while self.peeked is None:
            if not self.dirty:
                return None
            seq = self.next_seq
            try:
                entry = read_entry(self.log.path(seq))
            except FileNotFoundError:
                if self.log.prunable and self.maybe_pruned:
                    self.maybe_pruned = False
                    floor = self.log.floor()
                    if floor > seq:  # what we had not read yet timed out and was pruned
                        self.next_seq = floor
                        continue
                # `seq + 1` is linked only once `seq` exists: if it is there and `seq` still is
                # not (checked again: it may have appeared since our open), it was deleted.
                if os.path.exists(self.log.path(seq + 1)):
                    if os.path.exists(self.log.path(seq)):
                        continue
                    if self.log.floor() > seq:
                        self.next_seq = self.log.floor()
                        continue
                    log.error("log entry %s is missing; skipping it", self.log.path(seq))
                    self.next_seq += 1
                    continue
                self.dirty = False
                return None
            except CorruptMessage as exc:
                if not is_tombstone(self.log.path(seq)):  # (a buried entry: nothing to say)
                    log.error("skipping damaged log entry %s: %s", self.log.path(seq), exc)
                self.next_seq += 1
                continue
            if not wanted(seq, entry.envelope):
                self.next_seq += 1
                continue
            self.peeked = (seq, entry)
        seq, entry = self.peeked
        return log_key(entry.envelope.key, self.letter, seq), seq, entry


@dataclass(slots=True)
class Held:
    """A delivery a subscription holds."""

    deadline: int
    envelope: Envelope
    path: str  # taken/ entry (anyone) or log entry
    feed: Feed | None = None  # None: an `anyone` delivery
    seq: int = 0
    entry: Entry | None = None
    deliveries: int = 1  # this delivery's number


def load_state(path: str) -> tuple[dict[str, Any], int | None]:
    """A subscription's saved positions and when they were saved (µs), or ({}, None)."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read() or b"{}")
            saved_us = os.fstat(f.fileno()).st_mtime_ns // 1000
    except (FileNotFoundError, ValueError):
        return {}, None
    if isinstance(data, int):  # format of the first release: the retained position only
        return {"retained": {"next": data, "pending": []}}, saved_us
    return (data if isinstance(data, dict) else {}), saved_us


def saved_position(state: dict[str, Any], log_name: str) -> int | None:
    """The next sequence number of log `log_name` in saved positions (`load_state`), if any."""
    found = state.get(log_name)
    if isinstance(found, dict) and isinstance(found.get("next"), int):
        return int(found["next"])
    return None
