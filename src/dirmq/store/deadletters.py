"""Dead letters that say why: provenance kept in the message's file, and the one write that
puts it there.

A message is one immutable file, so a dead-lettered message is written anew: same id, body,
headers and group, plus `Dirmq-Dead-*` system headers (docs/FORMAT.md, "Dead letters"):

    Dirmq-Dead-Reason: max-receives        (events.DEAD_REASONS)
    Dirmq-Dead-Source: shop/orders         the queue it died in
    Dirmq-Dead-Receive-Count: 3            how often it had been received
    Dirmq-Dead-At: 2026-11-28T13:40:00.123Z
    Dirmq-Dead-Detail: bad sku             what a consumer said when it rejected it, if anything

Order of steps, so that a crash at any instant loses nothing and a race has one winner:

1. the leased (or expired) file is renamed into the queue's own @dead: this *claims* it. Of two
   processes dead-lettering the same lease, one rename wins; an ack that comes later finds the
   lease gone (StaleReceipt), as it would after any other settle;
2. the new file is written in the target queue's @tmp (fsynced unless the queue is `memory`)
   and renamed to its final name: over the claimed file itself for the own @dead (an atomic
   replace: either version is a whole message), or into the dead-letter queue's @ready;
3. for a dead-letter queue, the claimed file is retired from @dead (the pool blanks it).

A crash between 2 and 3 leaves the message in both the dead-letter queue and the source's
@dead (the older copy, without provenance): one copy too many, never none.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Mapping

from dirmq.errors import InvalidArgument, MessageTooLarge, storage_error
from dirmq.store import codec, fsio, layout
from dirmq.store.config import Durability, QueueConfig
from dirmq.store.events import DEAD_REASONS, REASON_REJECTED, REASON_UNREADABLE, StoreEvents
from dirmq.store.filemodes import Access
from dirmq.store.ids import new_id
from dirmq.store.message import DeadLetter

MAX_DETAIL_BYTES = 1024  # a consumer's text: a header line, bounded like other labels
# A consumer may give these reasons (the others are the store's own verdicts).
CONSUMER_REASONS = (REASON_REJECTED, REASON_UNREADABLE)
_PREFIX = "Dead-"
_REASON, _SOURCE, _COUNT, _AT, _DETAIL = (
    "Dead-Reason",
    "Dead-Source",
    "Dead-Receive-Count",
    "Dead-At",
    "Dead-Detail",
)
# System headers a rewrite does not carry over: its own, the id (written anew), the slot of a
# capacity token the source queue frees, the deadline of its time to live (a dead letter is kept
# and redriven, never expired again: expiry.py).
_NOT_COPIED = frozenset({codec.ID, "Slot", "Expires"})


def check_consumer_verdict(reason: str, detail: str | None) -> None:
    """InvalidArgument unless a consumer may dead-letter with `reason` and `detail`."""
    if reason not in CONSUMER_REASONS:
        raise InvalidArgument(
            f"dead-letter reason must be one of {', '.join(CONSUMER_REASONS)}, got {reason!r}"
        )
    if detail is None:
        return
    codec.check_label("the dead-letter detail", detail)
    if len(detail.encode()) > MAX_DETAIL_BYTES:
        raise InvalidArgument(
            f"the dead-letter detail is {len(detail.encode())} bytes; the limit is "
            f"{MAX_DETAIL_BYTES}: say why in a line, keep the rest in your logs"
        )


def to_system(dead: DeadLetter) -> dict[str, str]:
    """The `Dirmq-Dead-*` system headers (names without `Dirmq-`) of `dead`."""
    system = {
        _REASON: dead.reason,
        _SOURCE: dead.source,
        _COUNT: str(dead.receive_count),
        _AT: format_time(dead.at_s),
    }
    if dead.detail is not None:
        system[_DETAIL] = dead.detail
    return system


def from_system(system: Mapping[str, str]) -> DeadLetter | None:
    """The provenance a file's system headers hold, or None (never dead-lettered). A value that
    does not parse (a file edited by hand) reads as unknown, never as an error: the message
    itself is intact."""
    reason = system.get(_REASON)
    if reason is None:
        return None
    count = system.get(_COUNT, "")
    return DeadLetter(
        reason=reason,
        source=system.get(_SOURCE, ""),
        receive_count=int(count) if count.isascii() and count.isdigit() else 0,
        at_s=parse_time(system.get(_AT, "")),
        detail=system.get(_DETAIL),
    )


def format_time(at_s: float) -> str:
    """RFC 3339 in UTC with milliseconds: `2026-11-28T13:40:00.123Z`."""
    moment = datetime.datetime.fromtimestamp(at_s, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def parse_time(text: str) -> float:
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0


def rewritten(decoded: codec.Decoded, message_id: str, dead: DeadLetter) -> bytes:
    """The bytes of the dead copy of a message: its body, headers and group, and `dead`."""
    system = {
        k: v
        for k, v in decoded.system.items()
        if k not in _NOT_COPIED and not k.startswith(_PREFIX)
    }
    system.update(to_system(dead))
    return codec.encode(decoded.body, decoded.headers, system, message_id=message_id)


def encoded(
    body: bytes, headers: Mapping[str, str], group: str | None, dead: DeadLetter, message_id: str
) -> bytes:
    """The file of a message that arrives dead (`Queue.put_dead_letter`)."""
    codec.check_headers(headers)
    codec.check_label("group", group)
    system = {"Group": group} if group is not None else {}
    system.update(to_system(dead))
    return codec.encode(body, headers, system, message_id=message_id)


def write_replacing(
    data: bytes, tmp_dir: str, target: str, message_id: str, access: Access, durable: bool
) -> None:
    """Write `data` as `target` through a temp in `tmp_dir`: one rename, so `target` is either
    its old file or the whole new one. `durable`: the file and its directory are fsynced."""
    tmp = os.path.join(tmp_dir, layout.tmp_name(message_id))
    fd = fsio.write_new_file(tmp, data, access)
    try:
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    try:
        os.rename(tmp, target)
    except BaseException:
        _unlink_quietly(tmp)
        raise
    if durable:
        fsio.fsync_dir(os.path.dirname(target))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def put(
    queue: str,
    config: QueueConfig,
    queue_dir: str,
    access: Access,
    events: StoreEvents,
    body: bytes,
    headers: Mapping[str, str],
    group: str | None,
    dead: DeadLetter,
) -> str:
    """`Queue.put_dead_letter` into the queue `queue` at `queue_dir`: one new file in @ready
    (the next index sync finds it)."""
    if dead.reason not in DEAD_REASONS:
        choices = ", ".join(DEAD_REASONS)
        raise InvalidArgument(f"reason must be one of {choices}, got {dead.reason!r}")
    if dead.detail is not None:
        codec.check_label("the dead-letter detail", dead.detail)
    if len(body) > config.max_message_bytes:
        raise MessageTooLarge(
            f"message is {len(body)} bytes; queue {queue!r} accepts at most "
            f"{config.max_message_bytes}"
        )
    message_id = new_id()
    data = encoded(body, headers, group, dead, message_id)
    tag = None if group is None else layout.group_tag(group)
    target = os.path.join(queue_dir, layout.READY, layout.ready_name(message_id, 0, tag))
    durable = config.durability is not Durability.MEMORY
    try:
        write_replacing(
            data, os.path.join(queue_dir, layout.TMP), target, message_id, access, durable
        )
    except OSError as exc:
        raise storage_error(exc, f"storing a dead letter in queue {queue!r}") from exc
    if events.dead_lettered is not None:
        events.dead_lettered(queue, dead.reason)
    return message_id
