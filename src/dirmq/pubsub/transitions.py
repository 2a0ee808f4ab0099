"""State transitions of pub/sub entries, each decided by one rename (or exclusive link).

Whoever's rename succeeds owns the transition and reports its outcome; a loser gets ENOENT (or
EEXIST) and does nothing, so concurrent subscribers, sweepers and processes never report twice.
When the publisher asked for the outcome, the decision goes through `outbox/` first:

    settle (done, dismissed, timeout):  rename entry -> outbox;  report;  unlink outbox
    abort  (returned to the queue):     link entry -> outbox;  rename entry -> pool/inbox;
                                        report;  unlink outbox
    accept (a subscriber takes it):     rename/link source -> taken;  link taken -> outbox;
                                        report;  unlink outbox

so a crash (or a failed report: disk full, reply queue deleted) leaves an outbox entry that the
sweeper reports later; reports carry a dedup id, so a report is never stored twice.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

from dirmq.errors import DirmqError
from dirmq.pubsub.layout import (
    PubSubPaths,
    key_seq,
    outbox_name,
    timed_name,
)
from dirmq.pubsub.model import Envelope, Mode, Outcome
from dirmq.pubsub.outcomes import OutcomeReporter
from dirmq.store.codec import decode

log = logging.getLogger("dirmq.pubsub")


@dataclass(frozen=True, slots=True)
class Entry:
    envelope: Envelope
    body: bytes
    headers: dict[str, str]


def read_entry(path: str) -> Entry:
    """Read and decode the message file behind an entry (FileNotFoundError if it moved on;
    CorruptMessage if it is damaged)."""
    with open(path, "rb") as f:
        decoded = decode(f.read())
    return Entry(Envelope.from_system(decoded.system), decoded.body, decoded.headers)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Transitions:
    def __init__(self, paths: PubSubPaths, reporter: OutcomeReporter) -> None:
        self.paths = paths
        self.reporter = reporter

    def _outbox(self, key: str, subscriber: str, outcome: Outcome, attempt: int) -> str:
        return os.path.join(self.paths.outbox, outbox_name(key, subscriber, outcome, attempt))

    def report_from_outbox(
        self, box: str, envelope: Envelope, outcome: Outcome, subscriber: str, attempt: int
    ) -> bool:
        """Report, then drop the outbox entry; on failure keep it for the sweeper."""
        try:
            self.reporter.report(envelope, outcome, subscriber, attempt)
        except (DirmqError, OSError) as exc:
            log.warning("outcome %s of %s not reported yet: %s", outcome, envelope.id, exc)
            return False
        _unlink_quietly(box)
        return True

    def settle(
        self, path: str, key: str, envelope: Envelope, subscriber: str, outcome: Outcome
    ) -> bool:
        """Remove the entry at `path` for good (done, dismissed, timeout); False if it was gone."""
        if not envelope.wants(outcome):
            try:
                os.unlink(path)
            except FileNotFoundError:
                return False
            return True
        box = self._outbox(key, subscriber, outcome, 0)
        try:
            os.rename(path, box)
        except FileNotFoundError:
            return False
        self.report_from_outbox(box, envelope, outcome, subscriber, 0)
        return True

    def return_path(self, key: str, envelope: Envelope, subscriber: str, at_ms: int) -> str:
        """Where an aborted delivery goes back to: the shared pool for `anyone`, else the
        subscriber's inbox (a retained message never times out there)."""
        accept_ms = at_ms + int(envelope.accept_timeout_s * 1000)
        if envelope.mode is Mode.ANYONE:
            return os.path.join(self.paths.anyone, timed_name(key, accept_ms))
        if key_seq(key) is not None:
            accept_ms = 0
        return os.path.join(self.paths.inbox(subscriber), timed_name(key, accept_ms))

    def abort(self, path: str, key: str, envelope: Envelope, subscriber: str, attempt: int) -> bool:
        """Return a taken delivery to its queue (aborted); False if it was settled meanwhile."""
        target = self.return_path(key, envelope, subscriber, now_ms())
        box = None
        if envelope.wants(Outcome.ABORTED):
            box = self._outbox(key, subscriber, Outcome.ABORTED, attempt)
            try:
                os.link(path, box)
            except (FileExistsError, FileNotFoundError):  # another process is on it, or it's gone
                return False
        try:
            os.rename(path, target)
        except FileNotFoundError:
            if box is not None:
                _unlink_quietly(box)
            return False
        if box is not None:
            self.report_from_outbox(box, envelope, Outcome.ABORTED, subscriber, attempt)
        return True

    def accept(
        self, source: str, key: str, envelope: Envelope, subscriber: str, *, link: bool
    ) -> tuple[str, int] | None:
        """Take `source` into the subscriber's `taken/` (rename, or link for a retained entry);
        returns (path, deadline ms), or None if another subscriber took it first."""
        deadline = now_ms() + int(envelope.process_timeout_s * 1000)
        taken = os.path.join(self.paths.taken(subscriber), timed_name(key, deadline))
        try:
            if link:
                os.link(source, taken)
            else:
                os.rename(source, taken)
        except (FileNotFoundError, FileExistsError):
            return None
        if envelope.wants(Outcome.ACCEPTED):
            box = self._outbox(key, subscriber, Outcome.ACCEPTED, deadline)
            try:
                os.link(taken, box)
            except OSError as exc:  # reported without the safety net rather than not at all
                log.warning("no outbox entry for the acceptance of %s: %s", envelope.id, exc)
                box = ""
            if box:
                self.report_from_outbox(box, envelope, Outcome.ACCEPTED, subscriber, deadline)
            else:
                self.reporter.report(envelope, Outcome.ACCEPTED, subscriber, deadline)
        return taken, deadline
