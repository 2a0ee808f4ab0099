"""Reporting outcomes to publishers, through an ordinary queue they name (`reply_to`).

An outcome report is a JSON message put in the publisher's reply queue, so it is kept while the
publisher is away and can be read with any transport (library, HTTP, SQS, CLI). Reports are
exactly-once per (message, subscriber, outcome, attempt): each carries that as its dedup id, so
re-reporting after a crash (from `outbox/`) stores nothing twice.

Reliability comes from the order of operations in `PubSub`: a terminal transition first renames
the entry into `outbox/` (the decision), then reports, then removes the outbox entry; a sweeper
re-reports outbox entries a crash left behind.
"""

from __future__ import annotations

import json
import threading
import time

from dirmq.errors import QueueNotFound
from dirmq.pubsub.model import Envelope, Outcome
from dirmq.store.config import QueueConfig
from dirmq.store.queue import Queue
from dirmq.store.root import Store

REPLY_DEDUP_WINDOW_S = 24 * 3600.0


def report_body(envelope: Envelope, outcome: Outcome, subscriber: str, at_ms: int) -> bytes:
    return json.dumps(
        {
            "id": envelope.id,
            "outcome": outcome.value,
            "subscriber": subscriber or None,
            "channel": envelope.channel,
            "subject": envelope.subject,
            "mode": envelope.mode.value,
            "at_ms": at_ms,
        },
        separators=(",", ":"),
    ).encode()


class OutcomeReporter:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._known: set[str] = set()

    def _queue(self, name: str) -> Queue:
        if name not in self._known:
            # Created on first use with a long dedup window: re-reports must be recognised.
            self._store.create_queue(name, QueueConfig(dedup_window_s=REPLY_DEDUP_WINDOW_S))
            with self._lock:
                self._known.add(name)
        return self._store.queue(name)

    def report(
        self, envelope: Envelope, outcome: Outcome, subscriber: str = "", attempt: int = 0
    ) -> bool:
        """Put the outcome in the publisher's reply queue if it asked for it; True if sent."""
        if not envelope.wants(outcome) or envelope.reply_to is None:
            return False
        body = report_body(envelope, outcome, subscriber, int(time.time() * 1000))
        headers = {
            "Content-Type": "application/json",
            "X-Attr-Outcome": outcome.value,
            "X-Attr-Message-Id": envelope.id,
        }
        dedup_id = f"{envelope.key}~{subscriber}~{outcome.value}~{attempt}"
        try:
            queue = self._queue(envelope.reply_to)
            queue.put(body, headers, dedup_id=dedup_id)
        except QueueNotFound:  # deleted under us: recreate once
            with self._lock:
                self._known.discard(envelope.reply_to)
            self._queue(envelope.reply_to).put(body, headers, dedup_id=dedup_id)
        return True
