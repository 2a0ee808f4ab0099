"""Worker processes for the commit journal's tests: `python -m tests.support.journal_workers
ROLE ...`. Each role prints one line per event to stdout (flushed)."""

from __future__ import annotations

import errno
import os
import sys
import threading

import pytest

import dirmq
from dirmq.store import fsio, layout
from dirmq.store import journal as journal_module
from dirmq.store.filemodes import root_access
from dirmq.store.journal_replay import recover_journals

from .faultfs import FaultyFS
from .waiting import wait_until


def publish(root: str, queue: str) -> None:
    """Publish single messages and batches until killed, printing each publish's ids once it
    has returned (acknowledged)."""
    store = dirmq.Store(root)
    q = store.queue(queue)
    for n in range(1_000_000):
        if n % 2:
            print(q.put(b"single %d" % n), flush=True)
        else:
            print(*q.put_many([b"batch %d.%d" % (n, i) for i in range(5)]), flush=True)


def recover(root: str) -> None:
    """Wait for a line on stdin (so that two start together), recover the root's journals,
    print how many messages this process wrote back."""
    access = root_access(root)  # not a Store: its open would recover before the line came
    sys.stdin.readline()
    print(recover_journals(root, access), flush=True)


def publish_unflushed(root: str, queue: str) -> None:
    """Publish one message on a failing disk: its checkpoint's `syncfs` fails (EIO), and so
    does every rename (the journal cannot be renamed `unflushed.`). Print its id once the
    journal was given up (the Store's journal off), then wait to be killed."""
    store = dirmq.Store(root)
    q = store.queue(queue)
    patches = pytest.MonkeyPatch()
    faults = FaultyFS(patches, root)
    patches.setattr(journal_module, "syncfs", fsio.syncfs)  # the faulty one
    faults.fail("syncfs", errno.EIO)
    message_id = q.put(b"unflushed")
    faults.fail("rename", errno.EIO)
    journal = store.journal
    wait_until(lambda: faults.raised["rename"] and journal._thread is None, 30, "given up")
    print(message_id, flush=True)
    threading.Event().wait()


def publish_recreate(root: str, queue: str) -> None:
    """Publish into `queue`, delete it, create it again, publish into the new one, all within
    one checkpoint; print both ids, then wait to be killed (a crash: both records kept)."""
    patches = pytest.MonkeyPatch()
    patches.setattr(journal_module, "CHECKPOINT_S", 3600.0)  # no checkpoint clears a record
    store = dirmq.Store(root)
    old = store.queue(queue).put(b"old")
    store.delete_queue(queue)
    new = store.create_queue(queue).put(b"new")
    print(old, new, flush=True)
    threading.Event().wait()


def publish_without_statx(root: str, queue: str, statx: str = "none") -> None:
    """Publish once as a process whose C library has no `statx` (glibc before 2.28: CentOS 7,
    Amazon Linux 2) does, its records naming their queue's inode alone (birth 0), or (`statx`
    "real") as any other; print the id, then wait to be killed (a crash: the record kept)."""
    from dirmq.store import incarnation

    patches = pytest.MonkeyPatch()
    if statx == "none":
        patches.setattr(incarnation, "_statx", None)
    patches.setattr(journal_module, "CHECKPOINT_S", 3600.0)  # no checkpoint clears the record
    store = dirmq.Store(root)
    print(store.queue(queue).put(b"no statx"), flush=True)
    threading.Event().wait()


def publish_then_exec(root: str, queue: str) -> None:
    """Publish once (its journal left open), print the id and the journals, then re-execute
    this process (same pid, same start time) as `publish_after_exec`."""
    store = dirmq.Store(root)
    message_id = store.queue(queue).put(b"before exec")
    print(message_id, *os.listdir(os.path.join(root, layout.JOURNAL_DIR)), flush=True)
    module = "tests.support.journal_workers"
    os.execv(sys.executable, [sys.executable, "-m", module, "publish_after_exec", root, queue])


def publish_after_exec(root: str, queue: str) -> None:
    """The image after the exec: open the root (which recovers journals), publish once, print
    the id and the journals, then wait to be killed."""
    store = dirmq.Store(root)
    message_id = store.queue(queue).put(b"after exec")
    print(message_id, *os.listdir(os.path.join(root, layout.JOURNAL_DIR)), flush=True)
    threading.Event().wait()


ROLES = {
    "publish": lambda a: publish(a[0], a[1]),
    "recover": lambda a: recover(a[0]),
    "publish_unflushed": lambda a: publish_unflushed(a[0], a[1]),
    "publish_recreate": lambda a: publish_recreate(a[0], a[1]),
    "publish_without_statx": lambda a: publish_without_statx(*a),
    "publish_then_exec": lambda a: publish_then_exec(a[0], a[1]),
    "publish_after_exec": lambda a: publish_after_exec(a[0], a[1]),
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](sys.argv[2:])
