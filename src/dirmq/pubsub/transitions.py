"""State transitions of pub/sub entries, each decided by one rename (or exclusive link).

Whoever's rename succeeds owns the transition and reports its outcome; a loser gets ENOENT (or
EEXIST) and does nothing, so concurrent subscribers, sweepers and processes never report twice.
When the publisher asked for the outcome, the decision goes through `outbox/` first:

    settle (done, dismissed, timeout):  rename entry -> outbox;  report;  unlink outbox
    abort  (`anyone`, back to the pool): link entry -> outbox;  rename entry -> pool;
                                        report;  unlink outbox
           (its name now counts the deliveries so far and, after a backoff, when it is due)
    give up (the last delivery allowed):  [put a copy in the dead-letter queue;]  settle as
                                        dismissed
    accept (a subscriber takes it):     rename pool entry -> taken;  link taken -> outbox;
                                        report;  unlink outbox
    a delivery from a log (`everyone`, `future`) changes no file: its outcomes are reported
    with `report_linked` (link the log entry -> outbox; report; unlink outbox)
    finish (the last entry is gone):    rename messages/<id>.live -> .end;  truncate it

so a crash (or a failed report: disk full, reply queue deleted) leaves an outbox entry that the
sweeper reports later; reports carry a dedup id, so a report is never stored twice. A finished
message's file is emptied as it becomes `.end` (kept for the dedup window by its name alone):
the body of a message settled for good is not left readable. A settle finishes it at once when
it removed the last entry; the sweeper finishes the others (log entries pruned, reports that
failed, crashes in between).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass

from dirmq.errors import DirmqError
from dirmq.pubsub.layout import EntryName, PubSubPaths, entry_name, outbox_name
from dirmq.pubsub.model import Envelope, Outcome
from dirmq.pubsub.outcomes import OutcomeReporter
from dirmq.pubsub.policy import DeliveryPolicy
from dirmq.store.clock import due_ms, last_ms, last_ms_after, now_ns
from dirmq.store.codec import decode
from dirmq.store.events import REASON_MAX_RECEIVES
from dirmq.store.root import Store

log = logging.getLogger("dirmq.pubsub")

GIVE_UP_CLAIM_MS = 60_000
CHANNEL_SOURCE = "@channel/"  # a dead letter's source: where it was published (as permissions)


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


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class Transitions:
    def __init__(self, paths: PubSubPaths, reporter: OutcomeReporter, store: Store) -> None:
        self.paths = paths
        self.reporter = reporter
        self.store = store  # for dead-letter queues

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
            self.finish(envelope.id)
            return True
        box = self._outbox(key, subscriber, outcome, 0)
        try:
            os.rename(path, box)
        except FileNotFoundError:
            return False
        if self.report_from_outbox(box, envelope, outcome, subscriber, 0):
            self.finish(envelope.id)
        return True

    def finish(self, message_id: str) -> bool:
        """If the message's file has no name left but `messages/<id>.live` (its entries are all
        settled, pruned or reported), mark it finished and empty it; True if this call did.
        Once the link count is 1 nothing links the file again (links are made from the bare
        name, before it is `.live`, or from entries), so emptying it takes nothing from anyone.
        Never fails: what it cannot do now, the sweeper does (`finish_listed`)."""
        live = self.paths.canonical(message_id, "live")
        try:
            if os.stat(live).st_nlink != 1:
                return False
            end = self.paths.canonical(message_id, "end")
            os.rename(live, end)
            os.truncate(end, 0)
        except FileNotFoundError:
            return False  # finished by another process, or not routed yet
        except OSError as exc:
            log.warning("message %s not finished yet: %s", message_id, exc)
            return False
        return True

    def finish_listed(self, path: str, st: os.stat_result) -> None:
        """The sweeper's part of `finish`, for `messages/<name>` of stat `st`: a `.live` file
        with no other name is finished; an `.end` file that still holds data (a crash between
        the rename and the truncate, or one finished by an earlier version) is emptied."""
        if st.st_nlink != 1:
            return
        if path.endswith(".live"):
            self.finish(os.path.basename(path)[: -len(".live")])
        elif path.endswith(".end") and st.st_size:
            try:
                os.truncate(path, 0)
            except OSError:  # gone (the dedup window ended), or refused now: next sweep
                pass

    def abort(
        self,
        path: str,
        key: str,
        envelope: Envelope,
        subscriber: str,
        attempt: int,
        *,
        deliveries: int = 0,
        backoff_ms: int = 0,
    ) -> bool:
        """Return a taken `anyone` delivery to the pool (aborted), due again after `backoff_ms`
        and with a fresh accept window from then, its name counting `deliveries`; False if it
        was settled meanwhile."""
        at_ns, backoff_s = now_ns(), backoff_ms / 1000
        due = due_ms(at_ns, backoff_s) if backoff_ms > 0 else 0
        accept_ms = last_ms(at_ns, backoff_s + envelope.accept_timeout_s)
        target = os.path.join(self.paths.anyone, entry_name(key, accept_ms, deliveries, due))
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

    def give_back(
        self,
        path: str,
        taken: EntryName,
        envelope: Envelope,
        subscriber: str,
        policy: DeliveryPolicy,
        why: str,
    ) -> Outcome | None:
        """A taken `anyone` delivery failed (`why`): back to the pool after the policy's backoff
        (ABORTED), or, after its last delivery allowed, dead-lettered if the policy says where
        and dismissed (DISMISSED). None if it was settled or given back meanwhile."""
        deliveries = max(taken.deliveries, 1)  # a name of an earlier version counts none
        if policy.exhausted(deliveries):
            try:
                gone = self.give_up(path, taken.key, envelope, subscriber, policy, deliveries, why)
                return Outcome.DISMISSED if gone else None
            except (DirmqError, OSError) as exc:
                # The dead-letter queue was deleted, or is full: keep the message (given back,
                # tried again after its next failure) rather than lose it.
                log.warning("message %s not dead-lettered yet: %s", envelope.id, exc)
        backoff_ms = policy.backoff_ms(deliveries)
        if self.abort(
            path,
            taken.key,
            envelope,
            subscriber,
            taken.ms,
            deliveries=deliveries,
            backoff_ms=backoff_ms,
        ):
            return Outcome.ABORTED
        return None

    def give_up(
        self,
        path: str,
        key: str,
        envelope: Envelope,
        subscriber: str,
        policy: DeliveryPolicy,
        deliveries: int,
        why: str,
    ) -> bool:
        """Remove a taken `anyone` entry for good after its last delivery: a copy goes to the
        policy's dead-letter queue first (so a crash in between can dead-letter it twice, never
        lose it), then it is settled as dismissed. False if it was gone already; what the
        dead-letter queue raises, the entry left where it was."""
        detail = give_up_detail(envelope, subscriber, deliveries, why)
        if policy.dead_letter is not None:
            # First claimed, by a rename to a deadline a minute away: of a subscriber and a
            # sweeper giving it up at once only one puts a copy in the dead-letter queue, and
            # after a crash mid-way the sweeper does it again once that deadline passed.
            claim_ms = last_ms_after(GIVE_UP_CLAIM_MS / 1000)
            claimed = os.path.join(
                os.path.dirname(path), entry_name(key, claim_ms, max(deliveries, 1))
            )
            try:
                os.rename(path, claimed)
                entry = read_entry(claimed)
            except FileNotFoundError:
                return False
            try:
                self.dead_letter(policy.dead_letter, entry, subscriber, deliveries, detail)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.rename(claimed, path)
                raise
            path = claimed
        log.info(
            "pub/sub message given up",
            extra={"fields": {"id": envelope.id, "subscriber": subscriber, "detail": detail}},
        )
        return self.settle(path, key, envelope, subscriber, Outcome.DISMISSED)

    def give_up_linked(
        self,
        path: str,
        key: str,
        entry: Entry,
        subscriber: str,
        policy: DeliveryPolicy,
        deliveries: int,
        why: str,
    ) -> bool:
        """`give_up` for a log delivery (its log entry at `path`, no file of its own): put a
        copy in the policy's dead-letter queue, then report it dismissed. False if the
        dead-letter queue refused it: the caller gives it back instead, rather than lose it."""
        envelope = entry.envelope
        detail = give_up_detail(envelope, subscriber, deliveries, why)
        if policy.dead_letter is not None:
            try:
                self.dead_letter(policy.dead_letter, entry, subscriber, deliveries, detail)
            except (DirmqError, OSError) as exc:
                log.warning("message %s not dead-lettered yet: %s", envelope.id, exc)
                return False
        log.info(
            "pub/sub message given up",
            extra={"fields": {"id": envelope.id, "subscriber": subscriber, "detail": detail}},
        )
        self.report_linked(path, key, envelope, subscriber, Outcome.DISMISSED, 0)
        return True

    def dead_letter(
        self, queue: str, entry: Entry, subscriber: str, deliveries: int, detail: str
    ) -> str:
        """Put a message given up on into the dead-letter queue `queue`, body and headers, with
        its provenance: reason `max-receives`, source `@channel/<channel>`, the deliveries, and
        `detail`. Returns its id there. Raises what the store raises (QueueNotFound for a queue
        deleted since the subscription attached, StorageError); then nothing was settled."""
        return self.store.queue(queue).put_dead_letter(
            entry.body,
            entry.headers,
            reason=REASON_MAX_RECEIVES,
            source=CHANNEL_SOURCE + entry.envelope.channel,
            receive_count=deliveries,
            detail=detail,
        )

    def report_linked(
        self,
        path: str,
        key: str,
        envelope: Envelope,
        subscriber: str,
        outcome: Outcome,
        attempt: int,
    ) -> None:
        """Report the outcome of a delivery that has no file of its own (from a log), through an
        outbox link to the log entry `path`; straight away if the entry is gone (pruned)."""
        if not envelope.wants(outcome):
            return
        box = self._outbox(key, subscriber, outcome, attempt)
        try:
            os.link(path, box)
        except FileExistsError:  # reported already, or being reported
            return
        except FileNotFoundError:
            try:
                self.reporter.report(envelope, outcome, subscriber, attempt)
            except (DirmqError, OSError) as exc:
                log.error("outcome %s of %s lost: %s", outcome, envelope.id, exc)
            return
        self.report_from_outbox(box, envelope, outcome, subscriber, attempt)

    def accept(
        self, source: str, pooled: EntryName, envelope: Envelope, subscriber: str
    ) -> tuple[str, int, int] | None:
        """Take pool entry `source` (named `pooled`) into the subscriber's `taken/`; returns
        (path, deadline ms, deliveries so far with this one), or None if another subscriber
        took it first."""
        deadline = last_ms_after(envelope.process_timeout_s)
        deliveries = pooled.deliveries + 1
        taken = os.path.join(
            self.paths.taken(subscriber), entry_name(pooled.key, deadline, deliveries)
        )
        try:
            os.rename(source, taken)
        except FileNotFoundError:
            return None
        self.report_linked(taken, pooled.key, envelope, subscriber, Outcome.ACCEPTED, deadline)
        return taken, deadline, deliveries


def give_up_detail(envelope: Envelope, subscriber: str, deliveries: int, why: str) -> str:
    """What a dismissal by the delivery limit says (the dead letter's detail, the log line)."""
    times = "once" if deliveries == 1 else f"{deliveries} times"
    return (
        f"pub/sub message {envelope.id} delivered {times} to subscription {subscriber}, "
        f"the last: {why}"
    )
