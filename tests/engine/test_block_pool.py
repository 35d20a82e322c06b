from __future__ import annotations

import pytest

from pagedserve.common.engine_errors import BlockAllocationError
from pagedserve.server.engine.core.block import FreeBlockQueue, KVCacheBlock
from pagedserve.server.engine.core.block_pool import BlockPool
from pagedserve.server.engine.core.prefix_cache import BlockHash, hash_block_tokens


def ids(queue: FreeBlockQueue) -> list[int]:
    return [block.block_id for block in queue]


def test_free_queue_orders_and_removes_in_the_middle() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert ids(queue) == [1, 3]
    queue.appendleft(blocks[4])
    queue.append(blocks[0])
    assert ids(queue) == [4, 1, 3, 0]
    assert [queue.popleft().block_id for _ in range(4)] == [4, 1, 3, 0]
    assert len(queue) == 0 and queue.peek() is None
    with pytest.raises(IndexError):
        queue.popleft()


def test_free_queue_rejects_double_insert_and_foreign_remove() -> None:
    block = KVCacheBlock(7)
    queue = FreeBlockQueue([block])
    with pytest.raises(ValueError, match="block 7 is already in the free queue"):
        queue.append(block)
    queue.popleft()
    with pytest.raises(ValueError, match="block 7 is not in the free queue"):
        queue.remove(block)


def test_allocate_in_id_order_and_reuse_freed_uncached_first() -> None:
    pool = BlockPool(4)
    assert [pool.allocate() for _ in range(3)] == [0, 1, 2]
    pool.free(1)
    assert (pool.num_free_blocks, pool.num_used_blocks) == (2, 2)
    assert pool.allocate() == 1
    assert pool.allocate() == 3


def test_exhausted_pool_raises() -> None:
    pool = BlockPool(1, name="cpu")
    pool.allocate()
    with pytest.raises(BlockAllocationError) as info:
        pool.allocate()
    assert str(info.value) == "cpu pool is out of blocks (all 1 are in use)"


def test_double_free_raises() -> None:
    pool = BlockPool(2)
    block_id = pool.allocate()
    pool.free(block_id)
    with pytest.raises(BlockAllocationError) as info:
        pool.free(block_id)
    assert str(info.value) == "double free of device block 0"


@pytest.mark.parametrize("block_id", [-1, 2, "0"])
def test_unknown_block_id_raises(block_id: object) -> None:
    pool = BlockPool(2)
    with pytest.raises(BlockAllocationError) as info:
        pool.free(block_id)  # type: ignore[arg-type]
    assert str(info.value) == f"unknown device block id {block_id!r} (the pool has 2 blocks)"


def test_ref_counts_share_and_release() -> None:
    pool = BlockPool(2)
    block_id = pool.allocate()
    pool.incref(block_id)
    pool.free(block_id)
    assert pool.ref_cnt(block_id) == 1 and pool.num_free_blocks == 1
    pool.free(block_id)
    assert pool.ref_cnt(block_id) == 0 and pool.num_free_blocks == 2


def test_incref_of_free_uncached_block_raises() -> None:
    pool = BlockPool(2)
    with pytest.raises(BlockAllocationError) as info:
        pool.incref(1)
    assert str(info.value) == "device block 1 is free and caches nothing; allocate instead"


def chain(*blocks: list[int]) -> list[BlockHash]:
    hashes: list[BlockHash] = []
    for tokens in blocks:
        hashes.append(hash_block_tokens(hashes[-1] if hashes else None, tokens))
    return hashes


def cached_pool(num_blocks: int) -> BlockPool:
    return BlockPool(num_blocks, enable_caching=True)


def test_cached_free_block_is_revived_by_a_hit() -> None:
    pool = cached_pool(3)
    (h0,) = chain([1, 2])
    block_id = pool.allocate()
    assert pool.cache_block(block_id, h0)
    pool.free(block_id)
    assert (pool.num_free_blocks, pool.num_cached_blocks, pool.num_cached_free_blocks) == (
        3, 1, 1)
    assert pool.get_cached_block(h0) == block_id
    pool.incref(block_id)
    assert (pool.num_free_blocks, pool.num_cached_free_blocks, pool.ref_cnt(block_id)) == (
        2, 0, 1)


