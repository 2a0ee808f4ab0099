"""`PubSub`: publish to channels, subscribe with filters, over one dirmq root, from any process.

Publishing writes the message once (`messages/<id>`, exclusively: a duplicate id is refused),
then routes it with one hard link: `anyone` into the shared pool, `everyone` into the broadcast
log, `future` into the retained log. Subscriptions take pool entries into their `taken/`
directory by rename, and read the logs from their own positions (see `subscription.py`); every
transition of a file is one rename (see `transitions.py`). A restarted process, or any other
one, finishes what a dead one left half done (`sweep`).

Why it is long: publishing, routing and the sweep's recovery steps act on the same directories and
must agree with one another; what can live apart already does (`subscription.py`, `transitions.py`,
`outcomes.py`, `seqlogs.py`, `presence.py`, the broadcast log's pruning in `pruning.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dirmq.errors import (
    CorruptMessage,
    DuplicateMessage,
    InvalidArgument,
    QueueNotFound,
    StorageError,
    SubscriptionBusy,
    storage_error,
)
from dirmq.pubsub.feed import load_state, saved_position
from dirmq.pubsub.layout import (
    PubSubPaths,
    listed,
    split_entry,
    split_outbox,
    split_timed,
    timed_name,
)
from dirmq.pubsub.model import (
    DEFAULT_ACCEPT_TIMEOUT_S,
    DEFAULT_PROCESS_TIMEOUT_S,
    Envelope,
    Filter,
    Mode,
    Outcome,
    Persistence,
    Published,
    check_name,
    make_envelope,
)
from dirmq.pubsub.outcomes import OutcomeReporter
from dirmq.pubsub.policy import (
    DEFAULT_BACKOFF_MAX_S,
    DEFAULT_BACKOFF_S,
    DEFAULT_MAX_DELIVERIES,
    DeliveryPolicy,
    read_policy,
)
from dirmq.pubsub.presence import PresenceIndex, read_subscription
from dirmq.pubsub.pruning import BroadcastPruner
from dirmq.pubsub.seqlogs import SeqLog, is_tombstone
from dirmq.pubsub.subscription import Subscription
from dirmq.pubsub.transitions import Transitions, read_entry
from dirmq.store import smallfiles
from dirmq.store.clock import now_ms
from dirmq.store.codec import check_headers, encode
from dirmq.store.fsio import create_pending
from dirmq.store.ids import new_id
from dirmq.store.names import validate_queue_name
from dirmq.store.root import Store

log = logging.getLogger("dirmq.pubsub")

RECOVER_AFTER_S = 10.0  # a half-published message this old belongs to a dead publisher
OUTBOX_GRACE_S = 5.0  # an unreported outcome this old was left by a crash or a failed report
MESSAGES_SWEEP_EVERY_S = 10.0
PRUNE_GRACE_MS = 5000  # broadcast entries outlive their accept deadline by this much
SWEPT_STAMP = "swept"  # its mtime: when some process last swept
_STAMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC


@dataclass(slots=True)
class SweepReport:
    timed_out: int = 0  # `anyone` messages nobody accepted in time
    aborted: int = 0  # deliveries past their deadline, given back
    dismissed: int = 0  # ... after their last delivery allowed: dismissed (or dead-lettered)
    reported: int = 0  # outcomes a crash or a failed report left in outbox/
    recovered: int = 0  # half-finished publishes
    removed: int = 0  # pruned broadcast entries, finished messages past the dedup window
    detached: int = 0  # presence of sessions that died


class PubSub:
    """Publish/subscribe over the store rooted at `store.root`. Thread-safe."""

    def __init__(
        self,
        store: Store,
        *,
        presence_timeout_s: float = 10.0,
        sweep_interval_s: float = 1.0,
        dedup_window_s: float = 3600.0,
    ) -> None:
        self.store = store
        self.paths = PubSubPaths.under(store.root)
        try:
            for directory in self.paths.shared_dirs():
                store.access.makedirs(directory)
        except OSError as exc:
            raise storage_error(exc, "creating the pub/sub directories") from exc
        self.retained = SeqLog(self.paths.retained, prunable=False, access=store.access)
        self.broadcast = SeqLog(self.paths.broadcast, prunable=True, access=store.access)
        self.reporter = OutcomeReporter(store)
        self.transitions = Transitions(self.paths, self.reporter, store)
        self.presence = PresenceIndex(self.paths, presence_timeout_s)
        self.pruner = BroadcastPruner(self.paths, self.broadcast, self.transitions)
        self.sweep_interval_s = sweep_interval_s
        self.dedup_window_s = dedup_window_s
        self.recover_after_s = RECOVER_AFTER_S
        self.outbox_grace_s = OUTBOX_GRACE_S
        self.prune_grace_ms = PRUNE_GRACE_MS
        self._sweep_lock = threading.Lock()
        self._next_sweep = 0.0
        self._next_messages_sweep = 0.0

    # -- publishing ------------------------------------------------------------------------------
    def publish(
        self,
        channel: str,
        body: bytes,
        *,
        subject: str = "",
        mode: Mode | str = Mode.ANYONE,
        headers: Mapping[str, str] | None = None,
        message_id: str | None = None,
        acks: Iterable[str] | str = (),
        reply_to: str | None = None,
        accept_timeout_s: float = DEFAULT_ACCEPT_TIMEOUT_S,
        process_timeout_s: float = DEFAULT_PROCESS_TIMEOUT_S,
        persistence: Persistence | str = Persistence.WRITETHROUGH,
    ) -> Published:
        """Publish `body` to `channel`; returns once stored at `persistence`.

        `acks` are the outcomes to report into the queue `reply_to` (created if absent).
        Raises DuplicateMessage for an id already published (within the dedup window once
        finished), InvalidArgument for bad input, StorageError if it cannot be stored (then
        nothing of it is visible)."""
        if not isinstance(body, bytes | bytearray | memoryview):
            raise InvalidArgument("the body must be bytes")
        headers = dict(headers or {})
        check_headers(headers)
        if reply_to:
            validate_queue_name(reply_to)
        envelope = make_envelope(
            message_id=message_id or new_id(),
            channel=channel,
            subject=subject,
            mode=mode,
            published_us=time.time_ns() // 1000,
            accept_timeout_s=accept_timeout_s,
            process_timeout_s=process_timeout_s,
            persistence=persistence,
            acks=acks,
            reply_to=reply_to,
        )
        canonical = self._write_canonical(
            envelope, encode(bytes(body), headers, envelope.system_headers())
        )
        try:
            published, dirs = self._route(envelope, canonical)
            # The routed links are what must survive; `messages/` only serves dedup and
            # recovery, which a machine crash may cost (documented in docs/pubsub.md).
            self._flush(envelope.persistence, dirs)
        except OSError as exc:
            self._unpublish(envelope, canonical)
            raise storage_error(exc, f"publishing to channel {channel!r}") from exc
        self._mark_live(envelope, canonical)
        self.maybe_sweep()
        return published

    def _write_canonical(self, envelope: Envelope, data: bytes) -> str:
        canonical = self.paths.canonical(envelope.id)
        tmp_name = f"{envelope.id}.{uuid.uuid4().hex}.tmp"
        try:
            pending = create_pending(self.paths.tmp, tmp_name, canonical, data, self.store.access)
            try:
                if envelope.persistence is Persistence.WRITETHROUGH:
                    os.fsync(pending.fd)
                pending.publish()
            except FileExistsError:
                pending.discard()
                raise DuplicateMessage(
                    f"message id {envelope.id!r} was already published"
                ) from None
            except BaseException:
                pending.discard()
                raise
        except OSError as exc:
            raise storage_error(exc, "writing a pub/sub message") from exc
        # A finished message keeps its id (as .live, then .end) for the dedup window. Checked
        # after the exclusive link, in this order, so a concurrent rename cannot slip between.
        for state in ("live", "end"):
            if os.path.exists(self.paths.canonical(envelope.id, state)):
                os.unlink(canonical)
                raise DuplicateMessage(f"message id {envelope.id!r} was already published")
        return canonical

    def _route(self, envelope: Envelope, canonical: str) -> tuple[Published, set[str]]:
        if envelope.mode is Mode.ANYONE:
            name = timed_name(envelope.key, envelope.accept_deadline_ms)
            with contextlib.suppress(FileExistsError):  # recovery re-routing
                os.link(canonical, os.path.join(self.paths.anyone, name))
            return Published(envelope.id, envelope.mode), {self.paths.anyone}
        if envelope.mode is Mode.FUTURE:
            seq = self.retained.append(canonical)
            return Published(envelope.id, envelope.mode, seq=seq), {self.paths.retained}
        self.broadcast.append(canonical)
        published_ms = envelope.published_us // 1000
        attached = sum(
            1
            for sub in self.presence.attached()
            if sub.attached_ms <= published_ms
            and sub.filter.matches(envelope.channel, envelope.subject)
        )
        return Published(envelope.id, envelope.mode, subscribers=attached), {self.paths.broadcast}

    def _flush(self, persistence: Persistence, dirs: set[str]) -> None:
        if persistence is Persistence.WRITETHROUGH:
            # Shared with concurrent publishers of this process.
            self.store.group_commit._sync_dirs(dirs)
        elif persistence is Persistence.WRITEBACK:
            self.store.writeback.mark_dirty(0.5, time.monotonic())

    def _unpublish(self, envelope: Envelope, canonical: str) -> None:
        """Best effort after a failed publish: remove what was linked, so nothing is delivered
        that the publisher was told failed. A log entry cannot be withdrawn (a hole would stop
        its readers): a message whose flush failed after it entered a log may be delivered."""
        name = timed_name(envelope.key, envelope.accept_deadline_ms)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.paths.anyone, name))
        with contextlib.suppress(OSError):
            os.unlink(canonical)

    def _mark_live(self, envelope: Envelope, canonical: str) -> None:
        """Report `queued`, then mark the message routed. A crash before the rename leaves the
        bare name, which the sweeper finishes (routing is idempotent, reports are deduplicated)."""
        try:
            self.reporter.report(envelope, Outcome.QUEUED)
            os.rename(canonical, self.paths.canonical(envelope.id, "live"))
        except (StorageError, OSError) as exc:
            log.warning("queued outcome of %s deferred to the sweeper: %s", envelope.id, exc)
            return
        # A subscriber may have settled it already (its `finish` found no `.live` yet).
        self.transitions.finish(envelope.id)

    # -- subscriptions ---------------------------------------------------------------------------
    def subscribe(
        self,
        name: str | None = None,
        *,
        channels: Iterable[str] = (),
        subjects: Iterable[str] = (),
        replay_from: int | None = None,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        backoff_s: float = DEFAULT_BACKOFF_S,
        backoff_max_s: float = DEFAULT_BACKOFF_MAX_S,
        dead_letter: str | None = None,
    ) -> Subscription:
        """Attach subscription `name` (durable: its log positions survive detaching) or,
        without a name, an anonymous one that is removed when closed. SubscriptionBusy if
        `name` is attached elsewhere.

        What it gives back (aborts, passed deadlines) comes again after `backoff_s`, doubling
        with each delivery up to `backoff_max_s`; after `max_deliveries` (0: no limit) it is
        dismissed instead, or put in the queue `dead_letter` (which must exist: QueueNotFound)
        and dismissed. See policy.py."""
        if dead_letter is not None:
            validate_queue_name(dead_letter)
            if not self.store.exists(dead_letter):
                raise QueueNotFound(
                    f"dead-letter queue {dead_letter!r} does not exist; create it first "
                    f"(dirmq create {dead_letter})"
                )
        policy = DeliveryPolicy(max_deliveries, backoff_s, backoff_max_s, dead_letter or None)
        return Subscription(
            self,
            check_name("subscription name", name or f"anon-{uuid.uuid4().hex[:16]}"),
            Filter(tuple(channels), tuple(subjects)),
            replay_from=replay_from,
            durable=name is not None,
            policy=policy,
        )

    def subscriptions(self) -> list[dict[str, object]]:
        result: list[dict[str, object]] = []
        for name in sorted(listed(self.paths.subs)):
            found = read_subscription(self.paths, name)
            if found is None:
                continue
            state, _saved = load_state(self.paths.cursor(name))
            result.append(
                {
                    "name": name,
                    "filter": found[0].to_json(),
                    "attached": self.presence.is_fresh(name),
                    "retained_next": saved_position(state, "retained"),
                    "broadcast_next": saved_position(state, "broadcast"),
                    "taken": _count(self.paths.taken(name)),
                    "delivery": read_policy(self.paths.subscription_file(name)).to_json(),
                }
            )
        return result

    def delete_subscription(self, name: str) -> None:
        """Remove a detached subscription (`anyone` messages it held go back to the pool)."""
        check_name("subscription name", name)
        if self.presence.is_fresh(name):
            raise SubscriptionBusy(f"subscription {name!r} is attached; detach it first")
        taken = self.paths.taken(name)
        for entry in listed(taken):
            self.abort_entry(os.path.join(taken, entry), name, "its subscription was deleted")
        shutil.rmtree(self.paths.sub(name), ignore_errors=True)

    def stats(self) -> dict[str, int]:
        return {
            "anyone_waiting": _count(self.paths.anyone),
            "retained": self.retained.refresh_head(),
            "broadcast": self.broadcast.refresh_head(),
            "attached": len(self.presence.attached()),
            "subscriptions": _count(self.paths.subs),
            "unreported_outcomes": _count(self.paths.outbox),
        }

    # -- sweeping --------------------------------------------------------------------------------
    def maybe_sweep(self) -> SweepReport | None:
        """Sweep if no process has for `sweep_interval_s` (cheap to call often).

        `@pubsub/swept`'s mtime says when any process last swept, so 100 subscriber processes
        share one sweep a second instead of each listing every subscription (two racing
        processes may both sweep: harmless, every transition is decided by one rename)."""
        now = time.monotonic()
        if now < self._next_sweep or not self._sweep_lock.acquire(blocking=False):
            return None
        try:
            self._next_sweep = now + self.sweep_interval_s
            stamp = os.path.join(self.paths.base, SWEPT_STAMP)
            try:
                if time.time() - os.stat(stamp).st_mtime < self.sweep_interval_s:
                    return None
                os.utime(stamp)
            except FileNotFoundError:
                with contextlib.suppress(OSError):
                    os.close(self.store.access.open(stamp, _STAMP_FLAGS))
            return self._sweep_locked(now)
        finally:
            self._sweep_lock.release()

    def sweep(self) -> SweepReport:
        """Time out, abort, report and recover whatever is due, for every subscription."""
        with self._sweep_lock:
            return self._sweep_locked(time.monotonic(), messages=True)

    def _sweep_locked(self, now: float, *, messages: bool = False) -> SweepReport:
        report = SweepReport()
        at_ms = now_ms()
        for entry in listed(self.paths.anyone):
            timed = split_timed(entry)
            if timed is not None and 0 < timed[1] < at_ms:
                report.timed_out += self._expire(
                    os.path.join(self.paths.anyone, entry), "", Outcome.TIMEOUT
                )
        for name in listed(self.paths.subs):
            taken = self.paths.taken(name)
            for entry in listed(taken):
                timed = split_timed(entry)
                if timed is not None and timed[1] < at_ms:
                    why = "no result within its process timeout"
                    outcome = self.abort_entry(os.path.join(taken, entry), name, why)
                    report.aborted += outcome is Outcome.ABORTED
                    report.dismissed += outcome is Outcome.DISMISSED
        wall = time.time()
        for entry in listed(self.paths.present):
            if not self.presence.is_fresh(entry):
                # Its session died: it no longer gets `everyone` messages. Not a plain unlink:
                # a fresh session may replace the stale file meanwhile.
                report.detached += self.presence.remove_stale(entry)
                self.presence.invalidate()
        report.removed += self.pruner.prune(at_ms, self.prune_grace_ms)
        report.reported += self._replay_outbox(wall)
        if messages or now >= self._next_messages_sweep:
            self._next_messages_sweep = now + MESSAGES_SWEEP_EVERY_S
            self._sweep_messages(wall, report)
            self._remove_stale_temps()
        moved = {k: v for k, v in dataclasses.asdict(report).items() if v}
        if moved:
            log.info("pub/sub swept", extra={"fields": moved})
        return report

    def _remove_stale_temps(self) -> None:
        """What crashed writes of the small files left: cursors, records, the broadcast floor."""
        smallfiles.remove_stale_temps(self.paths.base)
        for name in listed(self.paths.subs):
            smallfiles.remove_stale_temps(self.paths.sub(name))

    def _expire(self, path: str, subscriber: str, outcome: Outcome) -> int:
        envelope = _envelope_or_discard(path)
        if envelope is None:
            return 0
        timed = split_timed(os.path.basename(path))
        key = timed[0] if timed else os.path.basename(path)
        return int(self.transitions.settle(path, key, envelope, subscriber, outcome))

    def abort_entry(self, path: str, subscriber: str, why: str) -> Outcome | None:
        """Give back the taken `anyone` entry at `path` (`why` it failed) under the
        subscription's delivery policy: ABORTED, or DISMISSED after its last delivery allowed;
        None if it was settled meanwhile (or is not an entry)."""
        taken = split_entry(os.path.basename(path))
        if taken is None:
            return None
        envelope = _envelope_or_discard(path)
        if envelope is None:
            return None
        policy = read_policy(self.paths.subscription_file(subscriber))
        try:
            return self.transitions.give_back(path, taken, envelope, subscriber, policy, why)
        except (StorageError, OSError) as exc:  # a dead-letter queue full or gone: next sweep
            log.warning("delivery %s not given back yet: %s", os.path.basename(path), exc)
            return None

    def _replay_outbox(self, wall: float) -> int:
        reported = 0
        for name in listed(self.paths.outbox):
            parsed = split_outbox(name)
            path = os.path.join(self.paths.outbox, name)
            try:
                if parsed is None or wall - os.stat(path).st_ctime < self.outbox_grace_s:
                    continue
                entry = read_entry(path)
            except FileNotFoundError:
                continue
            except CorruptMessage:
                if is_tombstone(path):  # linked from a buried log entry: no envelope to report
                    log.warning("outcome %s lost: its log entry was buried meanwhile", name)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                continue
            _key, subscriber, outcome, attempt = parsed
            try:
                what = Outcome(outcome)
            except ValueError:
                continue
            reported += self.transitions.report_from_outbox(
                path, entry.envelope, what, subscriber, attempt
            )
        return reported

    def _sweep_messages(self, wall: float, report: SweepReport) -> None:
        for name in listed(self.paths.messages):
            path = os.path.join(self.paths.messages, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            age = wall - st.st_ctime
            if name.endswith(".end") and age > self.dedup_window_s:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    report.removed += 1
            elif name.endswith((".live", ".end")):
                # No pool, taken or log entry left: finished, emptied.
                self.transitions.finish_listed(path, st)
            elif "." not in name and age > self.recover_after_s:
                report.recovered += self._recover(path)

    def _recover(self, canonical: str) -> int:
        """Finish the publish of a message whose publisher died after writing it."""
        try:
            entry = read_entry(canonical)
            routed = os.stat(canonical).st_nlink > 1
        except FileNotFoundError:
            return 0
        except CorruptMessage as exc:
            log.error("removing damaged pub/sub message %s: %s", canonical, exc)
            os.unlink(canonical)
            return 0
        envelope = entry.envelope
        if not routed:
            try:
                self._route(envelope, canonical)
            except OSError as exc:
                log.warning("could not recover %s yet: %s", envelope.id, exc)
                return 0
        self._mark_live(envelope, canonical)
        return 1

    def close(self) -> None:
        """Nothing to release (subscriptions are closed by their owners); for symmetry."""


def _envelope_or_discard(path: str) -> Envelope | None:
    """The envelope of the entry at `path`; None if it is gone, or damaged (then removed)."""
    try:
        return read_entry(path).envelope
    except FileNotFoundError:
        return None
    except CorruptMessage as exc:
        log.error("removing damaged pub/sub entry %s: %s", path, exc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return None


def _count(path: str) -> int:
    return len(listed(path))
