"""One subscription's index of the shared `anyone` pool, in this process: the pool's names
that match its filter, earliest first, so that taking a message never lists `anyone/`.

A name is learnt from an inotify event (or a rescan) and read once (`examine`), when the
subscription next looks for something to take: matching names join the queue, the others are
remembered as skipped. A name given back with a backoff (`<due-ms>` in its name: layout.py)
waits in a second heap until it is due. A name another subscriber took, or that timed out,
leaves by its event, or, if it is still the head, when the one rename that takes it fails."""

from __future__ import annotations

import heapq
import os

from dirmq.errors import CorruptMessage
from dirmq.pubsub.layout import listed, split_entry
from dirmq.pubsub.model import Envelope, Filter
from dirmq.pubsub.transitions import read_entry
from dirmq.store.clock import now_ms


class PoolIndex:
    def __init__(self, anyone: str, filter: Filter) -> None:
        self._dir = anyone
        self._filter = filter
        self._due: list[str] = []  # heap of matching names deliverable now
        self._envelopes: dict[str, Envelope] = {}  # matching names that exist
        self._unread: set[str] = set()  # names not examined yet
        self._skipped: set[str] = set()  # examined, not for this filter
        self._later: list[tuple[int, str]] = []  # heap of matching names not due yet

    def rescan(self) -> None:
        """Catch up with the directory after missed events (or at the start)."""
        names = set(listed(self._dir))
        self._envelopes = {n: e for n, e in self._envelopes.items() if n in names}
        self._due, self._later = [], []
        for name in self._envelopes:
            self._push(name)
        heapq.heapify(self._due)
        self._skipped &= names
        self._unread = names - self._skipped - set(self._envelopes)

    def added(self, name: str) -> None:
        self._unread.add(name)

    def removed(self, name: str) -> None:
        self._unread.discard(name)
        self._skipped.discard(name)
        self._envelopes.pop(name, None)

    def head(self) -> str | None:
        """The earliest matching name deliverable now, if any (it stays in the index)."""
        self._examine()
        at_ms = now_ms()
        while self._later and self._later[0][0] <= at_ms:
            name = heapq.heappop(self._later)[1]
            if name in self._envelopes:
                heapq.heappush(self._due, name)
        while self._due and self._due[0] not in self._envelopes:
            heapq.heappop(self._due)
        return self._due[0] if self._due else None

    def pop(self, name: str) -> Envelope:
        """Take `name`, the `head`, out of the index: its envelope."""
        assert self._due and self._due[0] == name
        heapq.heappop(self._due)
        return self._envelopes.pop(name)

    def next_due_ms(self) -> int | None:
        """When the first name given back with a backoff becomes deliverable."""
        return self._later[0][0] if self._later else None

    def _examine(self) -> None:
        for name in self._unread:
            try:
                entry = read_entry(os.path.join(self._dir, name))
            except FileNotFoundError:
                continue
            except CorruptMessage:
                self._skipped.add(name)
                continue
            envelope = entry.envelope
            if self._filter.matches(envelope.channel, envelope.subject):
                self._envelopes[name] = envelope
                self._push(name)
            else:
                self._skipped.add(name)
        self._unread.clear()

    def _push(self, name: str) -> None:
        """Index a matching name: deliverable now, or once its backoff is over."""
        parsed = split_entry(name)
        if parsed is not None and parsed.due_ms > now_ms():
            heapq.heappush(self._later, (parsed.due_ms, name))
        else:
            heapq.heappush(self._due, name)
