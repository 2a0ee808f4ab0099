"""Claim tokens: how a claim in the shared-filesystem mode makes sure it won (docs/FORMAT.md,
"Filesystems").

On a shared filesystem a rename whose target already is the same file succeeds doing nothing
(POSIX), and another host's client may still resolve a @ready name to the file this host's
claim has just moved to its lease name: two hosts whose gets began in the same millisecond pick
one lease name (`<id>.<count>.<deadline_ms>`) for the head of the queue, and both renames
"succeed" (GlusterFS: about 10% of such races; with different target names, never). So before
its rename a claim takes the lease name's token, `@tmp/<lease name>.claim`, created with O_EXCL
(exclusive between hosts): only the host that made it renames, and its target is then a name
nobody else renames to, so a stale source gets ENOENT.

A token is kept `HOLD_S`, also when the rename found nothing (a claim that lost costs two
operations, not three; nobody else wants that lease name then: a claim of it by another host
would have met our token, or finds the message gone as we did). By then another get that began
in the same millisecond has made its own attempt, or gives up (`fresh`: a get more than `HOLD_S
/ 2` old claims nothing more, since its lease names could meet a token that is gone). A process
that exits leaves its last tokens: empty temp files, which recovery removes after an hour like
any unattributed temp file.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque

from dirmq.store.filemodes import Access

HOLD_S = 10.0
SUFFIX = ".claim"


class ClaimTokens:
    """The claim tokens this process holds in one queue's @tmp."""

    def __init__(self, tmp_dir: str, access: Access) -> None:
        self._dir = tmp_dir
        self._access = access
        self._held: deque[tuple[float, str]] = deque()  # (unlink after, path), oldest first
        self._lock = threading.Lock()

    @staticmethod
    def fresh(at_ms: int, now_ms: int) -> bool:
        """Whether a get that began at `at_ms` may still claim (see the module docstring)."""
        return now_ms - at_ms <= HOLD_S * 500

    def take(self, lease: str) -> str | None:
        """The token of lease name `lease`, created now; None if another claim holds it.
        FileNotFoundError if @tmp is gone (the queue is); other OSErrors propagate."""
        self.expire(time.monotonic())
        path = f"{self._dir}/{lease}{SUFFIX}"
        try:
            os.close(self._access.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            return None
        return path

    def keep(self, path: str) -> None:
        """The claim of `path` was tried: keep the token `HOLD_S`."""
        with self._lock:
            self._held.append((time.monotonic() + HOLD_S, path))

    def drop(self, path: str) -> None:
        """The claim of `path` failed with an error: it was not tried."""
        _unlink_quietly(path)

    def expire(self, now: float) -> None:
        """Unlink the tokens held `HOLD_S`."""
        while True:
            with self._lock:
                if not self._held or self._held[0][0] > now:
                    return
                path = self._held.popleft()[1]
            _unlink_quietly(path)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass  # gone, or not removable now: recovery removes it after an hour
