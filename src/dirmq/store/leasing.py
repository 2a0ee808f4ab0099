"""Leasing messages (`get`) and settling leases by receipt (ack, nack, extend, dead-letter).

Theory of operation. A get pops the oldest ready message from this process's index and renames
it into @leased under a name that carries its lease deadline and receive count (see files.py):
a heap pop plus one rename whatever the backlog. Due delays and expired leases are promoted
first, by whichever process gets there first. A get that finds nothing sleeps on the watcher,
so another process's publish or requeue wakes it at once, and it also wakes when the earliest
lease or delay it knows of falls due. A receipt names the message and its receive count; the
lease behind it is looked up in the index, and a lease that moved meanwhile (another process
extended it) is looked up again once, after a fresh sync, before the receipt is called stale.
A polling get (shared filesystems) whose every claim found its name gone lists the directories
again at once, once: other hosts' consumers took those messages since the last poll, and others
may be waiting.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

from dirmq.errors import InvalidArgument, QueueNotFound, StaleReceipt, StorageError, storage_error
from dirmq.store import expiry, flow
from dirmq.store.bounds import check_optional_seconds
from dirmq.store.clock import due_ms, now_ms, now_ns
from dirmq.store.config import QueueConfig
from dirmq.store.events import REASON_REJECTED
from dirmq.store.holders import token_of
from dirmq.store.index import GroupRuns, QueueIndex
from dirmq.store.layout import ID_LENGTH, lease_prefix, parse_receipt
from dirmq.store.message import Message
from dirmq.store.settling import SETTLED_DEAD
from dirmq.store.view import QueueView

SETTLE_ACTIONS = ("ack", "nack", "extend", "dead_letter")
SETTLED_ACKED = "acked"
_SETTLE_CHUNK = 64
# A waiting get looks at a non-empty backlog this often (a refill then moves what it holds).
BACKLOG_RECHECK_S = 0.1  # settles of one settle_each applied per lock hold (and per index sync)


def get(
    view: QueueView,
    max_count: int,
    visibility_s: float | None,
    wait_s: float,
    max_per_group: int | None,
    consumer: str | None = None,
) -> list[Message]:
    """`Queue.get`."""
    if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
        raise InvalidArgument(f"max_count must be a positive integer, got {max_count!r}")
    if max_per_group is not None and (
        isinstance(max_per_group, bool) or not isinstance(max_per_group, int) or max_per_group < 1
    ):
        raise InvalidArgument(
            f"max_per_group must be a positive integer or None, got {max_per_group!r}"
        )
    check_optional_seconds("visibility_s", visibility_s)
    check_optional_seconds("wait_s", wait_s)
    files = view.files
    holder = token_of(view.files.context.holders, consumer)
    deadline = time.monotonic() + wait_s
    relisted = False
    while True:
        with view.lock:
            config = flow.current_config(view)
            index = view.synced()
            at_ns = now_ns()  # one reading: what is due now, and this get's lease deadline
            at_ms = at_ns // 1_000_000
            files.promote(index, config, at_ms)
            visibility = config.visibility_timeout_s if visibility_s is None else visibility_s
            deadline_ms = due_ms(at_ns, visibility)
            runs = GroupRuns(max_per_group)
            admitted = flow.admit(view, config, index, max_count, at_ms)
            got = (
                files.claim_many(
                    index,
                    config,
                    at_ms,
                    deadline_ms,
                    runs,
                    admitted.count,
                    holder,
                    view.synced,
                )
                if admitted.count
                else []
            )
            if got and expiry.any_expiring(got):
                claimed = len(got)
                got = _unexpired(view, index, config, got)
                if claimed > len(got) and not got:
                    flow.settle(view, admitted, 0)
                    continue  # only expired ones: look again at once
            flow.settle(view, admitted, len(got))
            if not got and runs.missed and not relisted and view.polling():
                # Polling, every name this get tried was gone: other hosts' consumers took
                # them since the last listing. List again now rather than sleep until the
                # next poll with messages maybe waiting (once per get).
                index.rescan(view.path)
                relisted = True
                continue
            remaining = deadline - time.monotonic()
            if got or remaining <= 0:
                return got
            timeout = min(remaining, _next_due_s(index, at_ms), admitted.hold_s or remaining)
        view.wait(timeout)


def _unexpired(
    view: QueueView, index: QueueIndex, config: QueueConfig, got: list[Message]
) -> list[Message]:
    """`got` without the messages past their time to live (taken out now: expiry.py)."""
    names = index.leased.names
    leased = [(names.get(m.id, ""), m) for m in got]
    return [m for _lease, m in expiry.take_expired(view.files, index, config, leased, now_ms())]


def next_due_s(view: QueueView) -> float | None:
    """`Queue.next_due_s`."""
    with view.lock:
        index = view.synced()
        at_ms = now_ms()
        times = [t[0] for t in (index.leased.earliest(), index.delayed.earliest()) if t]
        due = max(0.0, (min(times) - at_ms) / 1000) if times else None
        hold = flow.hold_s(view.config)  # paused or rate-limited: look again then
        if hold is not None:
            due = hold if due is None else min(due, hold)
        if index.backlog:  # see _next_due_s
            return BACKLOG_RECHECK_S if due is None else min(due, BACKLOG_RECHECK_S)
        return due


def _next_due_s(index: QueueIndex, at_ms: int) -> float:
    """Seconds until the earliest lease or delay in the index falls due (60 if none), or
    until the backlog's next look while it has a bucket: a message published into an existing
    bucket makes no event this process watches (backlog.py watches only its epochs)."""
    times = [t[0] for t in (index.leased.earliest(), index.delayed.earliest()) if t]
    due = max(0.001, (min(times) - at_ms) / 1000) if times else 60.0
    return min(due, BACKLOG_RECHECK_S) if index.backlog else due


def ack_each(view: QueueView, receipts: Iterable[str]) -> dict[str, Exception]:
    """`Queue.ack_each`: `settle_each` of "ack", with the usual case of each chunk in one pass.

    A receipt whose lease the index holds under the receipt's own name (`"<id>.<count>."`
    starts the lease name: no parse) is retired with the others of its chunk in one batch
    (`QueueFiles.ack_many`); any other receipt (malformed, unknown to the index, or whose
    lease vanished meanwhile) takes `settle`'s way, which says exactly what is wrong with it."""
    failures: dict[str, Exception] = {}
    pending = list(receipts)
    files = view.files
    id_length = ID_LENGTH
    # Blanked at the end, outside the lock, on this thread, not by a woken one.
    with files.pool.reaping_here():
        for start in range(0, len(pending), _SETTLE_CHUNK):
            with view.lock:
                index = view.synced()
                config = view.config  # a deleted queue: QueueNotFound, raised, not a failure
                names = index.leased.names
                leases: dict[str, str] = {}  # lease name -> its receipt
                others: list[str] = []
                for receipt in pending[start : start + _SETTLE_CHUNK]:
                    lease = names.get(receipt[:id_length]) if type(receipt) is str else None
                    if (
                        lease is not None
                        and len(receipt) > id_length
                        and lease.startswith(receipt)
                        and lease.startswith(".", len(receipt))
                    ):
                        leases[lease] = receipt
                    else:
                        others.append(receipt)
                for lease, exc in files.ack(index, list(leases)).items():
                    if isinstance(exc, FileNotFoundError):
                        others.append(leases[lease])  # moved meanwhile: looked up again
                    else:
                        failures[leases[lease]] = storage_error(exc, f"ack on queue {view.name!r}")
                for receipt in others:
                    try:
                        settle(view, receipt, "ack", index_fresh=True, config=config)
                    except (StaleReceipt, InvalidArgument, StorageError) as exc:
                        failures[receipt] = exc
    return failures


