"""The router's Prometheus series: where requests went, retries, cache-affinity hits and each
replica's health. One registry per application, so two routers in a process never mix."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from pagedserve.router.policies import AFFINITY_HIT, AFFINITY_MISS, AFFINITY_NEW
from pagedserve.router.replicas import ReplicaSet

PREFIX = "pagedserve:router_"


class RouterMetrics:
    def __init__(self, replicas: ReplicaSet) -> None:
        self.registry = CollectorRegistry()
        self._replicas = replicas
        registry = self.registry
        self.routed = Counter(PREFIX + "routed_requests", "Requests sent to each replica "
                              "(first attempts and retries).", ["replica"], registry=registry)
        self.retries = Counter(PREFIX + "retries", "Requests retried on another replica "
                               "after this one failed before streaming.", ["replica"],
                               registry=registry)
        self.affinity = {
            AFFINITY_HIT: Counter(PREFIX + "cache_affinity_hits", "Requests sent to the "
                                  "replica their prefix went to before.", registry=registry),
            AFFINITY_MISS: Counter(PREFIX + "cache_affinity_misses", "Requests whose prefix's "
                                   "replica was saturated, over its load bound or gone.",
                                   registry=registry),
            AFFINITY_NEW: Counter(PREFIX + "new_prefixes", "Requests with a prefix the router "
                                  "had not seen (placed by consistent hashing).",
                                  registry=registry),
        }
        self.failures = Counter(PREFIX + "failed_requests", "Requests the router answered "
                                "with its own error, by status.", ["status"], registry=registry)
        self.broken_streams = Counter(PREFIX + "broken_streams", "Streams a replica failed "
                                      "after their first byte (silent past the idle timeout, "
                                      "cut short, broken, ejected), ended with an error event.",
                                      ["replica"], registry=registry)
        registry.register(_ReplicaCollector(replicas))
        # The per-replica child of ``routed``: ``labels()`` takes a lock and builds a key on
        # every call, on the path of every request.
        self._routed_children: dict[str, Any] = {}

    def count_routed(self, url: str) -> None:
        child = self._routed_children.get(url)
        if child is None:
            child = self._routed_children[url] = self.routed.labels(url)
        child.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ReplicaCollector:
    """Each replica's state, read from the replica set when Prometheus scrapes."""

    def __init__(self, replicas: ReplicaSet) -> None:
        self._replicas = replicas

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(PREFIX + "replica_healthy",
                                    "1 while a replica is in rotation.", labels=["replica"])
        in_flight = GaugeMetricFamily(PREFIX + "replica_in_flight", "Requests in flight to "
                                      "a replica through this router.", labels=["replica"])
        ejections = CounterMetricFamily(PREFIX + "ejections", "Times a replica was taken "
                                        "out of rotation.", labels=["replica"])
        for replica in self._replicas.replicas.values():
            healthy.add_metric([replica.url], 1 if replica.healthy else 0)
            in_flight.add_metric([replica.url], replica.in_flight)
            ejections.add_metric([replica.url], replica.ejections)
        yield from (healthy, in_flight, ejections)
