"""Prometheus metrics (prometheus-client): request counts and latencies, messages published,
delivered and acknowledged, pub/sub publishes, deliveries, settlements and attached streams,
and per-queue depth read from the store at scrape time."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from dirmq.errors import DirmqError
from dirmq.store import Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _DepthCollector(Collector):
    def __init__(self, store: Store) -> None:
        self._store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "dirmq_queue_messages", "Messages in a queue by state", labels=["queue", "state"]
        )
        age = GaugeMetricFamily(
            "dirmq_queue_oldest_ready_age_seconds",
            "Age of the oldest ready message",
            labels=["queue"],
        )
        for name in self._store.list_queues():
            try:
                stats = self._store.queue(name).stats()
            except DirmqError:
                continue  # deleted while we looked
            for state in ("ready", "in_flight", "delayed", "dead"):
                depth.add_metric([name, state], getattr(stats, state))
            if stats.oldest_ready_age_s is not None:
                age.add_metric([name], stats.oldest_ready_age_s)
        yield depth
        yield age


class Metrics:
    """One registry per worker process; every series carries the worker's pid."""

    def __init__(self, store: Store) -> None:
        self.registry = CollectorRegistry()
        worker = str(os.getpid())
        self.requests = Counter(
            "dirmq_http_requests",
            "HTTP requests answered",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "dirmq_http_request_duration_seconds",
            "Time to answer a request (long polls included)",
            ["route", "method"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
        )
        self.published = Counter(
            "dirmq_messages_published", "Messages published", ["queue"], registry=self.registry
        )
        self.delivered = Counter(
            "dirmq_messages_delivered",
            "Messages leased to consumers",
            ["queue"],
            registry=self.registry,
        )
        self.acked = Counter(
            "dirmq_messages_acked",
            "Messages acknowledged or deleted",
            ["queue"],
            registry=self.registry,
        )
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
        # Label children, looked up once: `.labels()` costs a lock and a tuple check per call.
        self._answered: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._per_queue: dict[tuple[Counter, str], Any] = {}

    def answered(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count a request (route and method are low-cardinality labels) and its latency."""
        children = self._answered.get((route, method, status))
        if children is None:
            children = self._answered[route, method, status] = (
                self.requests.labels(route, method, str(status)),
                self.latency.labels(route, method),
            )
        children[0].inc()
        children[1].observe(seconds)

    def count(self, counter: Counter, queue: str, amount: int = 1) -> None:
        """`counter.labels(queue).inc(amount)`, for the per-queue message counters."""
        child = self._per_queue.get((counter, queue))
        if child is None:
            child = self._per_queue[counter, queue] = counter.labels(queue)
        child.inc(amount)

    def render(self) -> bytes:
        return generate_latest(self.registry)
