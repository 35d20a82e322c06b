"""Which replica each recent prefix key was placed on: an LRU table with a count per replica.

A prefix keeps its replica for as long as the router sees it, so that its requests find their
blocks cached; a new prefix goes to the first replica clockwise from its key whose share of
the recent prefixes stays under the bound (consistent hashing with bounded load, on prefixes).
Without the count a handful of hot prefixes could hash onto one replica and thrash its cache
while the other idles.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict


class PrefixOwners:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._owners: OrderedDict[bytes, str] = OrderedDict()
        self._counts: Counter[str] = Counter()

    def __len__(self) -> int:
        return len(self._owners)

    def owner(self, key: bytes) -> str | None:
        """The key's replica, marking the key as recently used."""
        url = self._owners.get(key)
        if url is not None:
            self._owners.move_to_end(key)
        return url

    def count(self, url: str) -> int:
        return self._counts[url]

    def counts(self) -> dict[str, int]:
        """Prefixes owned per replica (those owning any)."""
        return {url: n for url, n in self._counts.items() if n}

    def bound(self, num_members: int, load_factor: float) -> int:
        """The most prefixes one replica may own once one more is placed."""
        return max(1, math.ceil(load_factor * (len(self._owners) + 1) / max(num_members, 1)))

    def assign(self, key: bytes, url: str) -> None:
        previous = self._owners.pop(key, None)
        if previous is not None:
            self._counts[previous] -= 1
        self._owners[key] = url
        self._counts[url] += 1
        if len(self._owners) > self.capacity:
            _, evicted = self._owners.popitem(last=False)
            self._counts[evicted] -= 1
