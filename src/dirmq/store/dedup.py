"""Publish-side deduplication: a message whose dedup id was already published within the
queue's window is not stored again; the publisher gets the original message's id back.

`@dedup/<sha256 of the dedup id>` is a symlink to the message id, created (exclusively) right
after the message is durable; its mtime is when. The order matters for crash safety: recording
first and crashing before the publish would make every retry a "duplicate" of a message that
never existed, i.e. lose it. Publishing first means the worst case of a crash, or of two
publishers racing with the same id, is one extra copy (at-least-once), and a publisher that
loses the race withdraws its own copy at once.
"""

from __future__ import annotations

import hashlib
import os
import time

from dirmq.errors import StorageError, storage_error
from dirmq.store.filemodes import Access


class Dedup:
    def __init__(self, directory: str, access: Access) -> None:
        self._dir = directory
        self._access = access

    def _path(self, dedup_id: str) -> str:
        return os.path.join(self._dir, hashlib.sha256(dedup_id.encode()).hexdigest()[:40])

    def lookup(self, dedup_id: str, window_s: float) -> str | None:
        """The id of the message published with `dedup_id` within the window, if any."""
        path = self._path(dedup_id)
        try:
            message_id = os.readlink(path)
            age_s = time.time() - os.lstat(path).st_mtime
        except FileNotFoundError:
            return None
        except OSError as exc:  # not "no record": that would store a duplicate
            raise storage_error(exc, "looking up a dedup id") from exc
        return message_id if age_s < window_s else None

    def record(self, dedup_id: str, message_id: str, window_s: float) -> str:
        """Record that `message_id` carries `dedup_id`; returns the id that owns the dedup id
        (another publisher's if it recorded first within the window)."""
        path = self._path(dedup_id)
        try:
            for _attempt in range(3):
                try:
                    os.symlink(message_id, path)
                    return message_id
                except FileExistsError:
                    existing = self.lookup(dedup_id, window_s)
                    if existing is not None:
                        return existing
                    try:  # an expired record: replace it
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                except FileNotFoundError:  # a queue from before @dedup existed
                    self._access.makedirs(self._dir)
        except OSError as exc:  # the message is stored already: at least once, as after a crash
            if isinstance(exc, StorageError):  # from lookup
                raise
            raise storage_error(exc, "recording a dedup id") from exc
        return message_id

    def expire(self, window_s: float) -> int:
        """Remove records older than the window; returns how many (StorageError if one cannot
        be removed now: a listing that fails waits for the next sweep)."""
        removed = 0
        now = time.time()
        try:
            entries = list(os.scandir(self._dir))
        except OSError:  # gone, or unreadable now (a failing disk): expired next time
            return 0
        for entry in entries:
            try:
                if now - entry.stat(follow_symlinks=False).st_mtime >= window_s:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise storage_error(exc, "removing an expired dedup record") from exc
        return removed
