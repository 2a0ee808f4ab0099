"""Planned claims: cooperating consumers that lease the messages a planner names for them.

Theory of operation. A `get` pops the head of this process's index, so consumers that share a
queue race for the same head and each must follow every other's renames. The Spark source
works differently: one planner lists @ready once per batch (`ready_names`) and hands each
consumer its own names; a consumer leases exactly those (`claim_named`, or `lease_named` first
and `read_leases` later, one at a time), finds them again by id wherever they moved
(`read_ids`), and acknowledges them by lease name (`ack_leases`). None of this opens or drains
the consumer's index: every step works from listings and names, so cooperating consumers pay
nothing for each other's renames. A group's messages are never planned this way (their order
needs `get`).
"""

from __future__ import annotations

import heapq
import os
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import replace

from dirmq.errors import InvalidArgument, QueueNotFound, storage_error
from dirmq.store import backlog, expiry, flow, layout
from dirmq.store.bounds import check_optional_seconds
from dirmq.store.clock import due_ms, now_ms, now_ns
from dirmq.store.config import QueueConfig
from dirmq.store.holders import token_of
from dirmq.store.index import QueueIndex
from dirmq.store.layout import Entry, parse_entry
from dirmq.store.message import Message
from dirmq.store.view import QueueView

# Ready names a planner without a limit is given at most, beyond what @ready holds: the rest of
# a deep queue stays in the backlog (backlog.py), so that @ready stays short for every process.
PLAN_AHEAD = 10 * backlog.REFILL_CHUNK
READ_CHUNK = 256  # `read_leases`: lease files opened before moved ones are looked for


def ready_names(view: QueueView, limit: int | None, promote: bool, groups: bool) -> list[str]:
    """`Queue.ready_names`. Read from the directories, not from the index: a planner that lists
    once per batch does not pay for following every claim and ack of the consumers it plans
    for."""
    try:
        with view.lock:
            config = flow.current_config(view)
            if config.paused:
                return []  # a paused queue plans nothing (flow.py)
            if promote:
                _promote_listed(view, config, now_ms())
            names = os.listdir(view.files.dir[layout.READY])
            # A deep queue's newer messages wait in the backlog: as many as asked come forward
            # (without a limit, a planner's round: PLAN_AHEAD), without opening the index.
            want = PLAN_AHEAD if limit is None else limit
            if len(names) < want and backlog.occupied(view.path):
                view.files.backlog.refill(want - len(names))
                names = os.listdir(view.files.dir[layout.READY])
            if _refill_levels(view, names, want):
                names = os.listdir(view.files.dir[layout.READY])
    except FileNotFoundError:
        raise QueueNotFound.missing(view.name) from None
    except OSError as exc:
        raise storage_error(exc, f"listing queue {view.name!r}") from exc
    # ids are fixed-width: names sort in id order; the highest priority level first
    key = _priority_order if any("^" in n for n in names) else None
    oldest = sorted(names, key=key) if limit is None else heapq.nsmallest(limit, names, key=key)
    planned = []
    for name in oldest:
        entry = parse_entry(name)
        if entry is None or entry.at_ms is not None:
            continue
        if entry.group is not None and not groups:
            break
        planned.append(name)
    return planned


def _refill_levels(view: QueueView, names: list[str], want: int) -> int:
    """Refill each priority level above 0 that has a tree (FORMAT.md "Priorities") up to
    `want` in @ready by its own count in `names`: how many moved."""
    trees = backlog.levels(view.path)[:-1]
    if not trees:
        return 0
    counts = Counter(layout.level_of(n) for n in names if "^" in n)
    return sum(
        len(view.files.backlog.refill(want - counts[level], level))
        for level in trees
        if counts[level] < want
    )


def _priority_order(name: str) -> tuple[int, str]:
    return (-layout.level_of(name), name)