def extend_each(
    view: QueueView, receipts: Iterable[str], visibility_s: float
) -> dict[str, Exception]:
    """`Queue.extend_each`: `settle_each` of "extend" (`visibility_s` checked once)."""
    check_optional_seconds("visibility_s", visibility_s)
    return settle_each(view, receipts, "extend", visibility_s)


def settle_each(
    view: QueueView,
    receipts: Iterable[str],
    action: str,
    delay_s: float = 0.0,
    dead_lettered: list[str] | None = None,
) -> dict[str, Exception]:
    """Apply `action` to the lease behind each receipt; the failures by receipt (StaleReceipt,
    InvalidArgument, StorageError), and the receipts whose message was dead-lettered appended
    to `dead_lettered` (a nack past the queue's max receives). One lock hold, one index sync
    and one look at the configuration per chunk of `_SETTLE_CHUNK`, not per receipt: our own
    settles update the index as they go, and a lease that changed elsewhere meanwhile is
    looked up again after a fresh sync before it is called stale."""
    failures: dict[str, Exception] = {}
    pending = list(receipts)
    # Acks: blanked at the end, outside the lock, on this thread, not by a woken one.
    with view.files.pool.reaping_here() if action == "ack" else contextlib.nullcontext():
        for start in range(0, len(pending), _SETTLE_CHUNK):
            with view.lock:
                view.synced()
                config = view.config  # a deleted queue: QueueNotFound, raised, not a failure
                for receipt in pending[start : start + _SETTLE_CHUNK]:
                    try:
                        outcome = settle(
                            view, receipt, action, delay_s, index_fresh=True, config=config
                        )
                    except (StaleReceipt, InvalidArgument, StorageError) as exc:
                        failures[receipt] = exc
                    else:
                        if outcome == SETTLED_DEAD and dead_lettered is not None:
                            dead_lettered.append(receipt)
    return failures


