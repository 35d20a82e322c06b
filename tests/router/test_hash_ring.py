"""Consistent hashing with bounded load."""

from __future__ import annotations

from collections import Counter

from pagedserve.router.hash_ring import HashRing, load_bound
from pagedserve.router.policies import PrefixAffinity
from pagedserve.router.prefix_owners import PrefixOwners
from pagedserve.router.replicas import ReplicaSet
from pagedserve.router.router_config import RouterConfig

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


def test_the_load_bound() -> None:
    # 6 in flight over 3 members, factor 1.25: ceil(1.25 * 7 / 3) = 3 each at most.
    assert load_bound(6, 3, 1.25) == 3
    assert load_bound(0, 2, 1.0) == 1
    # The slack: 3 in flight on one member and none elsewhere is no reason to move yet.
    assert load_bound(3, 2, 1.25, least_load=0, slack=8) == 8
    assert load_bound(30, 2, 1.25, least_load=10, slack=8) == 20


def test_prefix_owners_count_and_forget_the_least_recent() -> None:
    owners = PrefixOwners(capacity=3)
    for key, url in ((b"k1", "a"), (b"k2", "b"), (b"k3", "a")):
        owners.assign(key, url)
    assert owners.bound(2, 1.0) == 2  # a fourth prefix: ceil(4 / 2)
    assert owners.owner(b"k1") == "a"  # k1 is now the most recent
    owners.assign(b"k4", "b")  # evicts k2, the least recent
    assert (owners.owner(b"k2"), len(owners), owners.counts()) == (None, 3, {"a": 2, "b": 1})
    owners.assign(b"k1", "b")  # moved
    assert owners.counts() == {"a": 1, "b": 2}


def place_eight_ring_skewed_prefixes(**overrides: float) -> dict[str, int]:
    """Places 8 prefixes, 6 of whose ring homes are the first replica; the count per replica."""
    urls = MEMBERS[:2]
    ring = HashRing(urls)
    on_first = [k for k in KEYS if next(ring.walk(k)) == urls[0]][:6]
    on_second = [k for k in KEYS if next(ring.walk(k)) == urls[1]][:2]
    config = RouterConfig(replicas=urls, **overrides)
    policy, replicas = PrefixAffinity(config), ReplicaSet(config)
    for key in on_first + on_second:
        assert policy.route(replicas, key).affinity == "new"
    return policy.owners.counts()


def test_new_prefixes_split_evenly_by_default() -> None:
    # The bar: no replica above 60% of 8 equally popular prefixes (5 would be 62.5%).
    assert place_eight_ring_skewed_prefixes() == {MEMBERS[0]: 4, MEMBERS[1]: 4}
    # A looser bound lets the ring's choice win: 5 and 3, one replica caching more prefixes.
    assert place_eight_ring_skewed_prefixes(prefix_load_factor=1.5) == {MEMBERS[0]: 5,
                                                                        MEMBERS[1]: 3}
