"""Making a bucket directory (the backlog's, backlog.py; a delay minute's, delays.py) on which a
message's rename is about to rely."""

from __future__ import annotations

from dirmq.errors import storage_error
from dirmq.store.filemodes import Access
from dirmq.store.fsio import fsync_dir


def make_bucket_dir(access: Access, path: str, parent: str, durable: bool, what: str) -> bool:
    """mkdir `path` with the root's mode, and when `durable` flush its entry into `parent`, also
    when it was there already: another process may have made it a moment ago and not flushed it
    yet (or made it for a queue of `memory` durability), and the message renamed into it must not
    outlive a crash only to lose its directory. True if `path` is there now, made or found;
    False if a directory above it is missing. FileNotFoundError if it was removed before its
    flush (a refill or a consumer emptied it): the caller makes it again."""
    try:
        access.mkdir(path)
    except FileExistsError:
        pass
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise storage_error(exc, f"making {what} {path}") from exc
    if durable:
        fsync_dir(parent)
    return True
