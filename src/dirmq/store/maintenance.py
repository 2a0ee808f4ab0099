"""Whole-queue operations: counting (`stats`), emptying (`purge`) and recovery (`sweep`).

These are the only queue operations that may list whole state directories (@dead for stats;
every state directory for purge and sweep): they are for operators and housekeeping, never on a
message's path. A sweep repeats what opening a queue recovers (see view.py) and reports both.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable

from dirmq.errors import QueueNotFound, storage_error
from dirmq.store import backlog, delays, layout, smallfiles
from dirmq.store.bounds import MAX_PRIORITY_LEVELS
from dirmq.store.clock import now_ms
from dirmq.store.files import expired_by_retention
from dirmq.store.ids import id_time_us
from dirmq.store.layout import level_of, parse_entry
from dirmq.store.message import QueueStats, SweepReport
from dirmq.store.poolreclaim import reclaim_pools
from dirmq.store.recycled import DEFAULT_POOL_FILES
from dirmq.store.view import QueueView

ProgressFn = Callable[[int], None]  # called with how many items were just processed
log = logging.getLogger(__name__)


def stats(view: QueueView) -> QueueStats:
    """`Queue.stats`."""
    with view.lock:
        index = view.synced()
        at_ms = now_ms()
        expired = [i for i, n in index.leased.names.items() if _at(n) <= at_ms]
        waiting, due_names = (
            view.files.delay_counts.count(view.path, at_ms)
            if index.delayed.buckets or index.delayed.flat
            else (0, [])
        )
        due = len(due_names)
        oldest = min([*expired, *index.ready], default=None)
        behind, behind_oldest = view.files.backlog.count() if index.backlog else (0, "")
        if oldest is None and behind_oldest:
            oldest = behind_oldest
        age = None if oldest is None else max(0.0, time.time() - id_time_us(oldest) / 1e6)
        try:
            dead = len(os.listdir(view.files.dir[layout.DEAD]))
        except FileNotFoundError:
            dead = 0
        except OSError as exc:
            raise storage_error(exc, f"listing @dead of queue {view.name!r}") from exc
        return QueueStats(
            ready=len(index.ready) + behind + len(expired) + due,
            in_flight=len(index.leased.names) - len(expired),
            delayed=waiting,
            dead=dead,
            oldest_ready_age_s=age,
        )


def ready_by_level(view: QueueView) -> dict[int, int]:
    """`Queue.ready_by_level`: what `stats` counts as ready, by priority level, from the index's
    per-level counts, the backlog's per-bucket counts (kept by mtime, as `stats` keeps them)
    and the names of expired leases and due delays: no message is read."""
    with view.lock:
        index = view.synced()
        counts = {level: index.ready_count(level) for level in range(MAX_PRIORITY_LEVELS)}
        if index.backlog:
            for level, behind in view.files.backlog.count_by_level()[0].items():
                counts[level] = counts.get(level, 0) + behind
        at_ms = now_ms()
        due = (
            view.files.delay_counts.count(view.path, at_ms)[1]
            if index.delayed.buckets or index.delayed.flat
            else []
        )
        for timed in (index.leased.names.values(), due):
            for name in timed:
                if _at(name) <= at_ms:
                    level = level_of(name) if "^" in name else 0
                    counts[level] = counts.get(level, 0) + 1
        levels = view.config.priority_levels
        return {level: n for level, n in sorted(counts.items()) if level < levels or n}


def _at(name: str) -> int:
    entry = parse_entry(name)
    return entry.at_ms if entry and entry.at_ms is not None else 0


def purge(view: QueueView, progress: ProgressFn | None, dead: bool = False) -> int:
    """`Queue.purge`."""
    files = view.files
    removed = 0
    with view.lock:
        index = view.synced()
        directories = (layout.DEAD,) if dead else (layout.READY, layout.LEASED)
        for directory in directories:
            try:
                names = os.listdir(files.dir[directory])
            except FileNotFoundError:
                raise QueueNotFound.missing(view.name) from None
            for name in names:
                entry = parse_entry(name)
                if entry is not None and files.remove(index, directory, name, entry.message_id):
                    removed += 1
                if progress:
                    progress(1)
        if not dead:  # and those behind @ready (backlog.py), and the delays' buckets
            for bucket, name in itertools.chain(backlog.names(view.path), delays.names(view.path)):
                entry = parse_entry(name)
                if entry is not None and files.remove(index, bucket, name, entry.message_id):
                    removed += 1
                if progress:
                    progress(1)
            files.backlog.prune()
            for minute in delays.top(view.path)[0]:
                if delays.remove_empty(view.path, minute):
                    index.delayed.drop_bucket(minute)
    return removed


def sweep(view: QueueView) -> SweepReport:
    """`Queue.sweep`."""
    files = view.files
    with view.lock:
        config = view.config
        index = view.synced()
        index.rescan(view.path)
        at_ms = now_ms()
        promoted = files.promote(index, config, at_ms)
        orphans = files.remove_orphans()
        orphans += smallfiles.remove_stale_temps(view.path)  # of @queue.json writes
        expired = sum(
            files.remove(index, layout.READY, name, message_id)
            for message_id, name in list(index.ready.items())
            if expired_by_retention(message_id, config, at_ms)
        )
        released = files.slots.release_leaked(index)
        pools = reclaim_pools(files.dir[layout.FREE])
        files.pool.trim(keep=DEFAULT_POOL_FILES)
        files.dedup.expire(config.dedup_window_s)
        if files.context.holders is not None:  # the root's: dead processes' holder records
            files.context.holders.sweep()
        on_open, view.recovered_on_open = view.recovered_on_open, SweepReport()
    report = SweepReport(
        orphans_removed=orphans + on_open.orphans_removed,
        leases_requeued=promoted.leases_requeued + on_open.leases_requeued,
        delayed_delivered=promoted.delayed_delivered + on_open.delayed_delivered,
        dead_lettered=promoted.dead_lettered + on_open.dead_lettered,
        expired_removed=expired,
        slots_released=released,
        pools_reclaimed=pools + on_open.pools_reclaimed,
    )
    moved = {k: v for k, v in dataclasses.asdict(report).items() if v}
    if moved:
        log.info("queue %r swept", view.name, extra={"fields": {"queue": view.name, **moved}})
    return report
