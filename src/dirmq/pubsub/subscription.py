"""A subscription attached in this process: takes matching messages and settles them.

Three sources feed it, oldest publish time first: the shared `anyone` pool (the first
subscription to rename an entry into its `taken/` wins) and two logs read from its own
positions: `broadcast/` (`everyone`) and `retained/` (`future`). Each process keeps an index of
the pool fed by inotify (or polling), so taking a message never lists a directory (poolindex.py).

A delivery from a log changes no file at all: what the subscription holds, and what it gave
back (aborted), lives in memory; its positions (next sequence number, and the held/returned ones
below it) are saved to `cursor` at most every `CURSOR_SAVE_S` and on close. That is what makes
fan-out to 100 subscribers cost one write. After a crash, the deliveries since the last save
come again (at-least-once).

A taken message must be settled (`done`, `dismiss`), kept alive (`heartbeat`) or given back
(`abort`) before its deadline; otherwise it is aborted: an `anyone` message returns to the pool
for any subscriber, a log delivery to this subscription. Closing gives back everything held.
What is given back comes again only after the backoff of the subscription's `DeliveryPolicy`,
and after its last delivery allowed it is dismissed (or dead-lettered) instead (policy.py).

Why it is long: the three feeds (pool, broadcast log, retained log), their saved positions and the
deliveries held from them are one state machine whose invariants span all three.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import json
import logging
import os
import threading
import time
import uuid
from typing import Any

from dirmq.errors import (
    CorruptMessage,
    DeliveryNotFound,
    InvalidArgument,
    StorageError,
    SubscriptionBusy,
    storage_error,
)
from dirmq.pubsub.feed import Feed, Held, load_state
from dirmq.pubsub.host import SubscriptionHost
from dirmq.pubsub.layout import (
    BROADCAST,
    RETAINED,
    EntryName,
    entry_name,
    log_key,
    split_entry,
    split_log_key,
)
from dirmq.pubsub.model import Delivery, Envelope, Filter, Outcome, check_timeout
from dirmq.pubsub.policy import DeliveryPolicy
from dirmq.pubsub.poolindex import PoolIndex
from dirmq.pubsub.presence import new_session
from dirmq.pubsub.transitions import Entry, read_entry
from dirmq.store import smallfiles
from dirmq.store.clock import due_after_ms, last_ms, last_ms_after, now_ms, now_ns
from dirmq.store.watch import RESCAN, PollingWatcher, Watcher, open_watcher

log = logging.getLogger("dirmq.pubsub")

CURSOR_SAVE_S = 0.5
# Attempts at linking a presence file, each after taking a stale one away: a second stale one
# can only be a session that attached and died meanwhile.
_CLAIM_TRIES = 3
_OUT_OF_INOTIFY = {errno.EMFILE, errno.ENOSPC}


class Subscription:
    def __init__(
        self,
        hub: SubscriptionHost,
        name: str,
        filter: Filter,
        *,
        replay_from: int | None = None,
        durable: bool = True,
        policy: DeliveryPolicy | None = None,
    ) -> None:
        self.hub = hub
        self.name = name
        self.filter = filter
        self.policy = policy or DeliveryPolicy()
        self.durable = durable  # False: removed when closed
        self._paths = hub.paths
        self._lock = threading.RLock()
        self._closed = False
        self._held: dict[str, Held] = {}
        self._pool = PoolIndex(self._paths.anyone, filter)
        self._session = new_session()
        self._saved_state: dict[str, Any] | None = None
        if replay_from is not None and replay_from < 1:
            raise InvalidArgument("replay_from is a retained sequence number, 1 or more")
        try:
            self._attach(replay_from)
        except OSError as exc:
            raise storage_error(exc, f"attaching subscription {name!r}") from exc
        self._watcher: Watcher
        try:
            self._watcher = open_watcher(
                {
                    "anyone": self._paths.anyone,
                    "retained": self._paths.retained,
                    "broadcast": self._paths.broadcast,
                },
                hub.store.watch_mode,
                hub.store.poll_interval_s,
                hub.store.inotify_hub,
            )
        except OSError as exc:
            if exc.errno not in _OUT_OF_INOTIFY:
                self._detach()  # do not keep the name busy
                raise storage_error(exc, f"watching for subscription {name!r}") from exc
            # The user's 128 inotify instances (or its watches) are used up: poll instead.
            log.warning("subscription %s polls (no inotify left: %s)", name, exc)
            self._watcher = PollingWatcher(hub.store.poll_interval_s)
        self._rescan()
        self._stop = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep_alive, name=f"dirmq-sub-{name}", daemon=True
        )
        self._keeper.start()

    # -- attaching -------------------------------------------------------------------------------
    def _attach(self, replay_from: int | None) -> None:
        paths = self._paths
        access = self.hub.store.access
        access.makedirs(paths.taken(self.name))
        self._claim_presence()
        record = {
            "filter": self.filter.to_json(),
            "attached_ms": now_ms(),
            "session": self._session,
            "delivery": self.policy.to_json(),
        }
        smallfiles.replace_file(
            paths.subscription_file(self.name),
            json.dumps(record).encode(),
            durable=False,
            access=access,
        )
        os.utime(paths.present)  # publishers re-read the list, with this filter
        self.hub.presence.invalidate()
        state, saved_us = load_state(paths.cursor(self.name))
        self._retained = Feed.from_saved(RETAINED, self.hub.retained, state.get("retained"), 1)
        if replay_from is not None:
            self._retained = Feed(RETAINED, self.hub.retained, replay_from)
        broadcast = self.hub.broadcast
        head = broadcast.scan()
        self._broadcast = Feed.from_saved(BROADCAST, broadcast, state.get("broadcast"), head + 1)
        if "broadcast" in state:
            self._broadcast.skip_through = head
            detached = state.get("detached_us")
            self._broadcast.away_since_us = detached if isinstance(detached, int) else saved_us
        self._save_state(detached_us=None)
        # Deliveries of `anyone` messages a previous session held go back to the pool.
        taken = paths.taken(self.name)
        for entry in os.listdir(taken):
            self.hub.abort_entry(os.path.join(taken, entry), self.name, "its session ended")

    def _claim_presence(self) -> None:
        """Create `present/<name>`, whole (linked from a written temp file, O_EXCL-like), or raise
        SubscriptionBusy. A stale one (a dead session's) is taken away first, safely when several
        processes attach at once: see `PresenceIndex.remove_stale`."""
        present = os.path.join(self._paths.present, self.name)
        written = os.path.join(self._paths.tmp, f"present.{uuid.uuid4().hex}")
        self.hub.store.access.write_new(written, self._session.encode())
        try:
            for _ in range(_CLAIM_TRIES):
                try:
                    os.link(written, present)
                    return
                except FileExistsError:
                    if not self.hub.presence.remove_stale(self.name):
                        break
            raise SubscriptionBusy(f"subscription {self.name!r} is attached elsewhere")
        finally:
            os.unlink(written)

    def _save_state(self, *, detached_us: int | None) -> None:
        with self._lock:
            state = {
                "retained": self._retained.state(),
                "broadcast": self._broadcast.state(),
                "detached_us": detached_us,
            }
        if state != self._saved_state:
            # Not flushed: after a machine crash an older cursor replays what followed it.
            smallfiles.replace_file(
                self._paths.cursor(self.name),
                json.dumps(state).encode(),
                durable=False,
                access=self.hub.store.access,
            )
            self._saved_state = state

    def _keep_alive(self) -> None:
        present = os.path.join(self._paths.present, self.name)
        interval = min(self.hub.presence.timeout_s / 3, CURSOR_SAVE_S)
        while not self._stop.wait(interval):
            try:
                os.utime(present)
            except FileNotFoundError:  # a sweeper took us for dead (we were frozen): come back
                with contextlib.suppress(OSError):
                    self.hub.store.access.write_new(present, self._session.encode())
                    self.hub.presence.invalidate()
            except OSError as exc:
                log.warning("subscription %s heartbeat failed: %s", self.name, exc)
            try:
                self._save_state(detached_us=None)
            except OSError as exc:
                log.warning("subscription %s positions not saved: %s", self.name, exc)
            # Sweeping here, not only from an idle `receive`, keeps timeouts and reports going
            # while this process is busy (a long handler, a message that fails over and over).
            try:
                self.hub.maybe_sweep()
            except Exception:  # a bad moment (disk full) must not stop the heartbeat
                log.exception("pub/sub sweep failed")

    # -- indexing --------------------------------------------------------------------------------
    def _rescan(self) -> None:
        self._pool.rescan()
        self._broadcast.maybe_pruned = True
        self._retained.dirty = self._broadcast.dirty = True

    def _absorb_events(self) -> None:
        events = self._watcher.drain()
        if events == RESCAN:
            self._rescan()
            return
        for event in events:
            if isinstance(event, str):
                continue
            if event.directory == "anyone":
                if event.added:
                    self._pool.added(event.name)
                else:
                    self._pool.removed(event.name)
            elif event.directory == "retained":
                self._retained.dirty = True
            elif event.directory == "broadcast":
                self._broadcast.dirty = True
                if not event.added:
                    self._broadcast.maybe_pruned = True

    def _release_due(self) -> None:
        at_ms = now_ms()
        for feed in (self._retained, self._broadcast):
            feed.release_due(at_ms)

    def _load_pending(self, feed: Feed) -> None:
        """Deliveries a past session held or gave back come first, once."""
        for seq in feed.pending_after_attach:
            try:
                entry = read_entry(feed.log.path(seq))
            except (FileNotFoundError, CorruptMessage):
                continue  # pruned (it timed out) or damaged
            if seq in feed.returned:
                continue
            deliveries = feed.deliveries.setdefault(seq, 1)
            if self.policy.exhausted(deliveries):
                # Held by the past session when it ended: that was its last delivery allowed.
                key = log_key(entry.envelope.key, feed.letter, seq)
                feed.held.add(seq)
                held = Held(0, entry.envelope, feed.log.path(seq), feed, seq, entry, deliveries)
                self._abort(key, held, "its session ended")
                continue
            feed.returned[seq] = (entry, self._retry_accept_ms(feed, entry.envelope))
            heapq.heappush(feed.retry, seq)
        feed.pending_after_attach = []

    def _feed_head(self, feed: Feed) -> tuple[str, int, Entry] | None:
        """The next delivery `feed` offers, without taking it."""
        if feed.pending_after_attach:
            self._load_pending(feed)
        return feed.head(lambda seq, envelope: self._wanted(feed, seq, envelope))

    def _wanted(self, feed: Feed, seq: int, envelope: Envelope) -> bool:
        if not self.filter.matches(envelope.channel, envelope.subject):
            return False
        if feed.away_since_us is not None and seq <= feed.skip_through:
            return envelope.published_us <= feed.away_since_us
        return True

    def _retry_accept_ms(self, feed: Feed, envelope: Envelope) -> int:
        if feed.letter == RETAINED:
            return 0  # retained messages never time out
        return last_ms_after(envelope.accept_timeout_s)

    # -- taking ----------------------------------------------------------------------------------
    def receive(self, wait_s: float = 0.0) -> Delivery | None:
        """The next message for this subscription, accepted (and `accepted` reported), or None
        after `wait_s` seconds without one."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._lock:
                self._check_open()
                self._absorb_events()
                self._abort_expired()
                delivery = self._take_next()
                wake_in = self._next_deadline_s()
            if delivery is not None:
                return delivery
            self.hub.maybe_sweep()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._watcher.wait(min(remaining, wake_in, self.hub.sweep_interval_s))

    def _take_next(self) -> Delivery | None:
        while True:
            self._release_due()
            choices: list[tuple[str, Feed | None]] = []
            pooled = self._pool.head()
            if pooled is not None:
                choices.append((pooled, None))
            for feed in (self._retained, self._broadcast):
                head = self._feed_head(feed)
                if head is not None:
                    choices.append((head[0], feed))
            if not choices:
                return None
            name, source = min(choices, key=lambda choice: choice[0])
            delivery = self._take_pool(name) if source is None else self._take_feed(source)
            if delivery is not None:
                return delivery

    def _take_pool(self, name: str) -> Delivery | None:
        envelope = self._pool.pop(name)
        pooled = split_entry(name)
        path = os.path.join(self._paths.anyone, name)
        if pooled is None:
            return None
        key, accept_ms = pooled.key, pooled.ms
        if 0 < accept_ms < now_ms():
            self.hub.transitions.settle(path, key, envelope, "", Outcome.TIMEOUT)
            return None
        taken = self.hub.transitions.accept(path, pooled, envelope, self.name)
        if taken is None:  # another subscriber was first
            return None
        taken_path, deadline, deliveries = taken
        try:
            entry = read_entry(taken_path)
        except (FileNotFoundError, CorruptMessage) as exc:
            log.error("taken pool entry %s unreadable: %s", taken_path, exc)
            return None
        self._held[key] = Held(deadline, envelope, taken_path, deliveries=deliveries)
        return Delivery(key, envelope, entry.body, entry.headers, deadline, None)

    def _take_feed(self, feed: Feed) -> Delivery | None:
        at_ns = now_ns()
        at_ms = at_ns // 1_000_000
        if feed.retry:
            seq = heapq.heappop(feed.retry)
            entry, accept_ms = feed.returned.pop(seq)
            deliveries = feed.deliveries.get(seq, 1) + 1
        else:
            assert feed.peeked is not None
            seq, entry = feed.peeked
            feed.peeked = None
            feed.next_seq = seq + 1
            accept_ms = entry.envelope.accept_deadline_ms if feed.letter == BROADCAST else 0
            deliveries = 1
        envelope = entry.envelope
        key = log_key(envelope.key, feed.letter, seq)
        path = feed.log.path(seq)
        transitions = self.hub.transitions
        if 0 < accept_ms < at_ms:
            feed.deliveries.pop(seq, None)
            transitions.report_linked(path, key, envelope, self.name, Outcome.TIMEOUT, 0)
            return None
        deadline = last_ms(at_ns, envelope.process_timeout_s)
        feed.held.add(seq)
        feed.deliveries[seq] = deliveries
        self._held[key] = Held(deadline, envelope, path, feed, seq, entry, deliveries)
        transitions.report_linked(path, key, envelope, self.name, Outcome.ACCEPTED, deadline)
        public_seq = seq if feed.letter == RETAINED else None
        return Delivery(key, envelope, entry.body, entry.headers, deadline, public_seq)

    def _abort(self, key: str, held: Held, why: str) -> Outcome | None:
        """Give a held delivery back (`why` it failed): ABORTED, due again after the policy's
        backoff, or DISMISSED (dead-lettered first if the policy says where) after its last
        delivery allowed; None if it was no longer ours. The caller removed it from `_held`."""
        feed = held.feed
        transitions = self.hub.transitions
        if feed is None:
            taken = EntryName(key, held.deadline, held.deliveries)
            return transitions.give_back(
                held.path, taken, held.envelope, self.name, self.policy, why
            )
        feed.held.discard(held.seq)
        assert held.entry is not None
        if self.policy.exhausted(held.deliveries) and transitions.give_up_linked(
            held.path, key, held.entry, self.name, self.policy, held.deliveries, why
        ):
            feed.deliveries.pop(held.seq, None)
            return Outcome.DISMISSED
        backoff_ms = self.policy.backoff_ms(held.deliveries)
        accept_ms = self._retry_accept_ms(feed, held.envelope)
        due = due_after_ms(backoff_ms / 1000) if backoff_ms > 0 else 0
        feed.give_back(held.seq, held.entry, accept_ms + backoff_ms if accept_ms else 0, due)
        transitions.report_linked(
            held.path, key, held.envelope, self.name, Outcome.ABORTED, held.deadline
        )
        return Outcome.ABORTED

    def _abort_expired(self) -> dict[str, Outcome]:
        at_ms = now_ms()
        expired = [key for key, held in self._held.items() if held.deadline < at_ms]
        results: dict[str, Outcome] = {}
        for key in expired:
            held = self._held.pop(key)
            why = f"no result within its process timeout ({held.envelope.process_timeout_s:g}s)"
            outcome = self._abort(key, held, why)
            if outcome is not None:
                results[key] = outcome
        return results

    def expire(self) -> dict[str, Outcome]:
        """Abort (return) held deliveries whose deadline passed, without taking anything: their
        keys, each with what became of it (ABORTED, or DISMISSED after its last delivery
        allowed). For event loops that wait on `fileno()` rather than in `receive`."""
        with self._lock:
            self._check_open()
            return self._abort_expired()

    def _next_deadline_s(self) -> float:
        """Seconds until something held expires or something given back is due again."""
        times = [held.deadline for held in self._held.values()]
        pool_due = self._pool.next_due_ms()
        if pool_due is not None:
            times.append(pool_due)
        times += [feed.waiting[0][0] for feed in (self._retained, self._broadcast) if feed.waiting]
        if not times:
            return 3600.0
        return max(0.0, (min(times) - now_ms()) / 1000 + 0.001)

    def wake_in_s(self) -> float:
        """Seconds until `receive` or `expire` may have something to do without any new
        message: a deadline passes, or a backoff ends (for event loops)."""
        with self._lock:
            return self._next_deadline_s()

    # -- settling --------------------------------------------------------------------------------
    def done(self, delivery: Delivery | str) -> None:
        """The message was processed: removed, `done` reported."""
        self._settle(delivery, Outcome.DONE)

    def dismiss(self, delivery: Delivery | str) -> None:
        """The message cannot be processed: removed, `dismissed` reported."""
        self._settle(delivery, Outcome.DISMISSED)

    def _settle(self, delivery: Delivery | str, outcome: Outcome) -> None:
        key = delivery if isinstance(delivery, str) else delivery.key
        with self._lock:
            held = self._take_held(key)
            if held.feed is not None:
                held.feed.held.discard(held.seq)
                held.feed.deliveries.pop(held.seq, None)
                self.hub.transitions.report_linked(
                    held.path, key, held.envelope, self.name, outcome, 0
                )
            elif not self.hub.transitions.settle(held.path, key, held.envelope, self.name, outcome):
                raise DeliveryNotFound(
                    f"delivery {key} is no longer held (its deadline passed and it was returned)"
                )

    def heartbeat(self, delivery: Delivery | str, extend_s: float | None = None) -> int:
        """Still in progress: move the deadline to now + `extend_s` (default: the message's
        process timeout). Returns the new deadline (epoch ms)."""
        key = delivery if isinstance(delivery, str) else delivery.key
        with self._lock:
            held = self._find_held(key)
            seconds = held.envelope.process_timeout_s if extend_s is None else extend_s
            deadline = last_ms_after(check_timeout("extension", seconds))
            if held.feed is None:  # the deadline is in the taken/ entry's name
                new_name = entry_name(key, deadline, held.deliveries)
                new_path = os.path.join(os.path.dirname(held.path), new_name)
                try:
                    os.rename(held.path, new_path)
                except FileNotFoundError:
                    del self._held[key]
                    raise DeliveryNotFound(f"delivery {key} is no longer held") from None
                except OSError as exc:
                    raise storage_error(exc, "extending a delivery") from exc
                held.path = new_path
            held.deadline = deadline
            if not isinstance(delivery, str):
                delivery.deadline_ms = deadline
            return deadline

    def abort(self, delivery: Delivery | str, reason: str = "aborted by the subscriber") -> Outcome:
        """Give the message back (reported as `aborted`), to come again after the policy's
        backoff; after its last delivery allowed it is dismissed instead (dead-lettered first
        if the policy names a queue, `reason` its detail). Returns ABORTED or DISMISSED."""
        key = delivery if isinstance(delivery, str) else delivery.key
        with self._lock:
            outcome = self._abort(key, self._take_held(key), reason)
        if outcome is None:
            raise DeliveryNotFound(
                f"delivery {key} is no longer held (its deadline passed and it was returned)"
            )
        return outcome

    def _find_held(self, key: str) -> Held:
        self._check_open()
        held = self._held.get(key)
        if held is None:
            if split_log_key(key) is None and "_" not in key:
                raise DeliveryNotFound(f"{key!r} is not a delivery key")
            raise DeliveryNotFound(f"delivery {key} is not held by subscription {self.name!r}")
        return held

    def _take_held(self, key: str) -> Held:
        held = self._find_held(key)
        del self._held[key]
        return held

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def cursor(self) -> int:
        """The next retained sequence number this subscription will look at."""
        return self._retained.next_seq

    def fileno(self) -> int | None:
        """Readable when something may have arrived (for event loops); None when polling."""
        return self._watcher.fileno()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"subscription {self.name!r} is closed")

    def close(self) -> None:
        """Detach: give back every held delivery, save the positions, stop being attached."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for key in list(self._held):
                try:
                    self._abort(key, self._held.pop(key), "its subscription was closed")
                except (StorageError, OSError) as exc:  # the sweeper returns it at its deadline
                    log.warning("delivery %s not returned at close: %s", key, exc)
        self._stop.set()
        self._keeper.join()
        with contextlib.suppress(OSError):
            self._save_state(detached_us=time.time_ns() // 1000)
        self._detach()
        self._watcher.close()
        if not self.durable:
            self._report_never_taken(self._broadcast)
            self.hub.delete_subscription(self.name)

    def _report_never_taken(self, feed: Feed) -> None:
        """An anonymous subscription goes for good: the `everyone` messages it was attached for
        and never took time out (reported), rather than vanish."""
        for seq, (entry, _accept) in feed.returned.items():
            key = log_key(entry.envelope.key, feed.letter, seq)
            self.hub.transitions.report_linked(
                feed.log.path(seq), key, entry.envelope, self.name, Outcome.TIMEOUT, 0
            )
        head = feed.log.refresh_head()
        while (found := self._feed_head_unreturned(feed)) is not None and found[1] <= head:
            key, seq, entry = found
            feed.peeked = None
            feed.next_seq = seq + 1
            self.hub.transitions.report_linked(
                feed.log.path(seq), key, entry.envelope, self.name, Outcome.TIMEOUT, 0
            )

    def _feed_head_unreturned(self, feed: Feed) -> tuple[str, int, Entry] | None:
        feed.retry.clear()
        feed.waiting.clear()
        feed.pending_after_attach = []
        feed.dirty = True
        return self._feed_head(feed)

    def _detach(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._paths.present, self.name))
        self.hub.presence.invalidate()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Subscription({self.name!r}, {self.filter})"
