"""What becomes of a message once it is leased or due: the transitions out of a lease
(settle, ack, expiry, dead-lettering), delayed messages falling due, removal for good,
quarantine, and the rename primitives every transition uses (`move`, `_rename`).

Each transition method performs one row of the state table in `states.py` (files.py says how).

Why it is long: every way out of @leased and @delayed is here, beside the rename primitives they
share; the delays' part grew with their buckets (format 5: past buckets emptied, flat entries
migrated). It is the next to split: the delays falling due could stand alone.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from dirmq.errors import CorruptMessage, storage_error
from dirmq.store import deadletters, delays, layout
from dirmq.store.capacity import read_slot
from dirmq.store.clock import due_after_ms
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.events import REASON_MAX_RECEIVES, REASON_REJECTED
from dirmq.store.filebase import QueueFileBase
from dirmq.store.index import QueueIndex
from dirmq.store.layout import Entry, parse_entry
from dirmq.store.message import DeadLetter, SweepReport
from dirmq.store.reading import read_message

# The logger operators filter by (docs/operations.md), named before this module was split from
# files.py: kept, so their filters still match.
log = logging.getLogger("dirmq.store.files")
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# What a settle did with a lease (`QueueFiles.settle`; `Queue.nack` returns it).
SETTLED_EXTENDED = "extended"
SETTLED_RETURNED = "returned"  # ready again, in its FIFO place
SETTLED_DELAYED = "delayed"  # ready again after the delay given
SETTLED_DEAD = "dead-lettered"  # past the queue's max receives, or a consumer's verdict


class SettlingFiles(QueueFileBase):
    """The transitions out of a lease and of @delayed, and the primitives (files.py: claims)."""

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
        """Move the delayed messages due by `at_ms` into @ready; how many moved. Flat entries
        (an earlier format's) go into their buckets first; a bucket whose minute has begun is
        loaded (delays.py), and one whose minute is over is emptied and removed."""
        delayed = index.delayed
        if delayed.flat:
            self.migrate_delays(index)
        begun = delayed.begun(at_ms)
        past = [m for m in begun if (m + 1) * delays.BUCKET_MS <= at_ms]
        for minute in begun:
            if minute not in delayed.loaded and minute not in past:
                delayed.load(self.queue_dir, minute)
        delivered = 0
        due = delayed.pop_due(at_ms)
        for i, name in enumerate(due):
            try:
                delivered += self._deliver(index, delays.relative_dir(name), name)
            except OSError:
                _keep_due(index, due[i:])
                raise
        for minute in past:
            delivered += self._empty_past(index, minute, at_ms)
        return delivered

    def _deliver(self, index: QueueIndex, directory: str, name: str) -> int:
        """One due delay into @ready (`directory`: its bucket); 1 if it moved, 0 if another
        process got there first."""
        entry = parse_entry(name)
        assert entry is not None
        target = layout.ready_name(entry.message_id, entry.count, entry.group, entry.level)
        if not self.move(directory, name, layout.READY, target):
            return 0
        index.add(layout.READY, target)
        return 1

    def _empty_past(self, index: QueueIndex, minute: int, at_ms: int) -> int:
        """Deliver what is left in a bucket whose minute is over (all of it is due), then
        remove it; how many moved. One that cannot be removed though nothing in it moved (a
        stray file, or a name of a later minute: `dirmq fsck --repair` moves it) is not looked
        at again, rather than at every get, until the earliest delay left in it falls due;
        it is watched meanwhile, so that a late writer's delay into it is delivered."""
        delivered = 0
        directory = delays.bucket_dir(minute)
        for attempt in range(3):
            moved = 0
            later: int | None = None  # the earliest due time of a delay left (misnamed)
            for name in delays.bucket_names(self.queue_dir, minute):
                due = delays.due_of(name)
                if due is not None and due <= at_ms:
                    moved += self._deliver(index, directory, name)
                    index.delayed.discard(name[: layout.ID_LENGTH], name)
                elif due is not None and (later is None or due < later):
                    later = due
            delivered += moved
            if delays.remove_empty(self.queue_dir, minute):
                index.delayed.drop_bucket(minute)
                break
            # Not empty: a late writer's rename (its minute ran out under it) came after the
            # listing, and the next listing moves it; listed twice with nothing to move, stuck
            # until the earliest delay left in it falls due, and watched (loaded): a writer
            # later still is heard of, and its delay delivered, without a listing each get.
            if not moved and attempt:
                index.delayed.stuck[minute] = later
                if minute not in index.delayed.loaded:
                    index.delayed.load(self.queue_dir, minute)
                break
        return delivered

    def migrate_delays(self, index: QueueIndex) -> int:
        """Move the flat entries of @delayed the index knows into their buckets (delays.py:
        what a root of format 4 holds); how many moved."""
        flat = sorted(index.delayed.flat)
        index.delayed.flat.clear()
        try:
            moved = self.delay_buckets.migrate(flat, durable=True)
        except BaseException:
            # Kept for the next try, as `_keep_due` keeps due names (one moved already is
            # skipped then): forgotten, it would wait for a rescan.
            index.delayed.flat.update(flat)
            raise
        for name in moved:
            index.add(delays.relative_dir(name), name)
        if moved:
            log.info(
                "queue %r: %d delayed messages moved into due-time buckets",
                self.name,
                len(moved),
                extra={"fields": {"queue": self.name, "migrated": len(moved)}},
            )
        return len(moved)

    def _move_delayed(self, path: str, name: str, due_ms: int, durable: bool) -> None:
        """Rename the file at `path` to `name` in the bucket of `due_ms`, made if missing (and
        made again if a consumer removes it before the rename)."""
        bucket = self.delay_buckets.prepare(due_ms, durable)
        try:
            self._rename(path, f"{bucket}/{name}")
        except FileNotFoundError:
            if not os.path.isdir(bucket):
                bucket = self.delay_buckets.remake(due_ms, durable)
                self._rename(path, f"{bucket}/{name}")
            else:
                raise

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
                for each in expired[i:]:
                    index.add(layout.LEASED, each)
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
        self._give_back(
            index, path, lease, entry, delay_s, config.durability is not Durability.MEMORY
        )
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
        self,
        index: QueueIndex,
        path: str,
        lease: str,
        entry: Entry,
        delay_s: float,
        durable: bool = True,
    ) -> None:
        """Return the lease at `path` to @ready (its FIFO place), or to the bucket of its due
        time in @delayed until `delay_s` from now."""
        message_id, count = entry.message_id, entry.count
        if delay_s > 0:
            due_ms = due_after_ms(delay_s)
            new = layout.timed_name(message_id, count, due_ms, entry.group, None, entry.level)
            self._move_delayed(path, new, due_ms, durable)
            directory = delays.bucket_dir(delays.minute_of(due_ms))
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
        due_ms = due_after_ms(seconds)
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


_NOTHING_PROMOTED = SweepReport()


def _keep_due(index: QueueIndex, names: list[str]) -> None:
    """Delayed names `pop_due` took out of the index whose move failed: they are still where
    they were, so the index keeps them (and the next get or sweep tries again)."""
    for name in names:
        index.add(delays.relative_dir(name), name)
