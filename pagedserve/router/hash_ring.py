"""Consistent hashing with bounded load (Mirrokni, Thorup and Zadimoghaddam, 2016).

Each replica owns ``VIRTUAL_NODES`` points on a 64-bit ring; a key belongs to the first point
clockwise from its own position. A replica joining or leaving moves only its own keys. The
bound: walking clockwise, a replica is skipped while taking one more request would put it
above ``load_factor`` × the mean load (and ``slack`` above the least loaded replica), so a hot
prefix spills to its neighbours instead of piling onto one replica.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Iterator

VIRTUAL_NODES = 64


def ring_position(data: bytes) -> int:
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big")


class HashRing:
    def __init__(self, members: Iterable[str]) -> None:
        points = sorted((ring_position(f"{member}#{i}".encode()), member)
                        for member in members for i in range(VIRTUAL_NODES))
        self._positions = [p for p, _ in points]
        self._members = [m for _, m in points]

    def walk(self, key: bytes) -> Iterator[str]:
        """Every member once, in ring order starting from the owner of ``key``."""
        if not self._members:
            return
        start = bisect.bisect(self._positions, ring_position(key))
        seen: set[str] = set()
        count = len(self._members)
        for offset in range(count):
            member = self._members[(start + offset) % count]
            if member not in seen:
                seen.add(member)
                yield member


def load_bound(total_load: int, num_members: int, load_factor: float, least_load: int = 0,
               slack: int = 0) -> int:
    """The most requests one member may hold after one more arrives: ``load_factor`` × the
    mean, but never less than the least loaded member's load + ``slack`` (a few requests more
    than an idle neighbour is no hot spot: an engine batches them, and moving them would cost
    their cached prefix)."""
    mean_bound = math.ceil(load_factor * (total_load + 1) / max(num_members, 1))
    return max(1, mean_bound, least_load + slack)

