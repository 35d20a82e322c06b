"""Routing policies: given a request's key and the replicas, the order to try them in.

The first replica is the choice; the rest are where a retry goes. ``prefix`` reports whether
its choice is the key's home on the ring (a cache-affinity hit).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from pagedserve.router.config import RouterConfig
from pagedserve.router.hash_ring import HashRing, bounded_choice, load_bound
from pagedserve.router.replicas import Replica, ReplicaSet


@dataclass(slots=True)
class Route:
    replicas: list[Replica]
    affinity_hit: bool = False


class RoundRobin:
    def __init__(self) -> None:
        self._counter = itertools.count()

    def route(self, replicas: ReplicaSet, key: bytes | None) -> Route:
        healthy = replicas.healthy()
        if not healthy:
            return Route([])
        start = next(self._counter) % len(healthy)
        return Route(healthy[start:] + healthy[:start])


class LeastLoad:
    def __init__(self, config: RouterConfig) -> None:
        self.config = config

    def route(self, replicas: ReplicaSet, key: bytes | None) -> Route:
        healthy = replicas.healthy()
        return Route(sorted(healthy, key=lambda r: (r.saturated(self.config), r.load())))


class PrefixAffinity:
    """Consistent hashing with bounded load on the prefix key; saturated replicas skipped."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._ring = HashRing([])
        self._members: frozenset[str] = frozenset()
        self._least_load = LeastLoad(config)

    def route(self, replicas: ReplicaSet, key: bytes | None) -> Route:
        if key is None:
            return self._least_load.route(replicas, None)
        self._refresh(replicas)
        healthy = {r.url: r for r in replicas.healthy()}
        order = [healthy[url] for url in self._ring.walk(key) if url in healthy]
        if not order:
            return Route([])
        total = sum(r.in_flight for r in order)
        bound = load_bound(total, len(order), self.config.load_factor)
        open_ = [r.url for r in order if not r.saturated(self.config)]
        chosen = bounded_choice(open_, lambda url: healthy[url].in_flight, bound)
        if chosen is None:  # every replica saturated or at its bound: the least loaded
            chosen = self._least_load.route(replicas, None).replicas[0].url
        first = healthy[chosen]
        rest = [r for r in order if r is not first]
        return Route([first, *rest], affinity_hit=first is order[0])

    def _refresh(self, replicas: ReplicaSet) -> None:
        members = frozenset(replicas.replicas)
        if members != self._members:
            self._ring = HashRing(sorted(members))
            self._members = members


def make_policy(config: RouterConfig) -> RoundRobin | LeastLoad | PrefixAffinity:
    if config.policy == "round-robin":
        return RoundRobin()
    if config.policy == "least-load":
        return LeastLoad(config)
    return PrefixAffinity(config)
