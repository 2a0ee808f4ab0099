"""The files of one queue and the transitions between its state directories; this module
holds the way into a lease: claims (ready -> leased: by age, in batches, by name), a claim
that gives back what it could not read, and the backlog's moves into and out of @ready.

`QueueFiles` is built in three layers, one concept each: filebase.py (the files at rest:
directories, the parts beside them, reading), settling.py (what becomes of a leased or due
message, and the rename primitives), and this module (claims).

Each transition method performs one row of the state table in `states.py` (the table names
it; tests/test_states.py holds both to it): a rename (or the final retirement of the file),
which either happens completely or, when another process got there first, not at all (ENOENT,
reported as False/None, never as an error). Callers pass the process's index so it
stays in step with what this process itself did, without waiting for watcher events. Not
thread-safe on its own: callers hold the `QueueView` lock, except around `retire_leases`, which
touches no index (the pool and the capacity tokens have their own safety).

Why it is long: every way into a lease (from @ready, straight from a backlog bucket, by name)
keeps the index, the capacity tokens and the group turns in step the same way; the backlog's
own moves and listings are in backlog.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from functools import partial

from dirmq.errors import CorruptMessage, storage_error
from dirmq.store import backlog as backlog_files
from dirmq.store import deadletters, layout
from dirmq.store.backlog import REFILL_BELOW, REFILL_CHUNK, SPILL_AT
from dirmq.store.bodyfiles import threshold as bodies_by_file_over
from dirmq.store.clock import now_ms
from dirmq.store.codec import Decoded
from dirmq.store.config import QueueConfig
from dirmq.store.expiry import read_deadline_s
from dirmq.store.ids import id_time_us
from dirmq.store.index import GroupRuns, QueueIndex
from dirmq.store.layout import Entry, parse_entry
from dirmq.store.message import Message
from dirmq.store.pool import DRAIN_KEEP_FILES
from dirmq.store.reading import read_message
from dirmq.store.settling import SettlingFiles

log = logging.getLogger(__name__)
# How long a shared-filesystem client may serve old bytes of a file (about 1 s measured on
# GlusterFS, docs/FORMAT.md), with a margin: a claimed file is re-read that long before it
# is called corrupt.
SHARED_REREAD_S = 2.0


class QueueFiles(SettlingFiles):
    """One queue's message files and every transition between its states."""

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

    # -- transitions --------------------------------------------------------------------------
    def claim(
        self,
        index: QueueIndex,
        config: QueueConfig,
        at_ms: int,
        deadline_ms: int,
        runs: GroupRuns | None = None,
        holder: str | None = None,
    ) -> Message | None:
        """Lease the oldest ready message (ready -> leased) until `deadline_ms`; None when
        nothing is ready. `at_ms` is the clock's millisecond now.

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
                lease = self._take(index, config, name, entry, at_ms, deadline_ms, holder)
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
        deadline_ms: int,
        runs: GroupRuns,
        max_count: int,
        holder: str | None = None,
        resync: Callable[[], object] | None = None,
    ) -> list[Message]:
        """Lease up to `max_count` of the oldest ready messages until `deadline_ms` (a get's
        leases): `claim` over and over, with its usual case in line. A head in no group, on a
        local filesystem, in a queue that keeps messages for ever and spreads nothing over its
        head (no retention, no `peers`) costs a rename, a read and the index's two entries: no
        parse of its name, no `Entry`. Anything else takes `claim`'s way. A failure after
        something was leased ends the batch and is not raised: what is leased goes to the
        caller. `holder`: the token every lease name of the batch carries (holders.py), if any.

        A rename that finds the head gone lost it to another process, which is leasing a batch
        of its own from there, one name after another, as this one does: going on with the
        names its index still holds, this get would try each one the other took since its last
        sync (two server workers draining one queue made two failed renames a message). So the
        usual case then brings the index up to date (`resync`) before its next claim: a lost
        race costs one failed rename, not one for every name taken since the last sync, and
        the next claim is again of the oldest ready message there is (FIFO, as without a race:
        nothing is passed over).

        With nothing ready at all and a backlog of level 0 alone, the usual case leases the
        backlog's oldest straight from their bucket (`_claim_backlog`): @ready is not refilled
        for it first."""
        plain = not config.peers and self.tokens is None and config.retention_s is None
        if index.backlog and not (plain and _direct_backlog(index)):
            self.refill(index)
        self.pool.note_depth(_depth(index))  # a drain keeps its freed files for later puts
        got: list[Message] = []
        suffix = f"+{holder}" if holder else ""
        id_length, pop_plain = layout.ID_LENGTH, index.pop_plain_head
        try:
            while len(got) < max_count:
                name = pop_plain() if plain else None
                if name is None:  # nothing ready, or not the usual case: `claim` decides
                    if plain and index.backlog and not index.ready and _direct_backlog(index):
                        taken = self._claim_backlog(
                            index, max_count - len(got), deadline_ms, holder
                        )
                        if taken:
                            got.extend(taken)
                            continue
                    message = self.claim(index, config, at_ms, deadline_ms, runs, holder)
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
                    if resync is not None:
                        resync()  # what it took since: not tried one by one
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

    def _claim_backlog(
        self, index: QueueIndex, max_count: int, deadline_ms: int, holder: str | None
    ) -> list[Message]:
        """Lease up to `max_count` of the backlog's oldest (level 0, in no group) straight
        from their buckets into @leased (`Backlog.claim`), for a get that finds nothing in
        @ready: what it read ([] if the backlog's oldest is a group's, or there is nothing).
        A message that cannot be read goes back to @ready (`hand_back`): older than the
        backlog, it is the next one."""
        suffix = f"+{holder}" if holder else ""
        id_length = layout.ID_LENGTH
        sources: dict[str, tuple[str, int]] = {}  # lease name -> (backlog name, count)

        def lease_of(name: str) -> str | None:
            if len(name) == id_length:
                count = 1  # never received: most of a backlog
                lease = f"{name}.1.{deadline_ms}{suffix}"
            else:
                entry = parse_entry(name)
                if entry is None or entry.group is not None or entry.at_ms is not None:
                    return None  # a group's (or a name fsck re-homes): refilled, not claimed
                count = entry.count + 1
                lease = layout.timed_name(
                    entry.message_id, count, deadline_ms, None, holder, entry.level
                )
            sources[lease] = (name, count)
            return lease

        leases = self.backlog.claim(max_count, partial(self._lease_from_backlog, lease_of))
        add = index.leased.add_ungrouped
        for lease in leases:
            add(lease[:id_length], deadline_ms, lease)
        got: list[Message] = []
        for at, lease in enumerate(leases):
            message_id = lease[:id_length]
            count = sources[lease][1]
            try:
                message = self.open_claimed(lease, message_id, count, deadline_ms)
            except OSError as exc:
                for rest in leases[at:]:
                    self.hand_back(index, rest, sources[rest][0])
                if got:
                    return got
                raise storage_error(exc, f"reading a message of queue {self.name!r}") from exc
            if message is not None:
                got.append(message)
        return got

    def _lease_from_backlog(
        self, lease_of: Callable[[str], str | None], bucket: str, name: str
    ) -> str | None:
        """Rename `bucket`/`name` into @leased under `lease_of(name)` (None: not taken so);
        the lease name. FileNotFoundError if another process moved it first."""
        lease = lease_of(name)
        if lease is not None:
            os.rename(f"{bucket}/{name}", f"{self.dir[layout.LEASED]}/{lease}")
        return lease

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
        deadline_ms: int,
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
                lease = self._take(index, config, name, entry, at_ms, deadline_ms, holder)
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
        deadline_ms: int,
        holder: str | None = None,
    ) -> str | None:
        """Rename @ready/`name` into @leased until `deadline_ms`; its lease name, or None when
        it was gone (or past the queue's retention at `at_ms`, and removed now)."""
        if expired_by_retention(entry.message_id, config, at_ms):
            self.remove(index, layout.READY, name, entry.message_id)
            return None
        lease = layout.timed_name(
            entry.message_id,
            entry.count + 1,
            deadline_ms,
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
            moved = self._lease(index, name, lease, entry.message_id, deadline_ms)
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


def _direct_backlog(index: QueueIndex) -> bool:
    """Whether the backlog holds level 0's tree alone (epochs, no `p<level>`): then a get that
    finds @ready empty may lease from it straight (`QueueFiles._claim_backlog`)."""
    return not any(backlog_files.is_level_dir(n) for n in index.backlog)


def _depth(index: QueueIndex) -> int:
    """How deep the queue is, for the pool (`FilePool.note_depth`): @ready, or, while the
    backlog has a bucket, as deep as the pool ever keeps for (counting it would list it; what
    a drain keeps is still bounded by what it frees, and by the pool's byte bounds)."""
    return DRAIN_KEEP_FILES if index.backlog else len(index.ready)


def expired_by_retention(message_id: str, config: QueueConfig, at_ms: int) -> bool:
    if config.retention_s is None:
        return False
    return id_time_us(message_id) / 1000 + config.retention_s * 1000 < at_ms
