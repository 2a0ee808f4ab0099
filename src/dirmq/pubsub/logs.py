"""Sequence logs: `retained/` (mode `future`, kept forever) and `broadcast/` (mode `everyone`,
pruned once nobody may accept an entry any more). Entries are `<seq, 16 digits>`, dense from 1.

Appending links the message file to the next free number with `link(2)`, which fails with
EEXIST instead of replacing: two writers (threads, processes or hosts) never get one number, and
a writer only moves past `n` once `n` exists, so a log has no holes and a reader waiting for
`n + 1` never misses an entry.

Pruning (broadcast only) removes a prefix, never the newest entry, and records the lowest
remaining number in `<log>.floor`. A writer whose idea of the head is older than a pruned range
could re-use a pruned number, so after each link it checks that `n - 1` exists and `n` is not
below the floor, and otherwise withdraws its link and looks for the real head.
"""

from __future__ import annotations

import contextlib
import os
import threading

from dirmq.pubsub.layout import SEQ_DIGITS, seq_name

_RESCAN_AFTER = 64  # EEXIST in a row: our idea of the head is stale, list the directory


class SeqLog:
    def __init__(self, directory: str, *, prunable: bool) -> None:
        self.directory = directory
        self.prunable = prunable
        self._floor_file = directory + ".floor"
        self._lock = threading.Lock()
        self._head: int | None = None  # highest sequence number known to exist

    def path(self, seq: int) -> str:
        return os.path.join(self.directory, seq_name(seq))

    def head(self) -> int:
        """The highest sequence number in the log (0 if empty), listing it once per process."""
        with self._lock:
            if self._head is None:
                self._head = self.scan()
            return self._head

    def refresh_head(self) -> int:
        """The head, catching up with other writers by probing the next numbers (no listing)."""
        head = self.head()
        while os.path.exists(self.path(head + 1)):
            head += 1
        with self._lock:
            self._head = max(self._head or 0, head)
            return self._head

    def scan(self) -> int:
        last = 0
        for name in os.listdir(self.directory):
            if len(name) == SEQ_DIGITS and name.isdigit():
                last = max(last, int(name))
        return last

    def floor(self) -> int:
        """The lowest sequence number that may still exist (1 unless pruned)."""
        if not self.prunable:
            return 1
        try:
            with open(self._floor_file, "rb") as f:
                return max(1, int(f.read().strip() or b"1"))
        except (FileNotFoundError, ValueError):
            return 1

    def set_floor(self, seq: int) -> None:
        tmp = f"{self._floor_file}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(str(seq).encode())
        os.replace(tmp, self._floor_file)

    def append(self, source: str) -> int:
        """Link `source` into the log at the next free sequence number and return it."""
        with self._lock:
            if self._head is None:
                self._head = self.scan()
            seq = self._head + 1
            misses = 0
            while True:
                target = self.path(seq)
                try:
                    os.link(source, target)
                except FileExistsError:
                    misses += 1
                    seq = self.scan() + 1 if misses % _RESCAN_AFTER == 0 else seq + 1
                    continue
                if self.prunable and self._reused_pruned(seq):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(target)
                    seq = max(self.scan(), self.floor()) + 1
                    continue
                self._head = seq
                return seq

    def _reused_pruned(self, seq: int) -> bool:
        if seq < self.floor():
            return True
        return seq > 1 and not os.path.exists(self.path(seq - 1))
