"""The message state machine, in one table. Every transition is one atomic rename or unlink.

A message is in exactly one state directory at a time; a transition that loses a race with
another process (the source name is gone) simply did not happen.
"""

from __future__ import annotations

from enum import Enum

from dirmq.store import layout


class State(Enum):
    WRITING = layout.TMP
    READY = layout.READY
    LEASED = layout.LEASED
    DELAYED = layout.DELAYED
    DEAD = layout.DEAD
    GONE = ""


# (from, event) -> to. GONE means the file is unlinked.
TRANSITIONS: dict[tuple[State, str], State] = {
    (State.WRITING, "publish"): State.READY,
    (State.WRITING, "publish_delayed"): State.DELAYED,
    (State.DELAYED, "due"): State.READY,
    (State.READY, "get"): State.LEASED,
    (State.LEASED, "extend"): State.LEASED,
    (State.LEASED, "ack"): State.GONE,
    (State.LEASED, "nack"): State.READY,
    (State.LEASED, "nack_delayed"): State.DELAYED,
    (State.LEASED, "expire"): State.READY,
    (State.LEASED, "max_receives"): State.DEAD,
    (State.LEASED, "dead_letter"): State.DEAD,
    (State.READY, "delete"): State.GONE,
    (State.LEASED, "delete"): State.GONE,
    (State.DELAYED, "delete"): State.GONE,
    (State.READY, "retention"): State.GONE,
    (State.DEAD, "redrive"): State.READY,
    (State.DEAD, "delete"): State.GONE,
}


def next_state(state: State, event: str) -> State:
    """The state after `event`, or ValueError if the table has no such transition."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise ValueError(f"no transition from {state.name} on {event!r}") from None
