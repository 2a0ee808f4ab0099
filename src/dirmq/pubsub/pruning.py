"""The broadcast log's pruning (part of the sweep): the prefix of `broadcast/` that nobody may
accept any more is removed (its lowest remaining number saved first, for readers that find an
entry gone), and the newest entry, which keeps the numbering, is buried instead (seqlogs.py).
Before an entry goes, each subscription that was attached when it was published, matched it
and never read it is reported `timeout` for it, if its publisher asked for that outcome."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from dirmq.errors import CorruptMessage
from dirmq.pubsub.feed import load_state, saved_position
from dirmq.pubsub.layout import BROADCAST, PubSubPaths, listed, log_key
from dirmq.pubsub.model import Envelope, Filter, Outcome
from dirmq.pubsub.presence import read_subscription
from dirmq.pubsub.seqlogs import SeqLog, is_tombstone
from dirmq.pubsub.transitions import Transitions, read_entry

log = logging.getLogger("dirmq.pubsub")


@dataclass(frozen=True, slots=True)
class _Reader:
    """A subscription as the broadcast log's pruning sees it."""

    name: str
    filter: Filter
    attached_ms: int
    next_seq: int  # the next broadcast entry it would read
    detached_us: int | None


class BroadcastPruner:
    def __init__(self, paths: PubSubPaths, broadcast: SeqLog, transitions: Transitions) -> None:
        self._paths = paths
        self._log = broadcast
        self._transitions = transitions
        self._head_reported = 0  # the newest entry, once its timeouts are reported

    def prune(self, at_ms: int, grace_ms: int) -> int:
        """Remove the entries whose accept deadline passed `grace_ms` before `at_ms` (the
        newest is buried instead); how many files were removed."""
        log_ = self._log
        head = log_.refresh_head()
        floor = seq = log_.floor()
        readers: list[_Reader] | None = None
        doomed: list[tuple[str, str]] = []  # (path, message id)
        while seq < head:
            path = log_.path(seq)
            try:
                envelope = read_entry(path).envelope
            except FileNotFoundError:
                seq += 1
                continue
            except CorruptMessage as exc:
                if not is_tombstone(path):
                    log.error("removing damaged broadcast entry %s: %s", path, exc)
                envelope = None
            if envelope is not None:
                if envelope.accept_deadline_ms + grace_ms > at_ms:
                    break
                if envelope.wants(Outcome.TIMEOUT):
                    if readers is None:
                        readers = self._readers()
                    self._report_unread(path, seq, envelope, readers)
            doomed.append((path, "" if envelope is None else envelope.id))
            seq += 1
        removed = 0
        if seq != floor:
            log_.set_floor(seq)  # first: a reader that finds an entry gone looks here
            for path, message_id in doomed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed += 1
                if message_id:
                    self._transitions.finish(message_id)  # its body is not left readable
        if seq == head and head != self._head_reported:
            # The newest entry stays (it keeps the numbering), but its timeouts are due too.
            try:
                envelope = read_entry(log_.path(head)).envelope
            except (FileNotFoundError, CorruptMessage):
                return removed
            if envelope.accept_deadline_ms + grace_ms <= at_ms:
                self._head_reported = head
                if envelope.wants(Outcome.TIMEOUT):
                    readers = readers or self._readers()
                    self._report_unread(log_.path(head), head, envelope, readers)
                if log_.bury(head, self._paths.tmp):
                    self._transitions.finish(envelope.id)  # its body is not left readable
        return removed

    def _readers(self) -> list[_Reader]:
        """Every subscription with a broadcast position."""
        found = []
        for name in listed(self._paths.subs):
            record = read_subscription(self._paths, name)
            state, _saved = load_state(self._paths.cursor(name))
            position = saved_position(state, "broadcast")
            if record is None or position is None:
                continue
            detached = state.get("detached_us")
            detached_us = detached if isinstance(detached, int) else None
            found.append(_Reader(name, record[0], record[1], position, detached_us))
        return found

    def _report_unread(
        self, path: str, seq: int, envelope: Envelope, readers: list[_Reader]
    ) -> None:
        published_ms = envelope.published_us // 1000
        key = log_key(envelope.key, BROADCAST, seq)
        for reader in readers:
            if (
                reader.next_seq <= seq
                and reader.attached_ms <= published_ms
                and (reader.detached_us is None or reader.detached_us >= envelope.published_us)
                and reader.filter.matches(envelope.channel, envelope.subject)
            ):
                self._transitions.report_linked(
                    path, key, envelope, reader.name, Outcome.TIMEOUT, 0
                )
