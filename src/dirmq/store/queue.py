"""One queue: publish, lease, acknowledge, requeue, dead-letter, from any number of processes.

Theory of operation. A message is one immutable file; its state is the directory it sits in and
its name (see `layout`). Every transition is one `rename` (see `files.py`, and the table in
`states.py`), so whichever process performs it first wins and the others see ENOENT and move
on: no locks, which is what makes the queue safe on NFS too. Each process keeps an index of the
queue fed by watcher events (`view.py`), so a get is a heap pop plus one rename whatever the
backlog. Processes that wait (blocking `get`, a put at capacity) sleep on the watcher, so
another process's publish, ack or requeue wakes them at once, and they also wake when the
earliest lease or delay in the index falls due, and promote it themselves. Expired leases
return to `@ready` under their original id, i.e. their FIFO place.

`Queue` is the public face of one queue and holds the contracts; each operation lives in the
module of its concern: `publishing.py` (put, capacity tokens, dedup), `leasing.py` (get and
settling by receipt), `lookup.py` (by id), `maintenance.py` (stats, purge, sweep) and
`claims.py` (the planned claims of cooperating consumers). Each call here is one call there.

Why it is long: it is the whole public contract of a queue, one docstring per operation (what
is atomic, what is returned, what is raised); every body is one call into the module of its
concern.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from dirmq.errors import StorageError
from dirmq.store import claims, deadletters, leasing, lookup, maintenance
from dirmq.store import redrive as redriving
from dirmq.store.bounds import check_optional_seconds
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.context import QueueContext
from dirmq.store.deadletters import check_consumer_verdict
from dirmq.store.direct_lease import DirectLeases
from dirmq.store.events import REASON_REJECTED
from dirmq.store.files import QueueFiles
from dirmq.store.message import DeadLetter, Message, OutgoingMessage, QueueStats, SweepReport
from dirmq.store.publishing import Publisher
from dirmq.store.view import QueueView

ProgressFn = maintenance.ProgressFn


class Queue:
    """A queue directory opened by this process. Thread-safe; obtain it from `Store`."""

    def __init__(
        self,
        context: QueueContext,
        name: str,
        path: str,
        config: QueueConfig | None,
        config_stamp: tuple[int, int] | None = None,
        polled: bool | None = None,
    ) -> None:
        """`config_stamp`: the (inode, mtime) of the @queue.json `config` was read from, if
        known (`Store.queue`): not read again until it changes. `config` None: read at first
        use (`Store.queue(lazy=True)`; a stamp then is its file's at the open). `polled`:
        whether the queue is watched by polling, if the Store knows (else a statfs tells)."""
        self.name = name
        self.path = path
        self._files = QueueFiles(context, name, path)
        self._view = QueueView(context, name, path, self._files, config, config_stamp, polled)
        self._context = context

    # Made at first use, as QueueFiles' parts are: a queue only waited on needs neither.
    @functools.cached_property
    def _publisher(self) -> Publisher:
        return Publisher(self._view, self._context)

    @functools.cached_property
    def direct(self) -> DirectLeases:
        """Publishes straight into waiting consumers' leases (direct_lease.py)."""
        return DirectLeases(self._view, self._publisher, self._context)

    # -- configuration -------------------------------------------------------------------------
    @property
    def config(self) -> QueueConfig:
        """The current configuration (changes made by other processes show within 0.5 s)."""
        return self._view.config

    def reload_config(self) -> None:
        """Re-read @queue.json now if it changed (QueueNotFound if the queue is gone)."""
        self._view.reload_config()

    # -- publishing ------------------------------------------------------------------------------
    def put(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        delay_s: float | None = None,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
        dedup_id: str | None = None,
        ttl_s: float | None = None,
        priority: int = 0,
    ) -> str:
        """Publish one message and return its id.

        Returns only once the message is stored at the queue's durability level (`writethrough`:
        on stable storage). At capacity, blocks up to `timeout_s` (None: indefinitely) then
        raises `QueueFull`. Raises `StorageError` (nothing stored, nothing partial visible) if the
        filesystem fails. With `dedup_id`, a message already published with that id within the
        queue's `dedup_window_s` is not stored again and its id is returned. With `ttl_s`
        (default: the queue's `message_ttl_s`), a message not delivered within that many
        seconds of its publish is dead-lettered (reason `ttl-expired`) or dropped, as the
        queue's `ttl_action` says, and never delivered after it. `priority`: 0 to the queue's
        `priority_levels - 1`, the higher delivered first (InvalidArgument outside).
        """
        message = OutgoingMessage(
            body, headers or {}, delay_s, dedup_id, ttl_s=ttl_s, priority=priority
        )
        return self._publisher.put_many([message], timeout_s, durability)[0]

    def put_many(
        self,
        messages: Iterable[bytes | OutgoingMessage],
        *,
        timeout_s: float | None = None,
        durability: Durability | str | None = None,
    ) -> list[str]:
        """Publish several messages with one group commit; all are stored or none is. Returns
        their ids in order (for a deduplicated message, the original's id)."""
        return self._publisher.put_many(messages, timeout_s, durability)

    def validate(self, message: OutgoingMessage) -> None:
        """Raise what `put` would raise for this message's content (size, headers, delay), so a
        caller can refuse one bad message before batching it with good ones.

        A message that passes is not checked again by the next `put_many` that stores it, as
        long as the queue's configuration is unchanged (the server validates every message
        before it joins a batch). The message is frozen, and a `bytes` body immutable; headers
        must not be changed in between."""
        self._publisher.validate(message)

    # -- receiving --------------------------------------------------------------------------------
    def get(
        self,
        max_count: int = 1,
        *,
        visibility_s: float | None = None,
        wait_s: float = 0.0,
        max_per_group: int | None = 1,
        consumer: str | None = None,
    ) -> list[Message]:
        """Lease up to `max_count` messages, oldest first.

        Waits up to `wait_s` for the first message (returns [] if none came). Each message stays
        invisible to others for `visibility_s` (default: the queue's visibility timeout); ack it
        with its receipt before then, or it returns to its FIFO place.

        Messages of a group come in order, and only from a group none of whose messages is in
        flight. This get may take up to `max_per_group` consecutive messages of such a group
        (None: as many as it can, like SQS FIFO); the group then stays held back from every
        other get, in any process, until none of them is in flight (acked, returned, expired).
        Keep the default of 1 when the messages of one get are shared among several consumers.

        The leases name this process as their holder (docs/FORMAT.md, "Lease holders"), with
        `consumer` as its label when given (a principal, a worker's name): browse shows it.
        """
        return leasing.get(self._view, max_count, visibility_s, wait_s, max_per_group, consumer)

    def get_one(
        self,
        *,
        visibility_s: float | None = None,
        wait_s: float = 0.0,
        consumer: str | None = None,
    ) -> Message | None:
        got = leasing.get(self._view, 1, visibility_s, wait_s, 1, consumer)
        return got[0] if got else None

    def next_due_s(self) -> float | None:
        """Seconds until the earliest lease expires or delayed message falls due (as this process
        knows them), or None: when a waiter should look again even if nothing is published. A
        paused queue says soon (a resume makes no event), a rate-limited one the next second
        (flow.py)."""
        return leasing.next_due_s(self._view)

    # -- settling leases --------------------------------------------------------------------------
    def ack(self, receipt: str) -> None:
        """Delete the leased message behind `receipt`. StaleReceipt if that lease is gone."""
        leasing.settle(self._view, receipt, "ack")

    def nack(self, receipt: str, delay_s: float = 0.0) -> str:
        """Give the message back: ready again at once (in its FIFO place), or after `delay_s`.
        Past the queue's max receives it is dead-lettered instead (reason `max-receives`).
        Returns what became of it: "returned", "delayed" or "dead-lettered"."""
        check_optional_seconds("delay_s", delay_s)
        return leasing.settle(self._view, receipt, "nack", delay_s)

    def nack_each(
        self,
        receipts: Iterable[str],
        delay_s: float = 0.0,
        *,
        dead_lettered: list[str] | None = None,
    ) -> dict[str, Exception]:
        """Give several messages back (`nack` of each, one lock and one index sync per chunk);
        the failures by receipt, a `StorageError` among them too (see `ack_each`): a consumer
        stream that closes gives back everything it held in one call. The receipts whose
        message was dead-lettered instead are appended to `dead_lettered`, if given."""
        check_optional_seconds("delay_s", delay_s)
        return leasing.settle_each(self._view, _once(receipts), "nack", delay_s, dead_lettered)

    def extend(self, receipt: str, visibility_s: float) -> None:
        """Heartbeat: the lease now ends `visibility_s` from now. The receipt stays valid."""
        check_optional_seconds("visibility_s", visibility_s)
        leasing.settle(self._view, receipt, "extend", visibility_s)

    def dead_letter(
        self, receipt: str, detail: str | None = None, *, reason: str = REASON_REJECTED
    ) -> None:
        """Move the leased message to the dead-letter queue (or this queue's @dead), a
        consumer's verdict on it: `reason` "rejected" (the default) or "unreadable", and
        `detail`, a line saying why (kept with it: `Message.dead`, the `X-Dead-*` headers)."""
        check_consumer_verdict(reason, detail)
        leasing.settle(self._view, receipt, "dead_letter", reason=reason, detail=detail)

    def put_dead_letter(
        self,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        reason: str,
        source: str,
        receive_count: int,
        detail: str | None = None,
        group: str | None = None,
    ) -> str:
        """Store a message that died elsewhere (a pub/sub delivery given up on) in this queue,
        ready, with its provenance, as a dead-lettered message arrives: `reason` (one of
        `events.DEAD_REASONS`), the `source` it died in (any label), how often it had been
        delivered, and a consumer's `detail`. Returns its new id. Like every dead letter it
        takes no capacity token and no dedup record: a dead-letter queue never refuses one."""
        context = self._files.context
        dead = DeadLetter(reason, source, receive_count, time.time(), detail)
        return deadletters.put(
            self.name,
            self._view.config,
            self.path,
            context.access,
            context.events,
            body,
            headers or {},
            group,
            dead,
        )

    def ack_many(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """Ack several receipts; returns the failures by receipt (empty when all succeeded).
        A `StorageError` is raised instead, once every receipt has been tried. A receipt given
        twice is settled once (as over HTTP), here and in every `*_many`/`*_each`."""
        return _raise_storage_errors(leasing.ack_each(self._view, _once(receipts)))

    def ack_each(self, receipts: Iterable[str]) -> dict[str, Exception]:
        """`ack_many` that returns a `StorageError` by receipt too: for a caller that acks for
        several clients at once (the server), so each learns its own outcome (every receipt
        not in the result was acknowledged, even when others failed)."""
        return leasing.ack_each(self._view, _once(receipts))

    def extend_many(self, receipts: Iterable[str], visibility_s: float) -> dict[str, Exception]:
        """Heartbeat several leases at once: each now ends `visibility_s` from now (receipts
        stay valid). Returns the failures by receipt (`StaleReceipt` for a lease that expired
        or was settled, `InvalidArgument` for what is no receipt); empty when all were
        extended. A `StorageError` is raised instead, once every receipt has been tried.
        `InvalidArgument` at once for a bad `visibility_s`."""
        return _raise_storage_errors(leasing.extend_each(self._view, _once(receipts), visibility_s))

    def extend_each(self, receipts: Iterable[str], visibility_s: float) -> dict[str, Exception]:
        """`extend_many` that returns a `StorageError` by receipt too (see `ack_each`)."""
        return leasing.extend_each(self._view, _once(receipts), visibility_s)

    # -- by id -------------------------------------------------------------------------------------
    def delete(self, message_id: str) -> bool:
        """Delete a message by id, whatever its state and whoever leased it (MQ semantics).
        Returns False if no such message is in the queue."""
        return lookup.delete(self._view, message_id)

    def peek(self, message_id: str) -> Message:
        """Read a message by id without leasing it; MessageNotFound if absent, CorruptMessage
        if its file does not decode (it stays where it is: a get sets it aside)."""
        return lookup.peek(self._view, message_id)

    def browse(
        self, limit: int | None = None, *, after: str | None = None, state: str = "ready"
    ) -> Iterator[Message]:
        """Messages of one state in id (FIFO) order, without leasing them (a snapshot; others
        may take them): `state` "ready", "leased" (in flight), "delayed" or "dead" (this
        queue's own dead area); with `after` (a message id), only those after it: a page, for
        browsing in steps."""
        return lookup.browse(self._view, limit, after, state)

    # -- redrive (redrive.py) ---------------------------------------------------------------------
    def redrive(
        self,
        ids: Collection[str] | None = None,
        *,
        reason: str | None = None,
        to: str | None = None,
    ) -> int:
        """Move this queue's dead messages (its own dead area, and the dead letters it holds
        as a dead-letter queue) back where they died, or to queue `to`: all of them, or those
        of `ids`, or of `reason`. Each keeps its id, headers and group (one rename each);
        returns how many moved. For a paced, cancellable, resumable redrive, see
        `dirmq.redrive` (what the server's `POST /{queue}/redrive` and `dirmq redrive` run)."""
        redriving.check_filter(ids, reason)
        planned = redriving.plan(self._view, ids)
        return redriving.move_planned(self._view, planned, reason, to).moved

    def redrive_plan(
        self,
        ids: Collection[str] | None = None,
        *,
        after: str | None = None,
        until: str | None = None,
    ) -> list[redriving.Planned]:
        """What a redrive may move, oldest first (ids after `after`, up to `until`)."""
        redriving.check_filter(ids, None)
        return redriving.plan(self._view, ids, after, until)

    def redrive_move(
        self,
        planned: list[redriving.Planned],
        *,
        reason: str | None = None,
        to: str | None = None,
        sole_source: str | None = None,
        plain_dead: bool = False,
    ) -> redriving.Moved:
        """Move what `planned` holds that is dead here (see `redriving.move_planned`)."""
        redriving.check_filter(None, reason)
        return redriving.move_planned(self._view, planned, reason, to, sole_source, plain_dead)

    @property
    def corrupt_quarantined(self) -> int:
        """Corrupt files this object's gets and reads set aside in @corrupt (a counter)."""
        return self._files.quarantined

    # -- whole queue -------------------------------------------------------------------------------
    def stats(self) -> QueueStats:
        """Counts by state. Expired leases and due delays count as ready (they are, to any get)."""
        return maintenance.stats(self._view)

    def ready_by_level(self) -> dict[int, int]:
        """The ready count of each priority level ({level: count}, every level of the queue's
        `priority_levels`, and any other still holding messages), summing to `stats().ready`
        at one instant. From counts, not by reading messages: O(levels + backlog buckets +
        in flight + delayed), as `stats`."""
        return maintenance.ready_by_level(self._view)

    def purge(self, progress: ProgressFn | None = None, *, dead: bool = False) -> int:
        """Delete every message (ready, in flight, delayed), or with `dead` every message of
        the queue's own dead area (and nothing else); returns how many were removed."""
        return maintenance.purge(self._view, progress, dead)

    def sweep(self) -> SweepReport:
        """Recovery: remove orphaned temp files, requeue expired leases, deliver due delays,
        drop messages past retention, free capacity tokens whose message is gone, return the
        recycled-file pools of dead processes to the shared pool and trim it. Includes what
        opening the queue recovered."""
        return maintenance.sweep(self._view)

    # -- planned claims (cooperating consumers; see claims.py) -------------------------------------
    def ready_names(
        self, limit: int | None = None, *, promote: bool = True, groups: bool = False
    ) -> list[str]:
        """The file names of the oldest ready messages (the oldest `limit`, or without one all
        of @ready and, from a deep queue's backlog, up to 10,000 more), oldest first, without
        leasing them: a plan that one coordinator splits among cooperating
        consumers, each of which `claim_named`s its share, so that no two of them race for the
        head of the queue. Due delayed messages and expired leases are made ready first (unless
        `promote` is false). The list stops before the first message of a group (a group's
        order needs `get`), unless `groups` is true: then it holds every ready message."""
        return claims.ready_names(self._view, limit, promote, groups)

    def claim_named(
        self,
        names: list[str],
        *,
        visibility_s: float | None = None,
        drain: int | None = None,
        consumer: str | None = None,
    ) -> list[tuple[str, Message]]:
        """Lease the ready messages `names` (from `ready_names`) that nobody took meanwhile, in
        order: (lease name, message) pairs. The lease name acknowledges the message with
        `ack_leases`. This process's index is neither opened nor synced for it. If a read
        fails, the messages read before it are returned and the others go back to @ready at
        once, in their FIFO place (StorageError when none was read).

        `drain`: how many names this consumer's share holds in all, when it passes them in
        chunks. The files its acks free are then kept for later puts up to that many, as a
        `get` keeps up to the queue's depth (docs/FORMAT.md, "A drain keeps what it frees"),
        instead of up to one chunk's size, beyond which each ack would pay an unlink.
        `consumer`: the label of the holder the leases name, as in `get`."""
        return claims.claim_named(self._view, names, visibility_s, drain, consumer)

    def lease_named(
        self,
        names: list[str],
        *,
        visibility_s: float | None = None,
        drain: int | None = None,
        consumer: str | None = None,
    ) -> list[str]:
        """`claim_named` without reading the messages: the lease names of those taken, in
        order. Read them with `read_leases`, one at a time: a consumer that must record what
        it leased before processing any of it then never holds the whole lot in memory."""
        return claims.lease_named(self._view, names, visibility_s, drain, consumer)

    def read_leases(self, leases: Iterable[str]) -> Iterator[Message]:
        """The messages behind lease names (from `lease_named`), one at a time: a consumer
        holds what it has not passed on yet, nothing more. One whose lease file has moved since
        (a heartbeat extended it, or it expired) is found by `read_ids` and comes after the
        others of its chunk of `claims.READ_CHUNK`; it has a receipt only while it is still
        under this lease. One that is gone (acknowledged by id) or damaged (set aside in
        @corrupt) is left out."""
        return claims.read_leases(self._view, leases)

    def read_ids(self, message_ids: Collection[str]) -> Iterator[Message]:
        """Read messages by id wherever they are now (ready, leased, delayed, dead), without
        leasing them, from one listing of the state directories rather than the index: for a
        consumer that recorded what it received and must find it again, on any filesystem
        (a polling index can be seconds behind), without building an index of the whole
        queue. Ids not found are left out. A message that moves between the listing and its
        read is looked for again (three listings at most)."""
        return claims.read_ids(self._view, message_ids)

    def ack_leases(self, leases: Iterable[str]) -> list[str]:
        """Acknowledge leased messages by their lease names (from `claim_named`), without the
        index; returns the names that are no longer there (extended, expired or acknowledged
        since): settle those by receipt (`ack_many`)."""
        return claims.ack_leases(self._view, leases)

    # -- watching ----------------------------------------------------------------------------------
    def fileno(self) -> int | None:
        """A file descriptor that becomes readable when the queue changes (None when polling).
        Changes reach it when the Store's shared inotify descriptor is pumped: an event loop
        must also watch `Store.watch_fileno()` and call `Store.pump_watches()`."""
        return self._view.fileno()

    def indexed(self) -> bool:
        """Whether this process holds the queue's index now. If not, the next call that needs
        it lists the queue's state directories first: on a deep backlog, a long call."""
        return self._view.index is not None

    def polled(self) -> bool:
        """Whether changes are noticed by polling (a shared filesystem, or no inotify watch to
        be had): listeners and waiters hear of them within `poll_interval_s`, not at once."""
        return self._view.polled()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` (from whichever thread notices) when this queue may have changed:
        any process published, acked or requeued, or the queue was closed or deleted. Returns
        the function that unsubscribes. For event loops: pass something thread-safe, such as
        `lambda: loop.call_soon_threadsafe(event.set)`; the Store's shared inotify descriptor
        (`Store.watch_fileno`) must be pumped for changes to be noticed without a blocked get."""
        return self._view.subscribe(listener)

    def watch_if_idle(self, listener: Callable[[], None]) -> Callable[[], None] | None:
        """For waiting on a queue this process holds no index of, without building one: if
        nothing is ready, in the backlog, delayed or leased, call `listener` (as `subscribe`
        does) when any of that changes, and return the function that unsubscribes; else None
        (also when changes are polled, or no inotify watch is to be had): `subscribe` then.
        A few system calls, no listing beyond a first entry: cheap enough for an event loop."""
        return self._view.watch_if_idle(listener)

    def release_if_idle(self, unused_since: float) -> bool:
        """Stop watching and forget the index if nobody waits on this queue nor used it since
        `unused_since` (time.monotonic()); its next use builds them again. For
        `Store.release_idle`."""
        return self._view.release_if_idle(unused_since)

    def close(self) -> None:
        self._view.close()

    def __repr__(self) -> str:
        return f"<dirmq.Queue {self.name!r} at {self.path!r}>"


def _once(receipts: Iterable[str]) -> list[str]:
    """Each receipt once, in the order given: a batch that names one twice settles it once."""
    return list(dict.fromkeys(receipts))


def _raise_storage_errors(failures: dict[str, Exception]) -> dict[str, Exception]:
    """`failures`, or the first `StorageError` among them raised (the storage failed, not
    the receipt: the caller retries the whole lot)."""
    for failure in failures.values():
        if isinstance(failure, StorageError):
            raise failure
    return failures