def _promote_listed(view: QueueView, config: QueueConfig, at_ms: int) -> None:
    """`promote` from listings of @leased and @delayed (its buckets: those begun are listed
    by `promote`) instead of the index."""
    files = view.files
    listed = QueueIndex()
    for name in os.listdir(files.dir[layout.LEASED]):
        entry = parse_entry(name)
        if entry is not None and entry.at_ms is not None and entry.at_ms <= at_ms:
            listed.add(layout.LEASED, name)
    for name in os.listdir(files.dir[layout.DELAYED]):
        listed.add(layout.DELAYED, name)
    if not listed.leased.names and not listed.due_by(at_ms):
        return
    if files.slots.any_held():  # a dead-lettered message must free its token
        listed.slots.update(os.listdir(files.dir[layout.SLOTS]))
    files.promote(listed, config, at_ms)


def claim_named(
    view: QueueView,
    names: list[str],
    visibility_s: float | None,
    drain: int | None = None,
    consumer: str | None = None,
) -> list[tuple[str, Message]]:
    """`Queue.claim_named`."""
    taken, deadline_ms = _take_named(view, names, visibility_s, drain, consumer)
    leased: list[tuple[str, Message]] = []
    for i, (lease, _name, entry) in enumerate(taken):
        count = entry.count + 1
        try:
            message = view.files.open_claimed(lease, entry.message_id, count, deadline_ms)
        except OSError as exc:
            _hand_back(view, taken[i:])
            if leased:  # what is read already goes to the caller, as a get's does
                break
            raise storage_error(exc, f"reading a message of queue {view.name!r}") from exc
        if message is not None:
            leased.append((lease, message))
    if expiry.any_expiring([m for _lease, m in leased]):
        with view.lock:  # past their time to live: taken out, not delivered (expiry.py)
            index = view.index if view.index is not None else QueueIndex()
            leased = expiry.take_expired(view.files, index, view.config, leased, now_ms())
    return leased


def _hand_back(view: QueueView, taken: list[tuple[str, str, Entry]]) -> None:
    """Rename leases nobody will be given back to @ready, each in its FIFO place (one whose
    rename fails too stays leased and expires like any other)."""
    with view.lock:
        for lease, name, _entry in taken:
            view.files.hand_back(view.index, lease, name)


def lease_named(
    view: QueueView,
    names: list[str],
    visibility_s: float | None,
    drain: int | None = None,
    consumer: str | None = None,
) -> list[str]:
    """`Queue.lease_named`."""
    taken, _deadline_ms = _take_named(view, names, visibility_s, drain, consumer)
    return [lease for lease, _name, _entry in taken]


def _take_named(
    view: QueueView,
    names: list[str],
    visibility_s: float | None,
    drain: int | None,
    consumer: str | None,
) -> tuple[list[tuple[str, str, Entry]], int]:
    """Rename the named ready files into @leased: (lease name, ready name, parsed ready name)
    of each one taken, and their lease deadline."""
    check_optional_seconds("visibility_s", visibility_s)
    if drain is not None and (isinstance(drain, bool) or not isinstance(drain, int) or drain < 0):
        raise InvalidArgument(f"drain must be a whole number >= 0, not {drain!r}")
    entries = _ready_entries(names)
    holder = token_of(view.files.context.holders, consumer)
    # A drain keeps what it frees (pool.py): as many files as this consumer's whole share,
    # which a caller passing its names in chunks tells in `drain` (a chunk alone is ~1000).
    view.files.pool.note_depth(max(len(entries), drain or 0))
    try:
        with view.lock:
            config = flow.current_config(view)
            visibility = config.visibility_timeout_s if visibility_s is None else visibility_s
            at_ns = now_ns()
            at_ms, deadline_ms = at_ns // 1_000_000, due_ms(at_ns, visibility)
            # Paused: none; under a rate limit, as many as this second's slots allow (flow.py).
            admitted = flow.admit_named(view, config, len(entries), at_ms)
            allowed = entries[: admitted.count]
            taken = view.files.take_named(view.index, config, allowed, at_ms, deadline_ms, holder)
            flow.settle(view, admitted, len(taken))
    except OSError as exc:
        raise storage_error(exc, f"leasing messages of queue {view.name!r}") from exc
    if allowed and not taken:
        view.reload_config()  # every name gone: QueueNotFound if the queue is
    return taken, deadline_ms


def _ready_entries(names: list[str]) -> list[tuple[str, Entry]]:
    """`names` parsed, all of them ready messages outside groups (else InvalidArgument)."""
    entries = []
    for name in names:
        entry = parse_entry(name)
        if entry is None or entry.at_ms is not None or entry.group is not None:
            raise InvalidArgument(f"not the name of a ready message outside groups: {name!r}")
        entries.append((name, entry))
    return entries


