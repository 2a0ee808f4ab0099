"""Prometheus metrics: requests of every door, messages moved, failures, pub/sub, corrupt files,
workers, and each queue's depth read from the store at scrape time.

Every counter, histogram and gauge a worker bumps is prometheus-client's own, in multiprocess
mode (`multiprocess.py`): the values live in files of the server run's metrics directory, and a
scrape in any worker reads all of them through `MultiProcessCollector`. Nothing is added up
here by hand, and counters never go backwards: a worker that dies leaves its files behind.

Requests are counted once, by the observer of every listener's `Router` (`observe`), with the
dialect that answered them (`door`: native, sqs, yaq, pubsub), their route (a route kind, an SQS
action, a yaq verb), method and status. Per request that is one counter increment and one
histogram observation, each a write into an mmap: the labelled children are looked up once and
kept, since `.labels()` costs as much again. Messages are counted by the broker (`MessageCounts`)
once per batch, whatever the door, without a queue label: per-queue numbers are the depth
gauges, which are bounded (`--metrics-max-queues`), where a queue label on counters would grow
every worker's files with every queue ever named.

Failures are counted where they happen, once per message: nacks by the broker (a consumer's
give-back at any door; not what the server gives back itself, e.g. a closed stream's
deliveries), dead letters (by `reason`), expired leases and redrives by the store, which tells
the worker through `events()` (a `StoreEvents`), and worker restarts by the supervisor of
`--workers N`, which bumps `worker_restarts()` in its own file of the run's directory: a scrape
in any worker reads it like the workers' own. What another process on the root does (a CLI
sweep, a library consumer) is that process's to count.

The depth gauges are read at scrape time by `census` from the queues' directory listings: no
queue is opened, no index built, no inotify watch taken. A root of 10,000 queues is listed in
well under a second; the series are bounded by `max_queues` (the deepest queues by name order
among equals; every queue is in the `dirmq_queues_*` totals), and `/metrics?queue=NAME` gives
any one queue's.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from dirmq.server.contract import Request
from dirmq.server.multiprocess import MetricsFiles
from dirmq.store.census import Census, QueueDepth, queue_depth
from dirmq.store.events import DEAD_REASONS, StoreEvents

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30)
DEFAULT_MAX_QUEUES = 1000  # queues with series of their own (`--metrics-max-queues`)
STATES = ("ready", "in_flight", "delayed", "dead")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
# Label values each label may take per worker before the rest are counted as "other": routes
# come from fixed tables, queue names of corrupt files are rare; this bounds them whatever comes.
MAX_ROUTES = 64
MAX_CORRUPT_QUEUES = 1000
_MAX_CACHED = 10_000  # labelled children kept for requests (any more are looked up each time)
WORKER_TICK_S = 1.0  # how often a worker's own gauge is brought up to date
OTHER_REASON = "other"  # a dead letter's reason that is none of DEAD_REASONS (bounded label)


def worker_restarts() -> Counter:
    """The count of workers the supervisor replaced. Made by the supervisor (which bumps it) and
    by every worker (so that one worker, with no supervisor, shows it at 0): the same series."""
    return Counter(
        "dirmq_worker_restarts",
        "Workers that died and were replaced by the supervisor of --workers N",
        registry=None,
    )


class Metrics:
    """The metrics of one worker process. `files` must be the server run's metrics directory,
    active in this process (`MetricsFiles.create`, before any worker is forked)."""

    def __init__(
        self,
        files: MetricsFiles,
        root: str,
        *,
        max_queues: int = DEFAULT_MAX_QUEUES,
        worker: int = 0,
        census: Census | None = None,
    ) -> None:
        if not files.active:
            raise RuntimeError("metrics need their run's MetricsFiles active in this process")
        if max_queues < 0:
            raise ValueError("max_queues must be 0 or more")
        self.root = root
        self.worker = worker
        self.answered = 0  # requests this worker answered (its own gauge, every second)
        self.requests = Counter(
            "dirmq_http_requests",
            "HTTP requests answered, by the dialect that answered them",
            ["door", "route", "method", "status"],
            registry=None,
        )
        self.latency = Histogram(
            "dirmq_http_request_duration_seconds",
            "Time to answer a request (long polls included)",
            ["door", "route", "method"],
            registry=None,
            buckets=LATENCY_BUCKETS,
        )
        self._published = Counter(
            "dirmq_messages_published", "Messages published (native, SQS, yaq)", registry=None
        )
        self._delivered = Counter(
            "dirmq_messages_delivered",
            "Messages leased to consumers (native, SQS, yaq)",
            registry=None,
        )
        self._acked = Counter(
            "dirmq_messages_acked",
            "Messages acknowledged by receipt (native, SQS, yaq)",
            registry=None,
        )
        self._nacked = Counter(
            "dirmq_messages_nacked",
            "Messages a consumer gave back (native nack, stream nack, SQS visibility 0)",
            registry=None,
        )
        self._dead_letters = Counter(
            "dirmq_dead_letters",
            "Messages dead-lettered, by reason",
            ["reason"],
            registry=None,
        )
        # Every reason's series from the start (at 0), each child looked up once.
        self._dead = {reason: self._dead_letters.labels(reason) for reason in DEAD_REASONS}
        self._expired = Counter(
            "dirmq_leases_expired",
            "Leases that ran out unsettled (the message returned, or dead-lettered)",
            registry=None,
        )
        self._redriven = Counter(
            "dirmq_messages_redriven",
            "Dead messages redriven (back to their queue, or to another)",
            registry=None,
        )
        worker_restarts()  # at 0 in this worker's file: shown even without a supervisor
        self.corrupt = Counter(
            "dirmq_messages_corrupt",
            "Corrupt message files a receive met and set aside in @corrupt",
            ["queue"],
            registry=None,
        )
        self.pubsub_published = Counter(
            "dirmq_pubsub_published",
            "Pub/sub messages published, by delivery mode",
            ["mode"],
            registry=None,
        )
        self.pubsub_delivered = Counter(
            "dirmq_pubsub_delivered",
            "Pub/sub deliveries sent to streaming subscribers",
            registry=None,
        )
        self.pubsub_settled = Counter(
            "dirmq_pubsub_settled",
            "Pub/sub deliveries of streaming subscribers settled, by outcome",
            ["outcome"],
            registry=None,
        )
        self.pubsub_attached = Gauge(
            "dirmq_pubsub_attached_subscriptions",
            "Pub/sub subscriptions streaming from the server (every live worker)",
            registry=None,
            multiprocess_mode="livesum",
        )
        self._worker_requests = Gauge(
            "dirmq_worker_requests_answered",
            "Requests a live worker answered since it started (updated every second)",
            ["worker"],
            registry=None,
            multiprocess_mode="liveall",  # one series per live worker, with its pid
        ).labels(str(worker))
        self._worker_requests.set(0)
        self._children: dict[tuple[str, str, str, int], tuple[Counter, Histogram]] = {}
        self._routes: dict[str, set[str]] = {}
        self._corrupt_queues: set[str] = set()
        self._ticker: asyncio.TimerHandle | None = None
        self.registry = CollectorRegistry()
        MultiProcessCollector(self.registry, path=files.path)  # type: ignore[no-untyped-call]
        self.registry.register(QueueDepthCollector(census or Census(root), max_queues))

    # -- requests (`contract.Observe`) ----------------------------------------------------------
    def observe(self, request: Request, status: int, sent: int, seconds: float) -> None:
        """Count an answered request and its latency (the observer of every Router)."""
        self.answered += 1
        key = (request.door, request.route, request.method, status)
        children = self._children.get(key)
        if children is None:
            children = self._labelled(*key)
        children[0].inc()
        children[1].observe(seconds)

    def _labelled(
        self, door: str, route: str, method: str, status: int
    ) -> tuple[Counter, Histogram]:
        """The children for a request's labels, each label bounded: an unknown method, a route
        past MAX_ROUTES of its door, become "other"; a request refused before any dialect saw
        it (a malformed head, a body too large) has door and route "none"."""
        door_label = door or "none"
        route_label = route or "none"
        routes = self._routes.setdefault(door_label, set())
        if route_label not in routes:
            if len(routes) >= MAX_ROUTES:
                route_label = "other"
            else:
                routes.add(route_label)
        method_label = method if method in _METHODS else "other"
        children = (
            self.requests.labels(door_label, route_label, method_label, str(status)),
            self.latency.labels(door_label, route_label, method_label),
        )
        if len(self._children) < _MAX_CACHED:
            self._children[door, route, method, status] = children
        return children

    # -- messages (`broker.MessageCounts`) --------------------------------------------------------
    def published(self, count: int) -> None:
        self._published.inc(count)

    def delivered(self, count: int) -> None:
        self._delivered.inc(count)

    def acked(self, count: int) -> None:
        self._acked.inc(count)

    def nacked(self, count: int) -> None:
        self._nacked.inc(count)

    # -- the store's events (any thread) -------------------------------------------------------
    def events(self) -> StoreEvents:
        """What this worker's Store tells these metrics (`Store(events=...)`)."""
        return StoreEvents(
            quarantined=self.quarantined,
            dead_lettered=self.dead_lettered,
            leases_expired=self.leases_expired,
            redriven=self.redriven,
        )

    def dead_lettered(self, _queue: str, reason: str) -> None:
        child = self._dead.get(reason)
        if child is None:  # not a reason the store names: the label stays bounded all the same
            child = self._dead_letters.labels(OTHER_REASON)
        child.inc()

    def leases_expired(self, _queue: str, count: int) -> None:
        self._expired.inc(count)

    def redriven(self, _queue: str, count: int) -> None:
        self._redriven.inc(count)

    def quarantined(self, queue: str) -> None:
        """A corrupt file of `queue` was set aside (the Store's `on_quarantine`; any thread)."""
        if queue not in self._corrupt_queues:
            if len(self._corrupt_queues) >= MAX_CORRUPT_QUEUES:
                queue = "(other)"
            else:
                self._corrupt_queues.add(queue)
        self.corrupt.labels(queue).inc()

    # -- the worker -------------------------------------------------------------------------
    def start(self) -> None:
        """On the worker's event loop: keep its own gauge up to date."""
        self._tick()

    def _tick(self) -> None:
        self._worker_requests.set(self.answered)
        loop = asyncio.get_running_loop()
        self._ticker = loop.call_later(WORKER_TICK_S, self._tick)

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            self._ticker = None

    # -- scrapes ----------------------------------------------------------------------------------
    def render(self, queue: str | None = None) -> bytes:
        """The exposition: every worker's metrics and the queues' depth; with `queue`, that
        queue's depth series alone (QueueNotFound if there is none). Blocking: reads files."""
        if queue is None:
            return generate_latest(self.registry)
        one = CollectorRegistry()
        one.register(_OneQueue(self.root, queue))
        return generate_latest(one)


