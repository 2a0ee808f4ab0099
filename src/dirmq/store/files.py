"""The files of one queue and the transitions between its state directories.

Each transition method performs one row of the state table in `states.py` (the table names
it; tests/test_states.py holds both to it): a rename (or the final retirement of the file),
which either happens completely or, when another process got there first, not at all (ENOENT,
reported as False/None, never as an error). Callers pass the process's index so it
stays in step with what this process itself did, without waiting for watcher events. Not
thread-safe on its own: callers hold the `QueueView` lock, except around `retire_leases`, which
touches no index (the pool and the capacity tokens have their own safety).

Why it is long: it holds every row of the state table, each next to what it must keep in step
with (the index, capacity tokens, the pool), so that one module answers "what happens to a
message file, and who does it".
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
from dataclasses import replace

from dirmq.errors import CorruptMessage, storage_error
from dirmq.store import backlog as backlog_files
from dirmq.store import deadletters, layout
from dirmq.store.backlog import REFILL_BELOW, REFILL_CHUNK, SPILL_AT, Backlog
from dirmq.store.bodyfiles import threshold as bodies_by_file_over
from dirmq.store.capacity import Slots, read_slot
from dirmq.store.claimtokens import ClaimTokens
from dirmq.store.codec import Decoded
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.context import QueueContext
from dirmq.store.dedup import Dedup
from dirmq.store.events import REASON_MAX_RECEIVES, REASON_REJECTED
from dirmq.store.expiry import read_deadline_s
from dirmq.store.ids import id_time_us
from dirmq.store.index import GroupRuns, QueueIndex
from dirmq.store.layout import Entry, parse_entry
from dirmq.store.message import DeadLetter, Message, SweepReport
from dirmq.store.pool import DRAIN_KEEP_FILES, FilePool
from dirmq.store.reading import read_message, stored_message
from dirmq.store.recovery import remove_orphans

log = logging.getLogger(__name__)
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# How long a shared-filesystem client may serve old bytes of a file (about 1 s measured on
# GlusterFS, docs/FORMAT.md), with a margin: a claimed file is re-read that long before it
# is called corrupt.
SHARED_REREAD_S = 2.0
# What a settle did with a lease (`QueueFiles.settle`; `Queue.nack` returns it).
SETTLED_EXTENDED = "extended"
SETTLED_RETURNED = "returned"  # ready again, in its FIFO place
SETTLED_DELAYED = "delayed"  # ready again after the delay given
SETTLED_DEAD = "dead-lettered"  # past the queue's max receives, or a consumer's verdict


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class QueueFiles:
    def __init__(self, context: QueueContext, name: str, path: str) -> None:
        self.name = name
        prefix = os.path.join(path, "")  # one join, not one per directory: opened per queue
        self.dir = {d: prefix + d for d in layout.STATE_DIRS}
        self.queue_dir = path
        self._context = context
        self.access = context.access  # the modes of every file written here
        self.context = context
        self.quarantined = 0  # corrupt files this process set aside
        # The shared-filesystem mode's claim tokens (claimtokens.py); None on a local disk.
        self.tokens = ClaimTokens(self.dir[layout.TMP], context.access) if context.shared else None

    # The parts below are made at first use: a long poll on each of thousands of idle queues
    # opens each (on the server's event loop) and uses none of them until a message comes, and
    # every object a queue keeps is walked by the cyclic GC. (Python 3.12's cached_property
    # takes no lock: two threads' first uses may each make one, and either is right, as each
    # part keeps only caches; the process's own pool is shared by directory, pool.py.)
    @functools.cached_property
    def backlog(self) -> Backlog:
        return Backlog(self.queue_dir, self.access)

    @functools.cached_property
    def pool(self) -> FilePool:
        return FilePool(
            self.dir[layout.FREE],
            self.access,
            shared=self._context.shared,
            tmp_dir=self.dir[layout.TMP],
        )

    @functools.cached_property
    def slots(self) -> Slots:
        return Slots(self.name, self.dir[layout.SLOTS])

    @functools.cached_property
    def dedup(self) -> Dedup:
        return Dedup(self.dir[layout.DEDUP], self.access)

    def remove_orphans(self) -> int:
        """Unlink the temps no live writer will publish (recovery.py): in @tmp, and in the
        shared-filesystem mode also those beside their final names in @ready and @delayed."""
        removed = remove_orphans(self.dir[layout.TMP])
        if self._context.shared:
            for directory in (layout.READY, layout.DELAYED):
                removed += remove_orphans(self.dir[directory], beside=True)
            for bucket in backlog_files.bucket_dirs(self.queue_dir):
                removed += remove_orphans(f"{self.queue_dir}/{bucket}", beside=True)
        return removed

    def path(self, directory: str, name: str) -> str:
        """`directory`: a state directory, or a backlog bucket (`@backlog/<epoch>/<second>`,
        backlog.relative_dir)."""
        base = self.dir.get(directory) or f"{self.queue_dir}/{directory}"
        return f"{base}/{name}"  # names hold no "/": no os.path.join needed

    def spill_excess(self, index: QueueIndex) -> int:
        """Move every ready message but the oldest SPILL_AT of each priority level into the
        backlog (a @ready too long for a cheap open: backlog.MIGRATE_ABOVE), newest first, one
        rename each: a kill at any point leaves each message in @ready or in its bucket, and
        the next open goes on. How many moved."""
        moved = 0
        for ordered in index.ready_ids_by_level().values():
            for message_id in reversed(ordered[SPILL_AT:]):
                name = index.ready.get(message_id)
                if name is None:
                    continue
                bucket = self.backlog.prepare(name, durable=True)
                try:
                    os.rename(self.path(layout.READY, name), f"{bucket}/{name}")
                except FileNotFoundError:
                    continue  # claimed by another process meanwhile
                except OSError as exc:
                    raise storage_error(exc, f"moving messages of queue {self.name!r}") from exc
                index.discard(layout.READY, name)
                index.backlog.add(backlog_files.tree_key(name))
                moved += 1
        if moved:
            log.info(
                "queue %r: %d ready messages moved to the backlog (a long @ready)",
                self.name,
                moved,
                extra={"fields": {"queue": self.name, "moved": moved}},
            )
        return moved

    def refill(self, index: QueueIndex, want: int = REFILL_BELOW) -> int:
        """Move the oldest messages of the backlog into @ready (backlog.py) while @ready holds
        fewer than `want` and the index knows of a bucket: how many moved. Each priority level
        by its own count in @ready, from its own tree."""
        if not any(backlog_files.is_level_dir(n) for n in index.backlog):
            levels = [0]  # the usual case: level 0's epochs only
        else:
            levels = sorted(index.backlog_levels(), reverse=True)
        total = 0
        for level in levels:
            while index.backlog and index.ready_count(level) < want:
                count = index.ready_count(level)
                moved = self.backlog.refill(max(REFILL_CHUNK, want - count), level)
                for name in moved:
                    index.add(layout.READY, name)
                total += len(moved)
                if not moved:
                    break
        return total

    # -- reading ------------------------------------------------------------------------------
    def read(self, directory: str, name: str, *, corrupt_ok: bool = True) -> Message | None:
        """The message stored as `directory/name`, without changing its state; None if it is
        gone, or corrupt (CorruptMessage instead when not `corrupt_ok`: a read by id must not
        pass a damaged message off as absent). StorageError if it cannot be read."""
        entry = parse_entry(name)
        if entry is None:
            return None
        try:
            decoded = read_message(self.path(directory, name), entry.message_id)
        except FileNotFoundError:
            return None
        except CorruptMessage:
            if corrupt_ok:
                return None
            raise
        except OSError as exc:
            raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
        message = stored_message(entry, directory, decoded)
        if directory == layout.LEASED and (holders := self._context.holders) is not None:
            return replace(message, holder=holders.describe(entry.holder))
        return message

    def locate_listed(self, message_ids: set[str]) -> dict[str, tuple[str, str]]:
        """(state directory, file name) of each of `message_ids` found by listing the state
        directories, not through an index."""
        found: dict[str, tuple[str, str]] = {}
        for directory in (layout.LEASED, layout.READY, layout.DELAYED, layout.DEAD):
            try:
                names = os.listdir(self.dir[directory])
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise storage_error(exc, f"listing {directory} of queue {self.name!r}") from exc
            for name in names:
                message_id = name[: layout.ID_LENGTH]
                if message_id in message_ids and message_id not in found:
                    entry = parse_entry(name)
                    if entry is not None and entry.message_id == message_id:
                        found[message_id] = (directory, name)
        if missing := message_ids - found.keys():
            found.update(backlog_files.find(self.queue_dir, missing))
        return found

    # -- transitions --------------------------------------------------------------------------
    def claim(
        self,
        index: QueueIndex,
        config: QueueConfig,
        at_ms: int,
        visibility_ms: int,
        runs: GroupRuns | None = None,
        holder: str | None = None,
    ) -> Message | None:
        """Lease the oldest ready message (ready -> leased); None when nothing is ready.

        `runs` is the state of the get this claim is part of (which groups it holds);
        `holder` the token its lease name carries (holders.py), if any."""
        runs = GroupRuns() if runs is None else runs
        if index.backlog:
            self.refill(index)
        self.pool.note_depth(_depth(index))  # a drain keeps its freed files for later puts
        while (name := index.pop_ready(config.peers, runs)) is not None:
            entry = parse_entry(name)
            assert entry is not None
            try:
                lease = self._take(index, config, name, entry, at_ms, visibility_ms, holder)
            except OSError:
                index.add(layout.READY, name)  # still in @ready: in its FIFO place next time
                raise
            if lease is None:
                runs.missed += 1
                # Another process claimed or deleted it first. If it was a group's, that
                # process may hold the group now: leasing the group's next one would break it.
                if entry.group is not None:
                    runs.lost.add(entry.group)
                continue
            if entry.group is not None:
                runs.taken[entry.group] += 1
            deadline_ms = at_ms + visibility_ms
            try:
                message = self.open_claimed(lease, entry.message_id, entry.count + 1, deadline_ms)
            except OSError as exc:
                self.hand_back(index, lease, name)
                raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
            if message is not None:
                return message
        return None

    def claim_many(
        self,
        index: QueueIndex,
        config: QueueConfig,
        at_ms: int,
        visibility_ms: int,
        runs: GroupRuns,
        max_count: int,
        holder: str | None = None,
    ) -> list[Message]:
        """Lease up to `max_count` of the oldest ready messages (a get's leases): `claim` over
        and over, with its usual case in line. A head in no group, on a local filesystem, in
        a queue that keeps messages for ever and spreads nothing over its head (no retention,
        no `peers`) costs a rename, a read and the index's two entries: no parse of its name,
        no `Entry`. Anything else takes `claim`'s way. A failure after something was leased
        ends the batch and is not raised: what is leased goes to the caller. `holder`: the
        token every lease name of the batch carries (holders.py), if any."""
        if index.backlog:
            self.refill(index)
        self.pool.note_depth(_depth(index))  # a drain keeps its freed files for later puts
        got: list[Message] = []
        plain = not config.peers and self.tokens is None and config.retention_s is None
        deadline_ms = at_ms + visibility_ms
        suffix = f"+{holder}" if holder else ""
        id_length, pop_plain = layout.ID_LENGTH, index.pop_plain_head
        try:
            while len(got) < max_count:
                name = pop_plain() if plain else None
                if name is None:  # nothing ready, or not the usual case: `claim` decides
                    message = self.claim(index, config, at_ms, visibility_ms, runs, holder)
                    if message is None:
                        break
                    got.append(message)
                    continue
                message_id = name[:id_length]
                if len(name) == id_length:
                    count = 1  # never received: most of a backlog
                    lease = f"{message_id}.{count}.{deadline_ms}{suffix}"
                else:  # returned before, or of a level: both are in its name (indexed: parsed)
                    entry = parse_entry(name)
                    assert entry is not None
                    count = entry.count + 1
                    lease = layout.timed_name(
                        message_id, count, deadline_ms, None, holder, entry.level
                    )
                try:
                    leased = self._lease(index, name, lease, message_id, deadline_ms)
                except OSError:
                    index.add(layout.READY, name)  # still in @ready: in its FIFO place
                    raise
                if not leased:
                    runs.missed += 1  # another process claimed or deleted it first
                    continue
                try:
                    message = self.open_claimed(lease, message_id, count, deadline_ms)
                except OSError as exc:
                    self.hand_back(index, lease, name)
                    raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
                if message is not None:
                    got.append(message)
        except OSError:
            if not got:
                raise
        return got

    def hand_back(self, index: QueueIndex | None, lease: str, name: str) -> None:
        """Put back a message leased by a claim that could not read it: under its ready name
        `name` it keeps its FIFO place and its receive count. If even that rename fails, the
        lease stays (in the index too) and expires like any other."""
        try:
            moved = self.move(layout.LEASED, lease, layout.READY, name)
        except OSError:
            return
        if moved and index is not None:
            index.discard(layout.LEASED, lease)
            index.add(layout.READY, name)

    def take_named(
        self,
        index: QueueIndex | None,
        config: QueueConfig,
        entries: list[tuple[str, Entry]],
        at_ms: int,
        visibility_ms: int,
        holder: str | None = None,
    ) -> list[tuple[str, str, Entry]]:
        """Lease exactly the @ready files named in `entries` (name, parsed name) that are still
        there, in order, without reading them: (lease name, ready name, parsed ready name) of
        each file taken. For cooperating consumers given disjoint names by one planner, so no
        two of them race for the same head. Group names must not be passed (their order needs
        `claim`; the caller checked them)."""
        taken: list[tuple[str, str, Entry]] = []
        for name, entry in entries:
            try:
                lease = self._take(index, config, name, entry, at_ms, visibility_ms, holder)
            except OSError:
                if taken:  # what is leased already goes to the caller, not to waste
                    break
                raise
            if lease is not None:
                taken.append((lease, name, entry))
        return taken

    def _take(
        self,
        index: QueueIndex | None,
        config: QueueConfig,
        name: str,
        entry: Entry,
        at_ms: int,
        visibility_ms: int,
        holder: str | None = None,
    ) -> str | None:
        """Rename @ready/`name` into @leased; its lease name, or None when it was gone (or past
        the queue's retention, and removed now)."""
        if expired_by_retention(entry.message_id, config, at_ms):
            self.remove(index, layout.READY, name, entry.message_id)
            return None
        lease = layout.timed_name(
            entry.message_id,
            entry.count + 1,
            at_ms + visibility_ms,
            entry.group,
            holder,
            entry.level,
        )
        tokens, token = self.tokens, None
        if tokens is not None:  # the shared-filesystem mode: see claimtokens.py
            if not tokens.fresh(at_ms, now_ms()):
                return None  # a long get: the next one claims it under a fresh lease name
            try:
                token = tokens.take(lease)
            except FileNotFoundError:
                return None  # the queue is going away
            except OSError as exc:
                raise storage_error(exc, f"claiming a message of queue {self.name!r}") from exc
            if token is None:
                return None  # another host's claim of this very lease name
        try:
            moved = self._lease(index, name, lease, entry.message_id, at_ms + visibility_ms)
        except BaseException:
            if tokens is not None and token is not None:
                tokens.drop(token)
            raise
        if tokens is not None and token is not None:
            tokens.keep(token)  # a lost claim's too: no unlink on the path of a claim
        return lease if moved else None

    def _lease(
        self, index: QueueIndex | None, name: str, lease: str, message_id: str, deadline_ms: int
    ) -> bool:
        """Rename @ready/`name` to @leased/`lease` (the lease name of `message_id` until
        `deadline_ms`); False if it was gone. The index learns the lease from the parts that
        made its name: no parse of it, here or at its ack."""
        try:
            self._rename(f"{self.dir[layout.READY]}/{name}", f"{self.dir[layout.LEASED]}/{lease}")
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, f"moving a message of queue {self.name!r}") from exc
        if index is not None:
            index.discard(layout.READY, name)
            leased = index.leased
            if "~" in lease:
                entry = parse_entry(lease)
                assert entry is not None
                leased.add(entry, lease)
            else:
                leased.add_ungrouped(message_id, deadline_ms, lease)
        return True

    def open_claimed(
        self, lease: str, message_id: str, count: int, deadline_ms: int
    ) -> Message | None:
        """`open_lease` of a file just claimed: None if it is already gone or damaged."""
        try:
            return self.open_lease(lease, message_id, count, deadline_ms)
        except FileNotFoundError:
            return None  # deleted by id a moment after our claim

    def open_lease(
        self, lease: str, message_id: str, count: int, deadline_ms: int
    ) -> Message | None:
        """The message leased as @leased/`lease`: None if it is corrupt (set aside now);
        FileNotFoundError if it is not there (deleted by id, or its lease moved on)."""
        target = self.path(layout.LEASED, lease)
        # A get inside `bodyfiles.bodies_by_file` (the server's plain GET): large bodies stay
        # in their files. Only here: what the store itself reads (a dead letter's rewrite, a
        # peek) is always the bytes.
        over = bodies_by_file_over()
        try:
            decoded = read_message(target, message_id, over)
        except CorruptMessage:
            if not self._context.shared:
                self.quarantine(target, lease)
                return None
            reread = self._reread(target, message_id, over)
            if reread is None:
                self.quarantine(target, lease)
                return None
            decoded = reread
        return Message(
            id=message_id,
            body=decoded.body,
            headers=decoded.headers,
            receive_count=count,
            published_at_s=id_time_us(message_id) / 1e6,
            receipt=f"{message_id}.{count}",
            lease_deadline_s=deadline_ms / 1000,
            state="leased",
            group=decoded.system.get("Group"),
            dead=deadletters.from_system(decoded.system) if len(decoded.system) > 1 else None,
            expires_at_s=read_deadline_s(decoded.system) if len(decoded.system) > 1 else None,
            priority=layout.level_of(lease),
        )

    def _reread(self, path: str, message_id: str, over: int | None = None) -> Decoded | None:
        """On a shared filesystem, a file that did not decode is read again for up to
        `SHARED_REREAD_S` before it is called corrupt: this host's client may still serve
        bytes it read before another host wrote the file (docs/FORMAT.md, "Filesystems":
        about a second), and an intact message must not be set aside for that."""
        deadline = time.monotonic() + SHARED_REREAD_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                return read_message(path, message_id, over)
            except CorruptMessage:
                continue
        return None

    def promote(self, index: QueueIndex, config: QueueConfig, at_ms: int) -> SweepReport:
        """Deliver due delayed messages and requeue (or dead-letter) expired leases."""
        if not index.due_by(at_ms):  # every get asks: the usual answer, at the cost of a look
            return _NOTHING_PROMOTED
        delivered = self._deliver_due(index, at_ms)
        requeued, dead = self._requeue_expired(index, config, at_ms)
        if requeued or dead:
            log.info(
                "queue %r: %d expired leases returned to @ready, %d dead-lettered",
                self.name,
                requeued,
                dead,
                extra={"fields": {"queue": self.name, "requeued": requeued, "dead": dead}},
            )
        return SweepReport(
            leases_requeued=requeued, delayed_delivered=delivered, dead_lettered=dead
        )

    def _deliver_due(self, index: QueueIndex, at_ms: int) -> int:
        """Move the delayed messages due by `at_ms` into @ready; how many moved."""
        delivered = 0
        due = index.delayed.pop_due(at_ms)
        for i, name in enumerate(due):
            entry = parse_entry(name)
            assert entry is not None
            target = layout.ready_name(entry.message_id, entry.count, entry.group, entry.level)
            try:
                moved = self.move(layout.DELAYED, name, layout.READY, target)
            except OSError:
                _keep_due(index, layout.DELAYED, due[i:])
                raise
            if moved:
                index.add(layout.READY, target)
                delivered += 1
        return delivered

    def _requeue_expired(
        self, index: QueueIndex, config: QueueConfig, at_ms: int
    ) -> tuple[int, int]:
        """Return the leases expired by `at_ms` to their FIFO place in @ready, or dead-letter
        those received `receive_limit` times: (how many requeued, how many dead-lettered)."""
        requeued = dead = 0
        expired = index.leased.pop_due(at_ms)
        for i, name in enumerate(expired):
            entry = parse_entry(name)
            assert entry is not None
            try:
                if entry.count >= config.receive_limit:
                    dead += self.dead_letter(
                        index, layout.LEASED, name, config, REASON_MAX_RECEIVES
                    )
                    continue
                target = layout.ready_name(entry.message_id, entry.count, entry.group, entry.level)
                moved = self.move(layout.LEASED, name, layout.READY, target)
            except OSError:
                _keep_due(index, layout.LEASED, expired[i:])
                raise
            if moved:
                index.add(layout.READY, target)
                requeued += 1
        if (requeued or dead) and self._context.events.leases_expired is not None:
            self._context.events.leases_expired(self.name, requeued + dead)
        return requeued, dead

    def settle(
        self,
        index: QueueIndex,
        config: QueueConfig,
        action: str,
        lease: str,
        delay_s: float,
        reason: str = REASON_REJECTED,
        detail: str | None = None,
    ) -> str:
        """Apply extend/nack/dead_letter (an ack is `ack`) to the leased file `lease`; what
        became of it (`SETTLED_*`): a nack past the queue's max receives dead-letters too.
        `reason` and `detail`: a dead_letter's verdict (deadletters.py).

        Raises FileNotFoundError if the lease vanished meanwhile (the caller re-resolves).
        """
        entry = parse_entry(lease)
        assert entry is not None and entry.at_ms is not None
        path = self.path(layout.LEASED, lease)
        if action == "extend":
            self._lease_until(index, path, entry, delay_s)
            return SETTLED_EXTENDED
        if action == "dead_letter" or entry.count >= config.receive_limit:
            if action != "dead_letter":
                reason, detail = REASON_MAX_RECEIVES, None
            if not self.dead_letter(index, layout.LEASED, lease, config, reason, detail):
                raise FileNotFoundError(path)
            return SETTLED_DEAD
        if delay_s > 0 and entry.group is not None:
            # A group message given back with a delay stays in flight until then, holding its
            # group (as SQS's ChangeMessageVisibility does): in @delayed, the group's next
            # message would overtake it. Its receipt stays valid meanwhile.
            self._lease_until(index, path, entry, delay_s)
            return SETTLED_DELAYED
        self._give_back(index, path, lease, entry, delay_s)
        return SETTLED_DELAYED if delay_s > 0 else SETTLED_RETURNED

    def ack(self, index: QueueIndex, leases: list[str]) -> dict[str, OSError]:
        """Retire each leased file of `leases` (into the pool of recycled files, or unlinked),
        freeing its capacity token: the failures by lease name, FileNotFoundError for one that
        vanished meanwhile (the caller re-resolves it). Nothing is raised. One batch
        retirement (`FilePool.retire_many`) unless capacity tokens are in use: then each file
        is read for its token before it goes, and the token freed only once the file is gone
        (else it would hold none)."""
        failures: dict[str, OSError] = {}
        discard, id_length = index.leased.discard, layout.ID_LENGTH
        if not index.slots_in_use():
            failures = self.pool.retire_many(self.dir[layout.LEASED], leases)
            for lease in leases:
                if lease not in failures:
                    discard(lease[:id_length], lease)
            return failures
        for lease in leases:
            message_id = lease[:id_length]
            path = self.path(layout.LEASED, lease)
            slot = self.slots.slot_of(path, index)
            try:
                self.pool.retire(path, message_id)
            except OSError as exc:
                failures[lease] = exc
                continue
            discard(message_id, lease)
            if slot is not None:
                self.slots.release(slot, message_id, index)
        return failures

    def _give_back(
        self, index: QueueIndex, path: str, lease: str, entry: Entry, delay_s: float
    ) -> None:
        """Return the lease at `path` to @ready (its FIFO place), or to @delayed until
        `delay_s` from now."""
        message_id, count = entry.message_id, entry.count
        if delay_s > 0:
            directory = layout.DELAYED
            new = layout.timed_name(
                message_id, count, now_ms() + round(delay_s * 1000), entry.group, None, entry.level
            )
        else:
            new = layout.ready_name(message_id, count, entry.group, entry.level)
            directory = layout.READY
        self._rename(path, self.path(directory, new))
        index.add(directory, new)
        index.leased.discard(message_id, lease)

    def retire_leases(self, leases: list[str], tokens: bool) -> dict[str, OSError]:
        """Acknowledge each @leased file of `leases` by name: the failures by lease name,
        FileNotFoundError for one that is not there (moved: extended, expired; its token stays
        with it). Nothing is raised. `tokens`: capacity tokens may be held (each file is read
        for its slot before it goes, one at a time); else one batch retirement. Needs no lock:
        the caller updates its index."""
        if not tokens:
            return self.pool.retire_many(self.dir[layout.LEASED], leases)
        failures: dict[str, OSError] = {}
        for lease in leases:
            message_id = lease[: layout.ID_LENGTH]
            path = self.path(layout.LEASED, lease)
            slot = read_slot(path)  # read before the file goes
            try:
                self.pool.retire(path, message_id)
            except OSError as exc:
                failures[lease] = exc
                continue
            if slot is not None:
                self.slots.release(slot, message_id, None)
        return failures

    def _lease_until(self, index: QueueIndex, path: str, entry: Entry, seconds: float) -> None:
        """The lease at `path` now ends `seconds` from now, held by the same holder."""
        due_ms = now_ms() + round(seconds * 1000)
        new = layout.timed_name(
            entry.message_id, entry.count, due_ms, entry.group, entry.holder, entry.level
        )
        self._rename(path, self.path(layout.LEASED, new))
        index.add(layout.LEASED, new)

    def move(self, src_dir: str, src: str, dst_dir: str, dst: str) -> bool:
        """One state transition; False if another process got there first."""
        try:
            self._rename(self.path(src_dir, src), self.path(dst_dir, dst))
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise storage_error(exc, f"moving a message of queue {self.name!r}") from exc
        return True

    def _rename(self, src: str, dst: str) -> None:
        """`os.rename`. A rename needs space only when the target directory must grow: at a
        full disk, the recycled files this process holds are given back first, then the
        rename is tried once more."""
        try:
            os.rename(src, dst)
        except OSError as exc:
            if exc.errno not in _NO_SPACE or not self.pool.release_space():
                raise
            os.rename(src, dst)

    def dead_letter(
        self,
        index: QueueIndex,
        src_dir: str,
        name: str,
        config: QueueConfig,
        reason: str,
        detail: str | None = None,
    ) -> int:
        """Move a message to the dead-letter queue (or @dead) with its provenance
        (deadletters.py: claimed into @dead by a rename, then written anew); 1 if moved, 0 if
        it was gone."""
        entry = parse_entry(name)
        assert entry is not None
        source = self.path(src_dir, name)
        slot = self.slots.slot_of(source, index)
        claimed = self.path(
            layout.DEAD,
            layout.dead_name(entry.message_id, entry.count, entry.group, entry.level),
        )
        try:
            self._rename(source, claimed)
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise storage_error(exc, f"dead-lettering a message of queue {self.name!r}") from exc
        index.discard(src_dir, name)
        if slot is not None:
            self.slots.release(slot, entry.message_id, index)
        dead = DeadLetter(reason, self.name, entry.count, time.time(), detail)
        try:
            self._write_dead_copy(claimed, entry, config, dead)
        except CorruptMessage:
            self.quarantine(claimed, os.path.basename(claimed))
        except OSError as exc:  # it is dead and safe in @dead, only without its provenance
            log.warning(
                "queue %r: message %s is in @dead, without why (%s)",
                self.name,
                entry.message_id,
                exc,
                extra={"fields": {"queue": self.name, "reason": reason}},
            )
        if self._context.events.dead_lettered is not None:
            self._context.events.dead_lettered(self.name, reason)
        return 1

    def _write_dead_copy(
        self, claimed: str, entry: Entry, config: QueueConfig, dead: DeadLetter
    ) -> None:
        """The message claimed as `claimed` (in @dead), written anew with `dead`: over itself,
        or into the dead-letter queue (then the claimed file is retired)."""
        message_id = entry.message_id
        data = deadletters.rewritten(read_message(claimed, message_id), message_id, dead)
        durable = config.durability is not Durability.MEMORY
        access = self._context.access
        dlq = config.dead_letter_queue
        dlq_ready = self._context.dead_letter_dir(dlq) if dlq != self.name else None
        if dlq_ready is None:
            deadletters.write_replacing(
                data, self.dir[layout.TMP], claimed, message_id, access, durable
            )
            return
        target = os.path.join(dlq_ready, layout.ready_name(message_id, 0, entry.group, entry.level))
        tmp_dir = os.path.join(os.path.dirname(dlq_ready), layout.TMP)
        deadletters.write_replacing(data, tmp_dir, target, message_id, access, durable)
        self._retire_claimed(claimed, message_id)

    def _retire_claimed(self, claimed: str, message_id: str) -> None:
        """The claimed file of a message now in the dead-letter queue goes (its capacity token
        was freed when it was claimed)."""
        try:
            self.pool.retire(claimed, message_id)
        except FileNotFoundError:
            pass  # deleted by id (or purged) meanwhile: the copy in the DLQ stands

    def quarantine(self, path: str, name: str) -> None:
        """Set a file that does not decode aside in @corrupt (never delivered, kept to inspect);
        logged, counted in `quarantined` and told to the Store's `events.quarantined` (the server's
        metric)."""
        try:
            os.rename(path, self.path(layout.CORRUPT, name))
        except OSError:
            return  # gone meanwhile, or the move failed: the next reader meets it again
        self.quarantined += 1
        message_id = name[: layout.ID_LENGTH]
        if self._context.events.quarantined is not None:
            self._context.events.quarantined(self.name)
        log.warning(
            "queue %r: message %s does not decode; set aside in @corrupt/%s",
            self.name,
            message_id,
            name,
            extra={"fields": {"queue": self.name, "file": f"{layout.CORRUPT}/{name}"}},
        )

    def remove(self, index: QueueIndex | None, directory: str, name: str, message_id: str) -> bool:
        """Take a message out of the queue for good (freeing its capacity token); False if it
        was already gone."""
        path = self.path(directory, name)
        slot = self.slots.slot_of(path, index)
        try:
            self.pool.retire(path, message_id)
        except FileNotFoundError:
            if index is not None:
                index.discard(directory, name)
            return False
        except OSError as exc:  # still there, and still in the index: nothing forgotten
            raise storage_error(exc, f"removing a message of queue {self.name!r}") from exc
        if index is not None:
            index.discard(directory, name)
        if slot is not None:
            self.slots.release(slot, message_id, index)
        return True

    def dead_names(self, message_id: str) -> list[str]:
        """Names in @dead for `message_id` (a scan of @dead: only for lookups by id that missed)."""
        try:
            return [n for n in os.listdir(self.dir[layout.DEAD]) if n.startswith(message_id)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise storage_error(exc, f"listing @dead of queue {self.name!r}") from exc


_NOTHING_PROMOTED = SweepReport()


def _depth(index: QueueIndex) -> int:
    """How deep the queue is, for the pool (`FilePool.note_depth`): @ready, or, while the
    backlog has a bucket, as deep as the pool ever keeps for (counting it would list it; what
    a drain keeps is still bounded by what it frees, and by the pool's byte bounds)."""
    return DRAIN_KEEP_FILES if index.backlog else len(index.ready)


def _keep_due(index: QueueIndex, directory: str, names: list[str]) -> None:
    """Names `pop_due` took out of the index whose move failed: they are still where they
    were, so the index keeps them (and the next get or sweep tries again)."""
    for name in names:
        index.add(directory, name)


def expired_by_retention(message_id: str, config: QueueConfig, at_ms: int) -> bool:
    if config.retention_s is None:
        return False
    return id_time_us(message_id) / 1000 + config.retention_s * 1000 < at_ms
