"""Redrive: dead messages back to where they died, or to a queue named, each by one rename.

A queue's dead messages are
- its own dead area, @dead: the messages that died in it while it named no dead-letter queue;
- when it is a dead-letter queue, those of its ready messages that died in another queue (their
  `Dirmq-Dead-Source`, deadletters.py, names another queue).

Each goes to the @ready of its destination (the queue itself for its own dead area, its source
for a dead letter, or the queue `to` names) under its id with receive count 0: one `rename`, so
at every instant, whatever crashes, the message is in exactly one place; nothing is copied, so
nothing needs deduplicating. It keeps its id (and so its FIFO place), body, headers and group,
and the provenance of its death: on a live message, `X-Dead-*` says it was once dead-lettered.

A redrive is planned once (`plan`: the dead messages' names, oldest first, up to the newest
there when it began) and moved in chunks (`move_planned`), so that a redrive task
(dirmq.redrive) can pace itself, be cancelled between chunks and resume after a crash from the
last id it recorded.
A message that dies again during its redrive is not redriven twice by that task: its id is
behind the task's cursor. A destination's capacity is not waited for: a redriven message, like a
dead-lettered one, takes no capacity token (docs/FORMAT.md, "Dead letters").
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Collection
from dataclasses import dataclass, field

from dirmq.errors import InvalidArgument, QueueNotFound, storage_error
from dirmq.store import backlog, layout
from dirmq.store.events import DEAD_REASONS
from dirmq.store.ids import is_id
from dirmq.store.view import QueueView

# The states a redrive takes messages from: the dead area, and a dead-letter queue's @ready.
_STATES = (layout.DEAD, layout.READY)


@dataclass(frozen=True, slots=True)
class Planned:
    """One message a redrive will try to move: where it is now."""

    message_id: str
    directory: str  # layout.DEAD, layout.READY or a backlog bucket
    name: str


@dataclass(slots=True)
class Moved:
    """What one `move_planned` did: how many it moved (to which queues), and the ids it had to leave
    where they are, with why (the destination does not exist, the message has no known
    source). Messages that are not dead here, or not of the reason asked, are neither."""

    moved: int = 0
    by_destination: dict[str, int] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)


def check_filter(ids: Collection[str] | None, reason: str | None) -> None:
    if reason is not None and reason not in DEAD_REASONS:
        raise InvalidArgument(f"reason must be one of {', '.join(DEAD_REASONS)}, got {reason!r}")
    for message_id in ids or ():
        if not isinstance(message_id, str) or not is_id(message_id):
            raise InvalidArgument(f"not a dirmq message id: {str(message_id)[:80]!r}")


def plan(
    view: QueueView,
    ids: Collection[str] | None,
    after: str | None = None,
    until: str | None = None,
) -> list[Planned]:
    """The messages a redrive of this queue may move, oldest first: those of its dead area and
    of its @ready (a ready one is moved only if `move_planned` finds it died elsewhere), only
    `ids` if given, after `after` and up to `until` (message ids) if given. One listing of @dead (it
    is not indexed) and a look at the index: a redrive is an operator's act, never a get's."""
    wanted = None if ids is None else frozenset(ids)
    found: list[Planned] = []
    with view.lock:
        index = view.synced()
        ready = list(index.ready.items())
        try:
            dead_names = os.listdir(view.files.dir[layout.DEAD])
        except FileNotFoundError:
            dead_names = []
        except OSError as exc:
            raise storage_error(exc, f"listing @dead of queue {view.name!r}") from exc
    for message_id, name in ready:
        found.append(Planned(message_id, layout.READY, name))
    for bucket, name in backlog.names(view.path):  # a deep dead-letter queue's newer ones
        found.append(Planned(name[: layout.ID_LENGTH], bucket, name))
    for name in dead_names:
        entry = layout.parse_entry(name)
        if entry is not None:
            found.append(Planned(entry.message_id, layout.DEAD, name))
    found.sort(key=lambda p: p.message_id)
    if after is not None:
        found = found[bisect.bisect_right([p.message_id for p in found], after) :]
    return [
        p
        for p in found
        if (wanted is None or p.message_id in wanted) and (until is None or p.message_id <= until)
    ]


def move_planned(
    view: QueueView,
    planned: list[Planned],
    reason: str | None,
    to: str | None,
    sole_source: str | None = None,
    plain_dead: bool = False,
) -> Moved:
    """Move each of `planned` that is dead here (and of `reason`, if given) to `to`, or back to
    where it died. A ready message without provenance is dead here only if `plain_dead` (this
    queue is some queue's dead-letter queue: a dead letter stored before dirmq kept
    provenance, or put there by hand); it goes to `to`, or to `sole_source` (the one queue
    naming this one its dead-letter queue), else it is left, with why."""
    files = view.files
    ready_dir_of = files.context.dead_letter_dir  # a queue's @ready, None if it does not exist
    result = Moved()
    for item in planned:
        destination = to
        ready = item.directory == layout.READY or backlog.is_bucket_dir(item.directory)
        if ready or reason is not None:
            message = files.read(item.directory, item.name)
            if message is None:
                continue  # gone meanwhile (a consumer of the DLQ took it), or corrupt: left
            dead = message.dead
            if ready:
                if dead is None and not plain_dead:
                    continue  # a live message
                source = dead.source if dead is not None else sole_source
                if dead is not None and dead.source == view.name:
                    continue  # redriven here earlier: live, not dead
                if source is None:
                    if to is None:
                        result.left[item.message_id] = "no source known: name a queue (to)"
                    continue
                destination = destination or source
            if reason is not None and (dead is None or dead.reason != reason):
                continue
        destination = destination or view.name
        if destination == view.name and ready:
            continue  # already there
        target_dir = ready_dir_of(destination)
        if target_dir is None:
            if to is not None:  # the queue asked for is gone: nothing more can move
                raise QueueNotFound(f"queue {to!r} (where the redrive goes) does not exist")
            result.left[item.message_id] = f"queue {destination!r} does not exist"
            continue
        entry = layout.parse_entry(item.name)
        assert entry is not None
        target = os.path.join(
            target_dir, layout.ready_name(entry.message_id, 0, entry.group, entry.level)
        )
        with view.lock:
            try:
                os.rename(files.path(item.directory, item.name), target)
            except FileNotFoundError:
                continue  # taken meanwhile (a DLQ consumer, a purge, another redrive)
            except OSError as exc:
                raise storage_error(exc, f"redriving a message of queue {view.name!r}") from exc
            if view.index is not None:
                view.index.discard(item.directory, item.name)
        result.moved += 1
        result.by_destination[destination] = result.by_destination.get(destination, 0) + 1
    if result.moved and files.context.events.redriven is not None:
        files.context.events.redriven(view.name, result.moved)
    return result