def test_eviction_is_lru_and_tail_of_chain_first() -> None:
    pool = cached_pool(6)
    a = [pool.allocate() for _ in range(3)]  # blocks 0, 1, 2
    b = [pool.allocate() for _ in range(2)]  # blocks 3, 4
    for block_id, block_hash in zip(a, chain([1], [2], [3]), strict=True):
        pool.cache_block(block_id, block_hash)
    for block_id, block_hash in zip(b, chain([9], [8]), strict=True):
        pool.cache_block(block_id, block_hash)
    # Request a finishes first, then b; each frees its blocks last block first.
    for block_id in reversed(a):
        pool.free(block_id)
    for block_id in reversed(b):
        pool.free(block_id)
    assert pool.free_block_ids() == [5, 2, 1, 0, 4, 3]
    allocated = [pool.allocate() for _ in range(6)]
    assert allocated == [5, 2, 1, 0, 4, 3]
    assert pool.num_evictions == 5 and pool.num_cached_blocks == 0


def test_freed_uncached_block_goes_before_cached_ones() -> None:
    pool = cached_pool(2)
    cached, plain = pool.allocate(), pool.allocate()
    pool.cache_block(cached, chain([1])[0])
    pool.free(cached)
    pool.free(plain)
    assert pool.free_block_ids() == [plain, cached]


def test_hash_collision_is_never_a_hit() -> None:
    pool = cached_pool(2)
    stored = BlockHash(b"same-digest", (1, 2, 3))
    colliding = BlockHash(b"same-digest", (4, 5, 6))
    other_salt = BlockHash(b"same-digest", (1, 2, 3), "tenant-b")
    block_id = pool.allocate()
    pool.cache_block(block_id, stored)
    assert hash(stored) == hash(colliding)
    assert pool.get_cached_block(colliding) is None
    assert pool.get_cached_block(other_salt) is None
    assert pool.get_cached_block(BlockHash(b"same-digest", (1, 2, 3))) == block_id


def test_first_block_cached_under_a_hash_stays_the_entry() -> None:
    pool = cached_pool(2)
    (h0,) = chain([5, 5])
    first, second = pool.allocate(), pool.allocate()
    assert pool.cache_block(first, h0)
    assert not pool.cache_block(second, h0)
    assert pool.cache_block(first, h0)  # idempotent
    assert pool.get_cached_block(h0) == first
    assert pool.blocks[second].block_hash is None


def test_caching_disabled_caches_nothing() -> None:
    pool = BlockPool(1)
    block_id = pool.allocate()
    assert not pool.cache_block(block_id, chain([1])[0])
    assert pool.num_cached_blocks == 0


def test_cannot_cache_a_free_block() -> None:
    pool = cached_pool(1)
    with pytest.raises(BlockAllocationError) as info:
        pool.cache_block(0, chain([1])[0])
    assert str(info.value) == "cannot cache free device block 0"


def test_never_used_blocks_come_after_freed_uncached_and_before_cached_ones() -> None:
    pool = cached_pool(5)
    a, b, _ = (pool.allocate() for _ in range(3))  # 0, 1, 2; blocks 3 and 4 never used
    pool.cache_block(a, chain([7])[0])
    pool.free(a)  # cached: reused last
    pool.free(b)  # caches nothing: reused first
    assert pool.free_block_ids() == [1, 3, 4, 0]
    assert (pool.num_free_blocks, pool.num_used_blocks, pool.num_unused_blocks) == (4, 1, 2)
    assert [pool.allocate() for _ in range(4)] == [1, 3, 4, 0]
    assert pool.num_evictions == 1 and pool.num_cached_blocks == 0


def test_a_huge_pool_makes_its_blocks_as_they_are_first_used() -> None:
    # A small model on a large GPU: tens of millions of blocks, none made at start-up.
    pool = BlockPool(50_000_000)
    assert (len(pool.blocks), pool.num_free_blocks, pool.num_used_blocks) == (0, 50_000_000, 0)
    assert [pool.allocate() for _ in range(2)] == [0, 1]
    assert len(pool.blocks) == 2 and pool.ref_cnt(49_999_999) == 0
    with pytest.raises(BlockAllocationError) as info:
        pool.cache_block(1234, chain([1])[0])
    assert str(info.value) == "cannot cache free device block 1234"
    with pytest.raises(BlockAllocationError) as info:
        pool.free(49_999_999)
    assert str(info.value) == "double free of device block 49999999"
