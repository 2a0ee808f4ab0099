"""The retained log of `future` messages: `retained/<seq>`, dense sequence numbers from 1.

Appending links the message file to the next free number with `link(2)`, which fails with
EEXIST instead of replacing: two writers (threads, processes or hosts) racing for a number never
both get it, and a writer only moves past `n` once `n` exists, so the log has no holes and a
reader waiting for `n + 1` after `n` never misses an entry. Entries are never removed (that is
what makes a number unique forever); `dirmq fsck`-style tools may only read them.
"""

from __future__ import annotations

import os
import threading

from dirmq.pubsub.layout import SEQ_DIGITS, PubSubPaths

_RESCAN_AFTER = 64  # EEXIST in a row: our idea of the head is stale, list the directory


class RetainedLog:
    def __init__(self, paths: PubSubPaths) -> None:
        self._paths = paths
        self._lock = threading.Lock()
        self._head: int | None = None  # highest sequence number known to exist

    def head(self) -> int:
        """The highest sequence number in the log (0 if empty), listing it once per process."""
        with self._lock:
            if self._head is None:
                self._head = self._scan()
            return self._head

    def _scan(self) -> int:
        last = 0
        for name in os.listdir(self._paths.retained):
            if len(name) == SEQ_DIGITS and name.isdigit():
                last = max(last, int(name))
        return last

    def append(self, source: str) -> int:
        """Link `source` into the log at the next free sequence number and return it."""
        with self._lock:
            if self._head is None:
                self._head = self._scan()
            seq = self._head + 1
            misses = 0
            while True:
                try:
                    os.link(source, self._paths.retained_entry(seq))
                except FileExistsError:
                    misses += 1
                    seq = self._scan() + 1 if misses % _RESCAN_AFTER == 0 else seq + 1
                    continue
                self._head = seq
                return seq

    def path(self, seq: int) -> str:
        return self._paths.retained_entry(seq)
