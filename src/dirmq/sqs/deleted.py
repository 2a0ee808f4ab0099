"""AWS refuses to create a queue within 60 s of deleting one of the same name
(`QueueDeletedRecently`). dirmq does the same when asked to (`dirmq serve
--sqs-delay-recently-deleted`); by default it does not, as LocalStack does not, because test
fixtures delete and recreate their queues at once.

Every process serving the root must know of a deletion, so it is a file:
`<root>/@sqs/deleted/<name>`, whose mtime is the moment of the deletion. A marker older than the
window is removed by the next CreateQueue of that name.
"""

from __future__ import annotations

import contextlib
import os
import time

from dirmq.store import layout
from dirmq.store.filemodes import Access

WINDOW_S = 60.0
MESSAGE = (
    "You must wait 60 seconds after deleting a queue before you can create another with the "
    "same name."
)


def marker_path(root: str, name: str) -> str:
    return os.path.join(root, layout.SQS_DIR, "deleted", name)


def record(root: str, name: str, access: Access) -> None:
    """Note that queue `name` was deleted now (a new marker with the root's `access`)."""
    path = marker_path(root, name)
    access.makedirs(os.path.dirname(path))
    os.close(access.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC))
    os.utime(path)  # an existing marker (deleted twice) starts its window again


def deleted_recently(root: str, name: str, window_s: float = WINDOW_S) -> bool:
    """Whether `name` was deleted less than `window_s` ago; forgets an older deletion."""
    path = marker_path(root, name)
    try:
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False
    if age < window_s:
        return True
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return False
