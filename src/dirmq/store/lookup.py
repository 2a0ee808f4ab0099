"""Messages by id, and those of one state in order, without leasing them: peek, browse,
delete.

A message is found through this process's index (in polling mode, where the index may lag
behind another host, a miss rescans first), and in @dead by a listing of @dead: dead letters
are not indexed, and a lookup by id that misses is rare. A message may move between the lookup
and the read or removal: each is tried again on what a fresh lookup finds.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Iterable, Iterator

from dirmq.errors import InvalidArgument, MessageNotFound
from dirmq.store import backlog, delays, layout
from dirmq.store.ids import is_id
from dirmq.store.message import Message
from dirmq.store.view import QueueView


def delete(view: QueueView, message_id: str) -> bool:
    """`Queue.delete`."""
    _check_id(message_id)
    with view.lock:
        for _attempt in range(2):
            found = _locate(view, message_id)
            if found is None:
                return False
            if view.files.remove(view.index, found[0], found[1], message_id):
                return True
    return False


def peek(view: QueueView, message_id: str) -> Message:
    """`Queue.peek`."""
    _check_id(message_id)
    with view.lock:
        for _attempt in range(3):
            found = _locate(view, message_id)
            if found is None:
                break
            message = view.files.read(*found, corrupt_ok=False)
            if message is not None:
                return message
    raise MessageNotFound(f"no message {message_id} in queue {view.name!r}")


BROWSE_STATES = ("ready", "leased", "delayed", "dead")


def browse(
    view: QueueView, limit: int | None, after: str | None = None, state: str = "ready"
) -> Iterator[Message]:
    """`Queue.browse`."""
    if after is not None:
        _check_id(after)
    if state not in BROWSE_STATES:
        raise InvalidArgument(f"state must be one of {', '.join(BROWSE_STATES)}, got {state!r}")
    directory = f"@{state}"
    with view.lock:
        places_by_id: dict[str, tuple[str, str]] | None = None
        if state == "dead":  # not indexed: one listing (an operator's look, never a get's)
            listed = ((layout.parse_entry(n), n) for n in view.files.dead_names(""))
            by_id = {e.message_id: n for e, n in listed if e is not None}
        elif state == "delayed":  # indexed only from their minute on: every bucket listed
            places_by_id = {}
            for relative, name in delays.names(view.path):
                places_by_id.setdefault(name[: layout.ID_LENGTH], (relative, name))
            by_id = {i: place[1] for i, place in places_by_id.items()}
        else:
            index = view.synced()
            by_id = index.ready if state == "ready" else index.leased.names
        ids = sorted(by_id)
        if after is not None:  # a page: the messages after that id
            ids = ids[bisect.bisect_right(ids, after) :]
        names = [by_id[i] for i in ids]
    places: Iterable[tuple[str, str]] = (
        ((directory, name) for name in names)
        if places_by_id is None
        else (places_by_id[i] for i in ids)
    )
    if state == "ready" and len(backlog.levels(view.path)) > 1:
        # Priority levels' trees (FORMAT.md "Priorities"): a level's backlog is newer than its
        # own messages in @ready only, so the two merge in id order.
        behind = backlog.names_after(view.path, after)
        places = heapq.merge(places, behind, key=lambda place: place[1][: layout.ID_LENGTH])
    elif state == "ready":  # then those behind @ready, newer than all of it (backlog.py)
        last = ids[-1] if ids else after
        places = itertools.chain(places, backlog.names_after(view.path, last))
    yielded = 0
    for place in places:
        if limit is not None and yielded >= limit:
            return
        message = view.files.read(*place)
        if message is not None:
            yielded += 1
            yield message


def _locate(view: QueueView, message_id: str) -> tuple[str, str] | None:
    index = view.synced()
    found = index.locate(message_id)
    if found is None and view.polling():
        # Polling mode: another host may have published it since our last poll.
        index.rescan(view.path)
        found = index.locate(message_id)
    if found is None and (dead := view.files.dead_names(message_id)):
        return layout.DEAD, dead[0]
    if found is None and index.backlog:  # behind @ready: the bucket its id names
        found = backlog.find(view.path, {message_id}).get(message_id)
    # A delay not indexed: of a minute not begun, or flat (of version 4) and not moved yet.
    if found is None and (index.delayed.buckets or index.delayed.flat):
        found = delays.find(view.path, {message_id}).get(message_id)
    return found


def _check_id(message_id: str) -> None:
    if not is_id(message_id):
        raise InvalidArgument(f"not a dirmq message id: {str(message_id)[:80]!r}")
