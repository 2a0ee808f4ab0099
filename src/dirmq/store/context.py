"""What a queue needs from the `Store` that opened it, as one value.

`Store` builds a `QueueContext` and hands it to each `Queue` and its `QueueFiles`, instead of a
reference to itself: the queue modules then never import `root.py`, and what they may use of
their root is written down here (how to watch, the flushes shared by every queue of the root,
where a queue's dead letters go, whom to tell of a corrupt file, what modes its new files get).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dirmq.store.config import QueueConfig
from dirmq.store.events import NO_EVENTS, StoreEvents
from dirmq.store.filemodes import Access
from dirmq.store.fsio import GroupCommit
from dirmq.store.holders import Holders
from dirmq.store.journal import Journal
from dirmq.store.watch import InotifyHub
from dirmq.store.writeback import WritebackFlusher


@dataclass(frozen=True, slots=True)
class QueueContext:
    watch_mode: str  # "auto", "inotify" or "poll" (watch.open_watcher)
    poll_interval_s: float
    inotify_hub: Callable[[], InotifyHub]  # the root's one inotify instance, made on first use
    group_commit: GroupCommit  # writethrough publishes of every queue share its flushes
    writeback: WritebackFlusher  # writeback publishes mark it dirty
    # The @ready directory of dead-letter queue `name`, or None if unset or absent.
    dead_letter_dir: Callable[[str | None], str | None]
    access: Access  # the modes of every file and directory the queue creates (filemodes.py)
    # The shared-filesystem mode (filesystems.py): other hosts act on the same names through
    # their own caches, so no transition may count on this kernel seeing every change.
    shared: bool = False
    # The Store's commit journal (journal.py); None: every writethrough group is flushed itself.
    journal: Journal | None = None
    # What the Store's owner is told as it happens (events.py: the server's metrics).
    events: StoreEvents = NO_EVENTS
    # Who holds leases: this process's holder tokens and every process's records (holders.py);
    # None: leases name nobody.
    holders: Holders | None = None
    # A configuration from its file's bytes (ConfigError if bad): the Store's, which shares one
    # parse among queues of the same bytes.
    parse_config: Callable[[bytes], QueueConfig] = QueueConfig.loads
