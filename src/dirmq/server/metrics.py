"""Prometheus metrics (prometheus-client): request counts and latencies, messages published,
delivered and acknowledged, pub/sub publishes, deliveries, settlements and attached streams,
and per-queue depth and corrupt files set aside, read from the store at scrape time.

The per-request series (requests, latency, messages per queue) are plain numbers bumped on the
event loop and turned into metric families at scrape time: prometheus-client's own counters take
a lock per increment and a label lookup per call, a few microseconds a request."""

from __future__ import annotations

import itertools
import os
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from dirmq.errors import DirmqError
from dirmq.store import Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


class _DepthCollector(Collector):
    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        depth = GaugeMetricFamily(
            "dirmq_queue_messages", "Messages in a queue by state", labels=["queue", "state"]
        )
        age = GaugeMetricFamily(
            "dirmq_queue_oldest_ready_age_seconds",
            "Age of the oldest ready message",
            labels=["queue"],
        )
        # The store counts what this process set aside; the metric is per worker, as the rest.
        corrupt = CounterMetricFamily(
            "dirmq_messages_corrupt",
            "Corrupt message files a receive met and set aside in @corrupt",
            labels=["queue"],
        )
        for name in self._store.list_queues():
            try:
                queue = self._store.queue(name)
                stats = queue.stats()
            except DirmqError:
                continue  # deleted while we looked
            for state in ("ready", "in_flight", "delayed", "dead"):
                depth.add_metric([name, state], getattr(stats, state))
            if stats.oldest_ready_age_s is not None:
                age.add_metric([name], stats.oldest_ready_age_s)
            corrupt.add_metric([name], queue.corrupt_quarantined)
        yield depth
        yield age
        yield corrupt


LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30)
QUEUE_COUNTERS = {
    "published": "Messages published",
    "delivered": "Messages leased to consumers",
    "acked": "Messages acknowledged or deleted",
}


@dataclass(slots=True)
class _Count:
    value: int = 0
    created: float = field(default_factory=time.time)


@dataclass(slots=True)
class _Latencies:
    buckets: list[int]  # per bucket, not cumulative; the last one is +Inf
    total_s: float = 0.0
    created: float = field(default_factory=time.time)


class _RequestCollector(Collector):
    """What prometheus-client's Counter and Histogram would expose for the same increments
    (`_total`, `_bucket`, `_count`, `_sum`, `_created`). Bumped on the event loop, read by a
    scrape in a pool thread: each number is read whole (the GIL), a scrape may just see a
    request counted whose latency is not yet."""

    def __init__(self) -> None:
        self.bounds = tuple(float(b) for b in LATENCY_BUCKETS)
        # `le` as prometheus-client writes it (repr of the float, "+Inf" last).
        self.les = [*(repr(b) for b in self.bounds), "+Inf"]
        self.answered: dict[tuple[str, str, int], tuple[_Count, _Latencies]] = {}
        self.per_queue: dict[str, dict[str, _Count]] = {name: {} for name in QUEUE_COUNTERS}

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        requests = CounterMetricFamily(
            "dirmq_http_requests", "HTTP requests answered", labels=["route", "method", "status"]
        )
        latency = HistogramMetricFamily(
            "dirmq_http_request_duration_seconds",
            "Time to answer a request (long polls included)",
            labels=["route", "method"],
        )
        seen: set[int] = set()
        for (route, method, status), (count, times) in list(self.answered.items()):
            requests.add_metric([route, method, str(status)], count.value, created=count.created)
            if id(times) in seen:  # one histogram per route and method, whatever the status
                continue
            seen.add(id(times))
            cumulative = list(itertools.accumulate(list(times.buckets)))
            latency.add_metric(
                [route, method], list(zip(self.les, cumulative, strict=True)), times.total_s
            )
            labels = {"route": route, "method": method}
            latency.samples.append(Sample(f"{latency.name}_created", labels, times.created))
        yield requests
        yield latency
        for name, documentation in QUEUE_COUNTERS.items():
            family = CounterMetricFamily(f"dirmq_messages_{name}", documentation, labels=["queue"])
            for queue, count in list(self.per_queue[name].items()):
                family.add_metric([queue], count.value, created=count.created)
            yield family


class Metrics:
    """One registry per worker process; every series carries the worker's pid."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        worker = str(os.getpid())
        self._requests = _RequestCollector()
        self._latencies: dict[tuple[str, str], _Latencies] = {}
        self.registry.register(self._requests)
        self.pubsub_published = Counter(
            "dirmq_pubsub_published",
            "Pub/sub messages published, by delivery mode",
            ["mode"],
            registry=self.registry,
        )
        self.pubsub_delivered = Counter(
            "dirmq_pubsub_delivered",
            "Pub/sub deliveries sent to streaming subscribers",
            registry=self.registry,
        )
        self.pubsub_settled = Counter(
            "dirmq_pubsub_settled",
            "Pub/sub deliveries of streaming subscribers settled, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.pubsub_attached = Gauge(
            "dirmq_pubsub_attached_subscriptions",
            "Pub/sub subscriptions streaming from this worker",
            registry=self.registry,
        )
        self.registry.register(_DepthCollector(store))
        self.worker = worker

    def answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count a request (route and method are low-cardinality labels) and its latency."""
        if method not in _METHODS:
            method = "other"  # any token is a method: the label must stay low-cardinality
        answered = self._requests.answered
        entry = answered.get((route, method, status))
        if entry is None:
            times = self._latencies.get((route, method))
            if times is None:
                buckets = [0] * (len(self._requests.bounds) + 1)
                times = self._latencies[route, method] = _Latencies(buckets)
            entry = answered[route, method, status] = (_Count(), times)
        entry[0].value += 1
        times = entry[1]
        times.buckets[bisect_left(self._requests.bounds, seconds)] += 1  # le: bound >= seconds
        times.total_s += seconds

    def count(self, counter: str, queue: str, amount: int = 1) -> None:
        """Add `amount` to a per-queue counter: published, delivered or acked."""
        counts = self._requests.per_queue[counter]
        count = counts.get(queue)
        if count is None:
            count = counts[queue] = _Count()
        count.value += amount

    def render(self) -> bytes:
        return generate_latest(self.registry)
