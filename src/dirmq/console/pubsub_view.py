"""What the console shows of publish/subscribe, as `dirmq.pubsub` tells it: subscriptions (their
filters, position, lag, held deliveries and delivery policy), channels, and pages of the
retained log by sequence number.

Only reads: no cursor moves and nothing is delivered (the log is read as a retained page reads
it, `read_retained`), and a root that has never used pub/sub gets None, with nothing created.
Who may see what is the caller's to say (`Viewer`), as the pub/sub API would judge it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dirmq.console.preview import Preview, preview
from dirmq.errors import CorruptMessage, storage_error
from dirmq.pubsub.hub import PubSub
from dirmq.pubsub.layout import PubSubPaths
from dirmq.pubsub.model import Filter
from dirmq.pubsub.policy import DeliveryPolicy
from dirmq.pubsub.retained import LostEntry, read_envelope, read_retained
from dirmq.pubsub.seqlogs import LogHead
from dirmq.pubsub.transitions import Entry
from dirmq.server.credentials import BROWSE, CHANNEL_PREFIX, SEE, SUBSCRIPTION_PREFIX
from dirmq.store import layout

if TYPE_CHECKING:
    from dirmq.console.call import Console

CHANNEL_WINDOW = 1000  # the newest retained entries whose channels the pages count
LOG_PAGE = 100  # entries of a log page
LOG_SCAN = 10 * LOG_PAGE  # entries a filtered log page reads at most, matching or not
LOG_PAGE_BYTES = 8 * 1024 * 1024  # of bodies read for one log page (as a retained page's cut)


@dataclass(frozen=True, slots=True)
class Viewer:
    """What one principal may see: subscriptions (by name), channels (by name), the counters
    of `GET /@pubsub` (metrics), and the retained log of the channels starting with a prefix
    (`browse` on every one of them, as a retained page asks)."""

    subscription: Callable[[str], bool]
    channel: Callable[[str], bool]
    counters: bool
    log: Callable[[str], bool]


def viewer_of(console: Console, principal: str) -> Viewer:
    access = console.access
    return Viewer(
        subscription=lambda name: access.allows(principal, SEE, SUBSCRIPTION_PREFIX + name),
        channel=lambda name: access.allows(principal, BROWSE, CHANNEL_PREFIX + name),
        counters=access.may_read_metrics(principal),
        log=lambda prefix: access.covers(principal, BROWSE, CHANNEL_PREFIX + prefix),
    )


@dataclass(frozen=True, slots=True)
class SubscriptionRow:
    name: str
    attached: bool
    taken: int  # deliveries it holds from the `anyone` pool
    lag: int | None  # retained entries it has not yet read (every channel's)
    position: int | None = None  # the next retained sequence number it reads
    channels: tuple[str, ...] = ()  # channel prefixes of its filter (none: every channel)
    subjects: tuple[str, ...] = ()
    policy: DeliveryPolicy | None = None

    def takes(self, channel: str) -> bool:
        return not self.channels or any(channel.startswith(p) for p in self.channels)


@dataclass(frozen=True, slots=True)
class ChannelRow:
    name: str
    retained: int  # entries on it among the newest CHANNEL_WINDOW of the retained log
    newest_seq: int | None
    newest_s: float | None  # when its newest of those was published
    subscriptions: int  # the shown subscriptions whose filter takes it
    browsable: bool  # the viewer may page the log of the channels starting with it


@dataclass(frozen=True, slots=True)
class PubSubSummary:
    retained: int  # the retained log's head: its newest sequence number
    counters: dict[str, int] | None  # `GET /@pubsub`'s, to a principal that may read metrics
    subscriptions: list[SubscriptionRow]
    channels: list[ChannelRow]
    window: int  # how many of the newest retained entries the channels were counted from
    whole_log: bool  # the principal may page the whole retained log


@dataclass(frozen=True, slots=True)
class Hub:
    """The console's hub, and the retained log's head as readers see it (as the pub/sub API
    sees it: a deleted entry stays counted, a missing one in the middle does not hide the
    entries after it)."""

    pubsub: PubSub
    head: LogHead

    @property
    def paths(self) -> PubSubPaths:
        return self.pubsub.paths


def hub_of(console: Console) -> Hub | None:
    """The console's hub, or None where pub/sub was never used (then nothing is made)."""
    if not os.path.isdir(os.path.join(console.store.root, layout.PUBSUB_DIR)):
        return None
    hub = console.hub
    if not isinstance(hub, Hub):
        pubsub = PubSub(console.store)  # kept: it opens logs and an outbox
        retained = pubsub.retained
        hub = console.hub = Hub(pubsub, LogHead(retained.directory, retained.refresh_head))
    return hub


