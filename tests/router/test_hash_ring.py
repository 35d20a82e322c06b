"""Consistent hashing with bounded load."""

from __future__ import annotations

from collections import Counter

from pagedserve.router.hash_ring import HashRing, bounded_choice, load_bound

MEMBERS = [f"http://10.0.0.{i}:8000" for i in range(1, 5)]
KEYS = [f"prefix-{i}".encode() for i in range(400)]


def homes(ring: HashRing) -> dict[bytes, str]:
    return {key: next(ring.walk(key)) for key in KEYS}


def test_walk_visits_every_member_once_from_the_key_owner() -> None:
    ring = HashRing(MEMBERS)
    for key in KEYS[:20]:
        assert sorted(ring.walk(key)) == sorted(MEMBERS)
    assert list(HashRing([]).walk(b"x")) == []


def test_keys_spread_and_a_leaving_member_moves_only_its_own_keys() -> None:
    before = homes(HashRing(MEMBERS))
    counts = Counter(before.values())
    assert set(counts) == set(MEMBERS)
    assert max(counts.values()) < 2 * len(KEYS) / len(MEMBERS)
    after = homes(HashRing(MEMBERS[1:]))
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == MEMBERS[0]}


def test_bounded_load_skips_a_member_at_its_bound() -> None:
    # 6 in flight over 3 members, factor 1.25: ceil(1.25 * 7 / 3) = 3 each at most.
    assert load_bound(6, 3, 1.25) == 3
    loads = {"a": 3, "b": 2, "c": 1}
    assert bounded_choice(["a", "b", "c"], loads.__getitem__, 3) == "b"
    assert bounded_choice(["a"], loads.__getitem__, 3) is None
    assert load_bound(0, 2, 1.0) == 1