def _depth_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
    return (
        GaugeMetricFamily(
            "dirmq_queue_messages", "Messages in a queue by state", labels=["queue", "state"]
        ),
        GaugeMetricFamily(
            "dirmq_queue_oldest_ready_age_seconds",
            "Age of the oldest ready message of a queue",
            labels=["queue"],
        ),
    )


def _add_queue(
    depth: GaugeMetricFamily, age: GaugeMetricFamily, name: str, found: QueueDepth
) -> None:
    stats = found.stats
    for state in STATES:
        depth.add_metric([name, state], getattr(stats, state))
    if stats.oldest_ready_age_s is not None:
        age.add_metric([name], stats.oldest_ready_age_s)


def _held(found: QueueDepth) -> int:
    stats = found.stats
    return stats.ready + stats.in_flight + stats.delayed + stats.dead


class QueueDepthCollector(Collector):
    """Every queue's depth, from one census of the root per scrape: totals over all queues,
    and series of their own for the `max_queues` deepest (the most messages in any state; by
    name among equals)."""

    def __init__(self, census: Census, max_queues: int) -> None:
        self._census = census  # kept listings: a settled deep @ready is not listed per scrape
        self.max_queues = max_queues

    def describe(self) -> list[GaugeMetricFamily]:
        return []  # nothing to check at registration (a census per registration would be one)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        found = list(self._census.depths())
        if len(found) > self.max_queues:
            shown = heapq.nsmallest(self.max_queues, found, key=lambda q: (-_held(q), q.name))
        else:
            shown = found
        shown.sort(key=lambda q: q.name)
        queues = GaugeMetricFamily("dirmq_queues", "Queues under the root")
        queues.add_metric([], len(found))
        omitted = GaugeMetricFamily(
            "dirmq_queues_omitted",
            "Queues left without series of their own (over --metrics-max-queues)",
        )
        omitted.add_metric([], len(found) - len(shown))
        totals = GaugeMetricFamily(
            "dirmq_queues_messages", "Messages in all queues by state", labels=["state"]
        )
        for state in STATES:
            totals.add_metric([state], sum(getattr(q.stats, state) for q in found))
        yield queues
        yield omitted
        yield totals
        ages = [q.stats.oldest_ready_age_s for q in found if q.stats.oldest_ready_age_s is not None]
        if ages:
            oldest = GaugeMetricFamily(
                "dirmq_queues_oldest_ready_age_seconds",
                "Age of the oldest ready message of any queue",
            )
            oldest.add_metric([], max(ages))
            yield oldest
        depth, age = _depth_families()
        for queue in shown:
            _add_queue(depth, age, queue.name, queue)
        yield depth
        yield age


class _OneQueue(Collector):
    def __init__(self, root: str, name: str) -> None:
        self.root = root
        self.name = name

    def describe(self) -> list[GaugeMetricFamily]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth, age = _depth_families()
        _add_queue(depth, age, self.name, QueueDepth(self.name, queue_depth(self.root, self.name)))
        yield depth
        yield age