def pubsub_summary(console: Console, principal: str) -> PubSubSummary | None:
    hub = hub_of(console)
    if hub is None:
        return None
    viewer = viewer_of(console, principal)
    head = hub.head.current()
    rows = subscriptions(hub, head, viewer)
    counters = None
    if viewer.counters:
        stats = hub.pubsub.stats()
        counters = {k: stats[k] for k in ("broadcast", "anyone_waiting", "attached")}
    first = max(1, head - CHANNEL_WINDOW + 1)
    found = channels(hub, first, head, rows, viewer)
    return PubSubSummary(head, counters, rows, found, head - first + 1, viewer.log(""))


def subscriptions(hub: Hub, head: int, viewer: Viewer) -> list[SubscriptionRow]:
    rows = []
    for found in hub.pubsub.subscriptions():
        name = str(found["name"])
        if not viewer.subscription(name):
            continue
        position = found.get("retained_next")
        position = position if isinstance(position, int) else None
        taken = found.get("taken")
        wanted = found.get("filter")
        filter_ = Filter.from_json(wanted) if isinstance(wanted, dict) else Filter()
        rows.append(
            SubscriptionRow(
                name,
                bool(found["attached"]),
                taken if isinstance(taken, int) else 0,
                max(0, head + 1 - position) if position is not None else None,
                position,
                filter_.channels,
                filter_.subjects,
                DeliveryPolicy.from_json(found.get("delivery")),
            )
        )
    return rows


def channels(
    hub: Hub, first: int, head: int, subs: list[SubscriptionRow], viewer: Viewer
) -> list[ChannelRow]:
    """The channels of the retained entries `first` .. `head` the viewer may browse, and the
    channel prefixes the shown subscriptions filter on; a count of entries on each."""
    counts: dict[str, tuple[int, int, float]] = {}
    for seq in range(first, head + 1):
        try:
            envelope = read_envelope(hub.paths.retained_entry(seq))
        except (FileNotFoundError, CorruptMessage):
            continue  # lost: the log's page shows it
        except OSError as exc:
            raise storage_error(exc, f"reading retained entry {seq}") from exc
        channel = envelope.channel
        if channel in counts or viewer.channel(channel):
            count = counts.get(channel, (0, 0, 0.0))[0]
            counts[channel] = (count + 1, seq, envelope.published_us / 1e6)
    names = set(counts) | {p for s in subs for p in s.channels}
    rows = []
    for name in sorted(names):
        count, seq, at_s = counts.get(name, (0, 0, 0.0))
        rows.append(
            ChannelRow(
                name,
                count,
                seq or None,
                at_s if count else None,
                sum(1 for s in subs if s.takes(name)),
                viewer.log(name),
            )
        )
    return rows


# -- the retained log ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LogRow:
    seq: int
    entry: Entry | None  # None: lost
    lost: str  # why it cannot be read ("absent", "damaged: ..."), or ""
    body: Preview | None


@dataclass(frozen=True, slots=True)
class LogPage:
    head: int
    rows: list[LogRow]
    next_after: int | None  # the cursor of the next page, while entries remain
    scanned_to: int  # the last sequence number this page read (a filter skips some)


def log_page(hub: Hub, after: int, channel: str) -> LogPage:
    """Up to LOG_PAGE entries after sequence number `after` on channels starting with
    `channel` (every channel: ""), and the lost ones among them; fewer once LOG_SCAN entries
    were read (a filter skips some) or LOG_PAGE_BYTES of bodies. Reads files, moves nothing."""
    head = hub.head.current()
    wanted = Filter((channel,) if channel else ())
    end = min(head, after + (LOG_SCAN if channel else LOG_PAGE))
    rows: list[LogRow] = []
    last = end
    read = 0
    for item in read_retained(hub.paths, after + 1, end + 1, wanted, head=head):
        if isinstance(item, LostEntry):
            why = item.why + (f": {item.error}" if item.error else "")
            rows.append(LogRow(item.seq, None, why, None))
        else:
            seq, entry = item
            read += len(entry.body)
            rows.append(LogRow(seq, entry, "", preview(entry.body)))
        if len(rows) == LOG_PAGE or read >= LOG_PAGE_BYTES:
            last = rows[-1].seq
            break
    return LogPage(head, rows, last if last < head else None, last)