def settle(
    view: QueueView,
    receipt: str,
    action: str,
    delay_s: float = 0.0,
    index_fresh: bool = False,
    config: QueueConfig | None = None,
    reason: str = REASON_REJECTED,
    detail: str | None = None,
) -> str:
    """Apply `action` (one of `SETTLE_ACTIONS`) to the lease behind `receipt`, retrying once if
    it moved meanwhile (another process extended it between our lookup and our rename); what
    became of it (`settling.SETTLED_*`). `index_fresh`: the caller synced the index under the
    lock it holds, so the first lookup may skip that; `config`: the caller read the
    configuration under that lock too. `reason`, `detail`: a dead_letter's verdict."""
    assert action in SETTLE_ACTIONS
    sync = not index_fresh
    try:
        for _attempt in range(3 if index_fresh else 2):
            with view.lock:
                try:
                    lease = _lease_name(view, receipt, sync)
                except StaleReceipt:
                    if sync:
                        raise
                    sync = True  # unknown to our index as it was: look again, up to date
                    continue
                index = view.index
                assert index is not None  # synced by us or by the caller
                if config is None:
                    config = view.config  # read for an ack too: it notices a deleted queue
                try:
                    if action == "ack":
                        failure = view.files.ack(index, [lease]).get(lease)
                        if failure is not None:
                            raise failure
                        return SETTLED_ACKED
                    return view.files.settle(index, config, action, lease, delay_s, reason, detail)
                except FileNotFoundError:
                    sync = True
                    continue
        raise StaleReceipt(f"receipt {receipt} of queue {view.name!r} is stale")
    except OSError as exc:
        if isinstance(exc, StaleReceipt | QueueNotFound):
            raise
        raise storage_error(exc, f"{action} on queue {view.name!r}") from exc


def _lease_name(view: QueueView, receipt: str, sync: bool = True) -> str:
    """The leased file name of the live lease behind `receipt`, or StaleReceipt. `sync`
    False: trust the index as it is (the caller synced it under the lock it holds)."""
    parsed = parse_receipt(receipt)
    if parsed is None:
        raise InvalidArgument(f"not a dirmq receipt: {str(receipt)[:80]!r}")
    message_id, count = parsed
    index = view.synced() if sync or view.index is None else view.index
    name = index.leased.names.get(message_id)
    if name is None and view.polling():
        # Polling mode: another host's extend may not have been seen yet.
        index.rescan_leased(view.path)
        name = index.leased.names.get(message_id)
    if name is None or not name.startswith(lease_prefix(message_id, count)):
        raise StaleReceipt(
            f"receipt {receipt} of queue {view.name!r} is stale: the lease expired and the "
            "message was delivered again, or it was already acknowledged"
        )
    return name
