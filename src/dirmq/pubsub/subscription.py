"""A subscription attached in this process: takes matching messages and settles them.

Three sources feed it, oldest publish time first: its inbox (`everyone` copies and deliveries
returned to it), the shared `anyone` pool (first subscription to rename an entry into its
`taken/` wins) and the retained log, read from its cursor. Each process keeps an index of the
pool and inbox fed by inotify (or polling), so taking a message never lists a directory.

A taken message must be settled (`done`, `dismiss`), kept alive (`heartbeat`) or given back
(`abort`) before its deadline; otherwise it is aborted: an `anyone` message returns to the pool
for any subscriber, others return to this subscription's inbox. Closing the subscription gives
back everything it holds. The retained cursor is saved at most every `CURSOR_SAVE_S` and on
close, so after a crash a few retained messages may be delivered again (at-least-once).
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
from typing import TYPE_CHECKING

from dirmq.errors import (
    CorruptMessage,
    DeliveryNotFound,
    InvalidArgument,
    StorageError,
    SubscriptionBusy,
    storage_error,
)
from dirmq.pubsub.layout import key_seq, retained_key, split_timed
from dirmq.pubsub.model import Delivery, Envelope, Filter, Outcome, check_timeout
from dirmq.pubsub.presence import new_session
from dirmq.pubsub.transitions import Entry, now_ms, read_entry
from dirmq.store.watch import RESCAN, PollingWatcher, Watcher, open_watcher

if TYPE_CHECKING:
    from dirmq.pubsub.hub import PubSub

log = logging.getLogger("dirmq.pubsub")

CURSOR_SAVE_S = 0.5
_OUT_OF_INOTIFY = {errno.EMFILE, errno.ENOSPC}


class Subscription:
    def __init__(
        self,
        hub: PubSub,
        name: str,
        filter: Filter,
        *,
        replay_from: int | None = None,
        durable: bool = True,
    ) -> None:
        self.hub = hub
        self.name = name
        self.filter = filter
        self.durable = durable  # False: removed (inbox and all) when closed
        self._paths = hub.paths
        self._lock = threading.RLock()
        self._closed = False
        self._taken: dict[str, tuple[str, Envelope, int]] = {}  # key -> (path, envelope, deadline)
        self._inbox: list[str] = []  # heap of names; `_inbox_names` says which still exist
        self._inbox_names: set[str] = set()
        self._pool: list[str] = []  # heap of matching pool names
        self._pool_envelopes: dict[str, Envelope] = {}  # matching pool names that exist
        self._pool_unread: set[str] = set()  # pool names not examined yet
        self._pool_skipped: set[str] = set()  # examined, not for us
        self._retained_next: tuple[int, Entry] | None = None
        self._skip_retained: set[str] = set()
        self._session = new_session()
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
                    "inbox": self._paths.inbox(name),
                    "retained": self._paths.retained,
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
        os.makedirs(paths.inbox(self.name), exist_ok=True)
        os.makedirs(paths.taken(self.name), exist_ok=True)
        present = os.path.join(paths.present, self.name)
        if self.hub.presence.is_fresh(self.name):
            raise SubscriptionBusy(f"subscription {self.name!r} is attached elsewhere")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(present)  # a dead session's
        record = {
            "filter": self.filter.to_json(),
            "attached_ms": now_ms(),
            "session": self._session,
        }
        _replace(paths.subscription_file(self.name), json.dumps(record).encode())
        try:
            fd = os.open(present, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            raise SubscriptionBusy(f"subscription {self.name!r} is attached elsewhere") from None
        os.write(fd, self._session.encode())
        os.close(fd)
        self.hub.presence.invalidate()
        self._cursor = replay_from if replay_from is not None else self._saved_cursor()
        self._cursor_saved = -1
        # Deliveries a previous session of this subscription held go back (aborted).
        taken = paths.taken(self.name)
        for entry in os.listdir(taken):
            timed = split_timed(entry)
            if timed is not None:
                self.hub.abort_entry(os.path.join(taken, entry), self.name, timed)
        # Retained messages already waiting in the inbox must not come again from the log.
        for entry in os.listdir(paths.inbox(self.name)):
            timed = split_timed(entry)
            if timed is not None and key_seq(timed[0]) is not None:
                self._skip_retained.add(timed[0])

    def _saved_cursor(self) -> int:
        try:
            with open(self._paths.cursor(self.name), "rb") as f:
                return max(1, int(f.read().strip() or b"1"))
        except (FileNotFoundError, ValueError):
            return 1

    def _save_cursor(self) -> None:
        with self._lock:
            cursor = self._cursor
        if cursor != self._cursor_saved:
            _replace(self._paths.cursor(self.name), str(cursor).encode())
            self._cursor_saved = cursor

    def _keep_alive(self) -> None:
        present = os.path.join(self._paths.present, self.name)
        interval = min(self.hub.presence.timeout_s / 3, CURSOR_SAVE_S)
        while not self._stop.wait(interval):
            try:
                os.utime(present)
            except FileNotFoundError:  # a sweeper took us for dead (we were frozen): come back
                with contextlib.suppress(OSError):
                    with open(present, "x") as f:
                        f.write(self._session)
                    self.hub.presence.invalidate()
            except OSError as exc:
                log.warning("subscription %s heartbeat failed: %s", self.name, exc)
            try:
                self._save_cursor()
            except OSError as exc:
                log.warning("subscription %s cursor not saved: %s", self.name, exc)

    # -- indexing --------------------------------------------------------------------------------
    def _rescan(self) -> None:
        self._inbox_names = set(_listdir(self._paths.inbox(self.name)))
        self._inbox = list(self._inbox_names)
        heapq.heapify(self._inbox)
        names = set(_listdir(self._paths.anyone))
        self._pool_envelopes = {n: e for n, e in self._pool_envelopes.items() if n in names}
        self._pool = list(self._pool_envelopes)
        heapq.heapify(self._pool)
        self._pool_skipped &= names
        self._pool_unread = names - self._pool_skipped - set(self._pool_envelopes)

    def _absorb_events(self) -> None:
        events = self._watcher.drain()
        if events == RESCAN:
            self._rescan()
            return
        for event in events:
            if isinstance(event, str):
                continue
            if event.directory == "inbox":
                if event.added and event.name not in self._inbox_names:
                    self._inbox_names.add(event.name)
                    heapq.heappush(self._inbox, event.name)
                elif not event.added:
                    self._inbox_names.discard(event.name)
            elif event.directory == "anyone":
                if event.added:
                    self._pool_unread.add(event.name)
                else:
                    self._pool_unread.discard(event.name)
                    self._pool_skipped.discard(event.name)
                    self._pool_envelopes.pop(event.name, None)

    def _examine_pool(self) -> None:
        for name in self._pool_unread:
            try:
                entry = read_entry(os.path.join(self._paths.anyone, name))
            except FileNotFoundError:
                continue
            except CorruptMessage:
                self._pool_skipped.add(name)
                continue
            envelope = entry.envelope
            if self.filter.matches(envelope.channel, envelope.subject):
                self._pool_envelopes[name] = envelope
                heapq.heappush(self._pool, name)
            else:
                self._pool_skipped.add(name)
        self._pool_unread.clear()

    def _retained_head(self) -> tuple[int, Entry] | None:
        while self._retained_next is None:
            seq = self._cursor
            try:
                entry = read_entry(self.hub.retained.path(seq))
            except FileNotFoundError:
                return None
            except CorruptMessage as exc:
                log.error("skipping damaged retained message %d: %s", seq, exc)
                self._cursor += 1
                continue
            envelope = entry.envelope
            key = retained_key(envelope.key, seq)
            if key in self._skip_retained or not self.filter.matches(
                envelope.channel, envelope.subject
            ):
                self._cursor += 1
                continue
            self._retained_next = (seq, entry)
        return self._retained_next

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
            self._examine_pool()
            while self._inbox and self._inbox[0] not in self._inbox_names:
                heapq.heappop(self._inbox)
            while self._pool and self._pool[0] not in self._pool_envelopes:
                heapq.heappop(self._pool)
            retained = self._retained_head()
            choices: list[tuple[str, str]] = []
            if self._inbox:
                choices.append((self._inbox[0], "inbox"))
            if self._pool:
                choices.append((self._pool[0], "pool"))
            if retained is not None:
                seq, entry = retained
                choices.append((retained_key(entry.envelope.key, seq), "retained"))
            if not choices:
                return None
            name, source = min(choices)
            if source == "inbox":
                delivery = self._take_inbox(name)
            elif source == "pool":
                delivery = self._take_pool(name)
            else:
                delivery = self._take_retained()
            if delivery is not None:
                return delivery

    def _take_inbox(self, name: str) -> Delivery | None:
        heapq.heappop(self._inbox)
        self._inbox_names.discard(name)
        timed = split_timed(name)
        path = os.path.join(self._paths.inbox(self.name), name)
        if timed is None:
            return None
        key, accept_ms = timed
        try:
            entry = read_entry(path)
        except FileNotFoundError:
            return None
        except CorruptMessage as exc:
            log.error("removing damaged inbox entry %s: %s", path, exc)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None
        if 0 < accept_ms < now_ms():
            self.hub.transitions.settle(path, key, entry.envelope, self.name, Outcome.TIMEOUT)
            return None
        return self._accept(path, key, entry, link=False)

    def _take_pool(self, name: str) -> Delivery | None:
        heapq.heappop(self._pool)
        envelope = self._pool_envelopes.pop(name)
        timed = split_timed(name)
        path = os.path.join(self._paths.anyone, name)
        if timed is None:
            return None
        key, accept_ms = timed
        if 0 < accept_ms < now_ms():
            self.hub.transitions.settle(path, key, envelope, "", Outcome.TIMEOUT)
            return None
        taken = self.hub.transitions.accept(path, key, envelope, self.name, link=False)
        if taken is None:  # another subscriber was first
            return None
        try:
            entry = read_entry(taken[0])
        except (FileNotFoundError, CorruptMessage) as exc:
            log.error("taken pool entry %s unreadable: %s", taken[0], exc)
            return None
        return self._delivered(key, taken, entry, None)

    def _take_retained(self) -> Delivery | None:
        assert self._retained_next is not None
        seq, entry = self._retained_next
        self._retained_next = None
        self._cursor = seq + 1
        key = retained_key(entry.envelope.key, seq)
        return self._accept(self.hub.retained.path(seq), key, entry, link=True, seq=seq)

    def _accept(
        self, path: str, key: str, entry: Entry, *, link: bool, seq: int | None = None
    ) -> Delivery | None:
        taken = self.hub.transitions.accept(path, key, entry.envelope, self.name, link=link)
        if taken is None:
            return None
        return self._delivered(key, taken, entry, seq)

    def _delivered(
        self, key: str, taken: tuple[str, int], entry: Entry, seq: int | None
    ) -> Delivery:
        path, deadline = taken
        self._taken[key] = (path, entry.envelope, deadline)
        if seq is None:
            seq = key_seq(key)
        return Delivery(key, entry.envelope, entry.body, entry.headers, deadline, seq)

    def _abort_expired(self) -> list[str]:
        at_ms = now_ms()
        expired = []
        for key, (path, envelope, deadline) in list(self._taken.items()):
            if deadline < at_ms:
                del self._taken[key]
                self.hub.transitions.abort(path, key, envelope, self.name, deadline)
                expired.append(key)
        return expired

    def expire(self) -> list[str]:
        """Abort (return) held deliveries whose deadline passed, without taking anything; their
        keys. For event loops that wait on `fileno()` rather than in `receive`."""
        with self._lock:
            self._check_open()
            return self._abort_expired()

    def _next_deadline_s(self) -> float:
        if not self._taken:
            return 3600.0
        soonest = min(deadline for _p, _e, deadline in self._taken.values())
        return max(0.0, (soonest - now_ms()) / 1000 + 0.001)

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
            path, envelope, _deadline = self._held(key)
            del self._taken[key]
            if not self.hub.transitions.settle(path, key, envelope, self.name, outcome):
                raise DeliveryNotFound(
                    f"delivery {key} is no longer held (its deadline passed and it was returned)"
                )

    def heartbeat(self, delivery: Delivery | str, extend_s: float | None = None) -> int:
        """Still in progress: move the deadline to now + `extend_s` (default: the message's
        process timeout). Returns the new deadline (epoch ms)."""
        key = delivery if isinstance(delivery, str) else delivery.key
        with self._lock:
            path, envelope, _deadline = self._held(key)
            seconds = envelope.process_timeout_s if extend_s is None else extend_s
            deadline = now_ms() + int(check_timeout("extension", seconds) * 1000)
            new_path = os.path.join(os.path.dirname(path), f"{key}.{deadline}")
            try:
                os.rename(path, new_path)
            except FileNotFoundError:
                del self._taken[key]
                raise DeliveryNotFound(f"delivery {key} is no longer held") from None
            except OSError as exc:
                raise storage_error(exc, "extending a delivery") from exc
            self._taken[key] = (new_path, envelope, deadline)
            if not isinstance(delivery, str):
                delivery.deadline_ms = deadline
            return deadline

    def abort(self, delivery: Delivery | str) -> None:
        """Give the message back now (reported as `aborted`)."""
        key = delivery if isinstance(delivery, str) else delivery.key
        with self._lock:
            path, envelope, deadline = self._held(key)
            del self._taken[key]
            self.hub.transitions.abort(path, key, envelope, self.name, deadline)

    def _held(self, key: str) -> tuple[str, Envelope, int]:
        self._check_open()
        found = self._taken.get(key)
        if found is None:
            raise DeliveryNotFound(f"delivery {key} is not held by subscription {self.name!r}")
        return found

    def held(self) -> list[str]:
        with self._lock:
            return list(self._taken)

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def cursor(self) -> int:
        """The next retained sequence number this subscription will look at."""
        return self._cursor

    def fileno(self) -> int | None:
        """Readable when something may have arrived (for event loops); None when polling."""
        return self._watcher.fileno()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument(f"subscription {self.name!r} is closed")

    def close(self) -> None:
        """Detach: give back every held delivery, save the cursor, stop being `attached`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for key, (path, envelope, deadline) in list(self._taken.items()):
                try:
                    self.hub.transitions.abort(path, key, envelope, self.name, deadline)
                except (StorageError, OSError) as exc:  # the sweeper returns it at its deadline
                    log.warning("delivery %s not returned at close: %s", key, exc)
            self._taken.clear()
        self._stop.set()
        self._keeper.join()
        with contextlib.suppress(OSError):
            self._save_cursor()
        self._detach()
        self._watcher.close()
        if not self.durable:
            self.hub.delete_subscription(self.name)

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


def _replace(path: str, data: bytes) -> None:
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []
