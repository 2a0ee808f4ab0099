"""The message state machine, in one table: every way a message file moves, and who moves it.

A message is in exactly one state at a time: the state directory its file is in (see
layout.py). Each row of `TRANSITIONS` is one kind of move, performed by exactly one function of
the store (`by`), always as one atomic rename (or, for `RETIRED`, the file's retirement by
`pool.FilePool.retire`: a rename into the recycled-file pool in @free, or an unlink). A move
that loses a race with another process (its source name is gone) simply did not happen.

`tests/test_states.py` keeps this table true: each row's function exists and is the only one
for it, every function of the queue's modules that renames or retires a message file is some
row's, and each row's moves are the ones a real queue makes (source and target directories
watched while every row is exercised). Repair (`fsck`) is not in the table: it moves what
breaks these rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from dirmq.store import layout


class State(Enum):
    # A file being written: in @tmp, an unnamed O_TMPFILE inode, or a recycled file of @free
    # being overwritten. It becomes a message when it is renamed (or linked) into place.
    WRITING = layout.TMP
    READY = layout.READY
    # Ready, behind @ready: a deep queue's newer messages, in buckets (backlog.py).
    BACKLOG = layout.BACKLOG
    LEASED = layout.LEASED
    DELAYED = layout.DELAYED
    DEAD = layout.DEAD
    CORRUPT = layout.CORRUPT  # set aside: never delivered, kept to inspect
    # The @ready of the queue's dead-letter queue: a new message of that queue (count 0).
    DEAD_LETTER_QUEUE = f"<dead-letter queue>/{layout.READY}"
    # Out of the queue: unlinked, or renamed into @free to be overwritten by a later publish.
    RETIRED = layout.FREE


@dataclass(frozen=True, slots=True)
class Transition:
    event: str
    sources: frozenset[State]
    targets: frozenset[State]  # which one: as the row's comment says
    by: str  # the function that performs it: "module.Class.method", module under dirmq.store


def _row(event: str, sources: set[State], targets: set[State], by: str) -> Transition:
    return Transition(event, frozenset(sources), frozenset(targets), by)


TRANSITIONS: tuple[Transition, ...] = (
    # A publish: into @delayed when the message has a delay, else @ready, or the backlog
    # behind a long @ready.
    _row(
        "publish",
        {State.WRITING},
        {State.READY, State.DELAYED, State.BACKLOG},
        "publishing.Publisher._commit",
    ),
    # A publish straight into a waiting consumer's lease (direct_lease.py): no @ready.
    _row(
        "publish_leased",
        {State.WRITING},
        {State.LEASED},
        "direct_lease.DirectLeases._link",
    ),
    # A get that finds @ready short moves the backlog's oldest messages into it.
    _row("refill", {State.BACKLOG}, {State.READY}, "backlog.Backlog._into_ready"),
    # A get in no group that finds @ready empty leases the backlog's oldest from its bucket.
    _row("lease_backlog", {State.BACKLOG}, {State.LEASED}, "files.QueueFiles._lease_from_backlog"),
    # An open that finds @ready too long (an earlier version's root) moves all but its head.
    _row("spill_excess", {State.READY}, {State.BACKLOG}, "files.QueueFiles.spill_excess"),
    # A get or a planned claim leases it (a message past retention is removed instead).
    _row("lease", {State.READY}, {State.LEASED}, "files.QueueFiles._lease"),
    # A claim that could not read what it leased puts it back in its FIFO place.
    _row("hand_back", {State.LEASED}, {State.READY}, "files.QueueFiles.hand_back"),
    _row("due", {State.DELAYED}, {State.READY}, "settling.SettlingFiles._deliver"),
    # A flat entry of @delayed (format 4 and earlier) into the bucket of its due minute.
    _row("migrate_delay", {State.DELAYED}, {State.DELAYED}, "delays.DelayBuckets.migrate"),
    # An expired lease returns to its FIFO place (at its receive limit: dead_letter).
    _row("expire", {State.LEASED}, {State.READY}, "settling.SettlingFiles._requeue_expired"),
    # A heartbeat; also a group message given back with a delay (it keeps its group).
    _row("extend", {State.LEASED}, {State.LEASED}, "settling.SettlingFiles._lease_until"),
    # Given back: to @delayed with a delay, else to its FIFO place in @ready.
    _row("nack", {State.LEASED}, {State.READY, State.DELAYED}, "settling.SettlingFiles._give_back"),
    _row("ack", {State.LEASED}, {State.RETIRED}, "settling.SettlingFiles.ack"),
    # An ack by lease name (planned claims), without the index.
    _row("ack_lease", {State.LEASED}, {State.RETIRED}, "settling.SettlingFiles.retire_leases"),
    # Asked for, or a lease expired or given back at the receive limit: claimed into the
    # queue's own @dead (deadletters.py), then written anew with its provenance: over the
    # claimed file, or into the dead-letter queue when one is set and exists (and the claimed
    # file retired).
    _row("dead_letter", {State.LEASED}, {State.DEAD}, "settling.SettlingFiles.dead_letter"),
    _row(
        "dead_copy",
        {State.WRITING},
        {State.DEAD, State.DEAD_LETTER_QUEUE},
        "settling.SettlingFiles._write_dead_copy",
    ),
    _row(
        "dead_claim_gone", {State.DEAD}, {State.RETIRED}, "settling.SettlingFiles._retire_claimed"
    ),
    # A message that died elsewhere (a pub/sub delivery given up on) stored with its provenance.
    _row("dead_arrival", {State.WRITING}, {State.READY}, "deadletters.put"),
    # Redrive: from @dead, or from a dead-letter queue, back to @ready where it died.
    _row(
        "redrive",
        {State.DEAD, State.DEAD_LETTER_QUEUE},
        {State.READY},
        "redrive.move_planned",
    ),
    # A leased file that does not decode.
    _row("quarantine", {State.LEASED}, {State.CORRUPT}, "settling.SettlingFiles.quarantine"),
    # Delete by id, purge, retention, a dedup race's loser withdrawn.
    _row(
        "remove",
        {State.READY, State.BACKLOG, State.LEASED, State.DELAYED, State.DEAD},
        {State.RETIRED},
        "settling.SettlingFiles.remove",
    ),
)


def moves(state: State) -> dict[str, frozenset[State]]:
    """The events that can move a message in `state`, and the states each can move it to."""
    return {t.event: t.targets for t in TRANSITIONS if state in t.sources}