def read_leases(view: QueueView, leases: Iterable[str]) -> Iterator[Message]:
    """`Queue.read_leases`."""
    chunk: list[tuple[str, Entry, int]] = []
    for lease in leases:
        entry = parse_entry(lease)
        if entry is None or entry.at_ms is None:
            raise InvalidArgument(f"not a lease name: {str(lease)[:80]!r}")
        chunk.append((lease, entry, entry.at_ms))
        if len(chunk) == READ_CHUNK:
            yield from _read_lease_chunk(view, chunk)
            chunk = []
    yield from _read_lease_chunk(view, chunk)


def _read_lease_chunk(view: QueueView, chunk: list[tuple[str, Entry, int]]) -> Iterator[Message]:
    moved: dict[str, Entry] = {}
    for lease, entry, deadline_ms in chunk:
        try:
            message = view.files.open_lease(lease, entry.message_id, entry.count, deadline_ms)
        except FileNotFoundError:
            moved[entry.message_id] = entry
            continue
        except OSError as exc:
            raise storage_error(exc, f"reading a message of queue {view.name!r}") from exc
        if message is not None and expiry.any_expiring([message]):
            message = _unexpired(view, lease, message)
        if message is not None:  # None: damaged, set aside (or past its time to live)
            yield message
    for found in read_ids(view, moved):
        entry = moved[found.id]
        if found.state == "leased" and found.receive_count == entry.count:
            found = replace(found, receipt=entry.receipt)  # noqa: PLW2901 (still our lease)
        yield found


def _unexpired(view: QueueView, lease: str, message: Message) -> Message | None:
    """`message` (read under `lease`), or None if it was past its time to live (taken out)."""
    with view.lock:
        index = view.index if view.index is not None else QueueIndex()
        kept = expiry.take_expired(view.files, index, view.config, [(lease, message)], now_ms())
    return kept[0][1] if kept else None


def read_ids(view: QueueView, message_ids: Collection[str]) -> Iterator[Message]:
    """`Queue.read_ids`."""
    files = view.files
    wanted = set(message_ids)
    for _attempt in range(3):
        if not wanted:
            return
        located = files.locate_listed(wanted)
        for message_id, (directory, name) in located.items():
            message = files.read(directory, name)
            if message is not None:
                wanted.discard(message_id)
                yield message
            elif not os.path.lexists(files.path(directory, name)):
                continue  # it moved on: the next listing finds it
            else:
                wanted.discard(message_id)  # damaged: never delivered
        wanted.intersection_update(located)  # the ones never listed are gone


def ack_leases(view: QueueView, leases: Iterable[str]) -> list[str]:
    """`Queue.ack_leases`. The queue's lock is not held for the renames and unlinks, so several
    threads acknowledging in parallel overlap them."""
    entries = []
    for lease in dict.fromkeys(leases):  # a name given twice is acknowledged once
        entry = parse_entry(lease)
        if entry is None or entry.at_ms is None:
            raise InvalidArgument(f"not a lease name: {str(lease)[:80]!r}")
        entries.append((lease, entry.message_id))
    files = view.files
    # A drain keeps what it frees (pool.py): a batch this large frees as many files, whichever
    # process leased them (Spark settles a batch's records in the next batch's tasks).
    files.pool.note_depth(len(entries))
    names = [lease for lease, _message_id in entries]
    with files.pool.reaping_here():  # blanked at the end, on this thread (leasing.settle_each)
        try:
            failures = files.retire_leases(names, files.slots.any_held())
        except OSError as exc:
            raise storage_error(exc, f"ack on queue {view.name!r}") from exc
        with view.lock:
            if view.index is not None:
                for lease, message_id in entries:
                    if lease not in failures:
                        view.index.leased.discard(message_id, lease)
    missing = [lease for lease in names if isinstance(failures.get(lease), FileNotFoundError)]
    for lease in names:
        failure = failures.get(lease)
        if failure is not None and not isinstance(failure, FileNotFoundError):
            raise storage_error(failure, f"ack on queue {view.name!r}") from failure
    return missing
