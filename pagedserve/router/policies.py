"""Routing policies: given a request's key and the replicas, the order to try them in.

The first replica is the choice; the rest are where a retry goes. ``prefix`` also reports
what it did with the request's prefix (``Route.affinity``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

from pagedserve.router.hash_ring import HashRing, load_bound
from pagedserve.router.prefix_owners import PrefixOwners
from pagedserve.router.replicas import Replica, ReplicaSet
from pagedserve.router.router_config import RouterConfig

# What the prefix policy did with a request's prefix: sent it where it went before, elsewhere
# (that replica was saturated, over its bound or gone), or placed a prefix it had not seen.
AFFINITY_HIT, AFFINITY_MISS, AFFINITY_NEW = "hit", "miss", "new"


@dataclass(slots=True)
class Route:
    replicas: list[Replica]
    affinity: str = ""


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
    """A prefix goes where it went before (its blocks are cached there) unless that replica
    is saturated or over its load bound; a new prefix is placed by consistent hashing with a
    bound on each replica's share of the recent prefixes."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self._ring = HashRing([])
        self._members: frozenset[str] = frozenset()
        self._least_load = LeastLoad(config)
        self.owners = PrefixOwners(config.max_tracked_prefixes)

    def route(self, replicas: ReplicaSet, key: bytes | None) -> Route:
        if key is None:
            return self._least_load.route(replicas, None)
        self._refresh(replicas)
        healthy = {r.url: r for r in replicas.healthy()}
        order = [healthy[url] for url in self._ring.walk(key) if url in healthy]
        if not order:
            return Route([])
        fits = self._fits(order)
        owner = healthy.get(self.owners.owner(key) or "")
        if owner is not None and fits(owner):
            chosen, affinity = owner, AFFINITY_HIT
        else:
            affinity = AFFINITY_NEW if owner is None else AFFINITY_MISS
            chosen = self._place(key, order, fits, placing=owner is None)
        return Route([chosen, *(r for r in order if r is not chosen)], affinity)

    def _fits(self, order: list[Replica]) -> Callable[[Replica], bool]:
        """Whether a replica may take one more request: not saturated, under the bound."""
        total = sum(r.in_flight for r in order)
        least = min(r.in_flight for r in order)
        bound = load_bound(total, len(order), self.config.load_factor, least,
                           self.config.spill_threshold)
        return lambda r: not r.saturated(self.config) and r.in_flight + 1 <= bound

    def _place(self, key: bytes, order: list[Replica], fits: Callable[[Replica], bool],
               placing: bool) -> Replica:
        """The replica for a new prefix (recorded as its owner), or where a known prefix goes
        while its owner cannot take it (the owner stays)."""
        open_ = [r for r in order if fits(r)]
        if not open_:  # every replica saturated or at its bound: the least loaded
            return min(order, key=lambda r: (r.saturated(self.config), r.load()))
        if not placing:
            return open_[0]
        bound = self.owners.bound(len(order), self.config.prefix_load_factor)
        chosen = next((r for r in open_ if self.owners.count(r.url) + 1 <= bound), open_[0])
        self.owners.assign(key, chosen.url)
        return chosen

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
