from __future__ import annotations

from engine_fakes import make_group

from pagedserve.server.engine.core.block_manager import AllocStatus, BlockManager
from pagedserve.server.engine.core.prefix_cache import (
    PrefixCacheStats,
    hash_block_tokens,
    max_cache_hit_blocks,
    new_block_hashes,
)
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

BS = 4


def test_hash_chains_parent_tokens_and_extra_key() -> None:
    first = hash_block_tokens(None, [1, 2, 3, 4])
    assert first == hash_block_tokens(None, (1, 2, 3, 4))
    assert first.token_ids == (1, 2, 3, 4) and first.extra_key is None
    second = hash_block_tokens(first, [5, 6, 7, 8])
    other_parent = hash_block_tokens(hash_block_tokens(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert second.token_ids == other_parent.token_ids
    assert second != other_parent
    assert hash_block_tokens(None, [1, 2, 3, 4], "a") != first
    assert hash_block_tokens(None, [1, 2, 3, 4], "") != first
    assert hash_block_tokens(None, [1, 2, 3, 4], "a") != hash_block_tokens(None, [1, 2, 3, 4], "b")


def test_only_full_blocks_are_hashed_and_the_chain_extends() -> None:
    tokens = list(range(10))
    hashes = new_block_hashes(tokens, BS, [], None)
    assert [h.token_ids for h in hashes] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert new_block_hashes(tokens, BS, hashes, None) == []
    more = new_block_hashes([*tokens, 10, 11], BS, hashes, None)
    assert [h.token_ids for h in more] == [(8, 9, 10, 11)]
    assert more[0] == hash_block_tokens(hashes[1], [8, 9, 10, 11])


def test_last_prompt_token_is_never_a_hit() -> None:
    assert max_cache_hit_blocks(8, 4) == 1  # a full-prompt hit recomputes its last block
    assert max_cache_hit_blocks(9, 4) == 2
    assert max_cache_hit_blocks(1, 4) == 0


def test_stats_hit_rate() -> None:
    stats = PrefixCacheStats()
    assert stats.hit_rate == 0.0
    stats.record(10, 8)
    stats.record(6, 0)
    assert (stats.num_requests, stats.num_queried_tokens, stats.num_hit_tokens) == (2, 16, 8)
    assert stats.hit_rate == 0.5


def manager(num_blocks: int = 16) -> BlockManager:
    return BlockManager(BS, num_blocks, 0, watermark=0.0, enable_prefix_caching=True)


def admit(bm: BlockManager, group: SequenceGroup) -> Sequence:
    assert bm.can_allocate(group) is AllocStatus.OK
    bm.allocate(group)
    (seq,) = group.seqs
    seq.status = SequenceStatus.RUNNING
    return seq


def compute_all(bm: BlockManager, seq: Sequence, salt: str | None = None) -> None:
    bm.append_slots(seq, seq.num_uncomputed_tokens)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_computed_blocks(seq, salt)


def test_hit_reuses_the_exact_block_ids() -> None:
    bm = manager()
    first = admit(bm, make_group("a", list(range(10)), 0, BS))
    assert first.block_table == [0, 1, 2]
    compute_all(bm, first)
    second = admit(bm, make_group("b", [*range(8), 50, 51, 52], 1, BS))
    assert second.block_table == [0, 1, 3]
    assert (second.num_computed_tokens, second.num_cached_tokens) == (8, 8)
    assert [bm.device_pool.ref_cnt(b) for b in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert (bm.prefix_cache_stats.num_queried_tokens, bm.prefix_cache_stats.num_hit_tokens) == (
        21, 8)
    bm.check_integrity([first, second])


def test_full_prompt_hit_recomputes_its_last_block() -> None:
    bm = manager()
    first = admit(bm, make_group("a", list(range(8)), 0, BS))
    compute_all(bm, first)
    again = admit(bm, make_group("b", list(range(8)), 1, BS))
    assert again.block_table == [0, 2]
    assert again.num_computed_tokens == 4 and again.num_uncomputed_tokens == 4


def test_hit_revives_freed_blocks_and_counts_them_as_needed() -> None:
    bm = manager(num_blocks=3)
    first = admit(bm, make_group("a", list(range(12)), 0, BS))
    compute_all(bm, first)
    bm.free(first)
    assert bm.device_pool.num_cached_free_blocks == 3
    group = make_group("b", list(range(12)), 1, BS)
    # Two hit blocks leave the free queue and one new block is taken: all three.
    assert bm._num_free_blocks_to_admit(group) == 3
    again = admit(bm, group)
    assert again.block_table[:2] == [0, 1]
    assert again.num_cached_tokens == 8
    bm.check_integrity([again])


def test_salt_separates_tenants() -> None:
    bm = manager()
    first = admit(bm, make_group("a", list(range(9)), 0, BS, cache_salt="x"))
    compute_all(bm, first, "x")
    other = admit(bm, make_group("b", list(range(9)), 1, BS, cache_salt="y"))
    same = admit(bm, make_group("c", list(range(9)), 2, BS, cache_salt="x"))
    assert other.num_cached_tokens == 0
    assert same.num_cached_tokens == 8 and same.block_table[:2] == first.block_table[:2]


def test_generated_tokens_fill_blocks_that_get_cached() -> None:
    bm = manager()
    seq = admit(bm, make_group("a", [1, 2, 3], 0, BS))
    compute_all(bm, seq)
    for token in (4, 5):
        seq.append_token(token, 0.0)
        compute_all(bm, seq)
    assert seq.num_registered_blocks == 1
    assert bm.device_pool.num_cached_blocks == 1
    hit = admit(bm, make_group("b", [1, 2, 3, 4, 9], 1, BS))
    assert hit.block_table[0] == seq.block_table[0] and hit.num_cached_tokens == 4


def test_uncomputed_full_blocks_are_not_cached() -> None:
    bm = manager()
    seq = admit(bm, make_group("a", list(range(12)), 0, BS))
    bm.append_slots(seq, 6)
    seq.num_computed_tokens = 6  # a chunk: only block 0 is fully computed
    bm.cache_computed_blocks(seq, None)
    assert bm.device_pool.num_cached_blocks == 1
    other = admit(bm, make_group("b", list(range(12)), 1, BS))
    assert other.num_cached_tokens == 4


def test_evicted_block_is_no_longer_a_hit() -> None:
    bm = manager(num_blocks=2)
    first = admit(bm, make_group("a", [1, 2, 3, 4, 5], 0, BS))
    compute_all(bm, first)
    bm.free(first)
    filler = admit(bm, make_group("b", list(range(20, 28)), 1, BS))  # evicts both blocks
    assert bm.device_pool.num_evictions == 1
    bm.free(filler)
    again = admit(bm, make_group("c", [1, 2, 3, 4, 5], 2, BS))
    assert again.num_cached_tokens == 0


def test_a_group_pins_every_hit_before_it_takes_a_new_block() -> None:
    """Two waiting samples of one request (after a recompute preemption): the first one's new
    blocks must not evict a free cached block that the second one hits. Here the second hits
    [0, 1, 5]: 0 and 1 free (cached by "a"), 5 in use by "b", whose own copy of that prefix
    is an unregistered duplicate; evicting 1 would cut the chain and leave 5 unbudgeted."""
    bm = manager(10)
    p, q, r = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    a = admit(bm, make_group("a", [*p, *q, 20], 0, BS))
    b = admit(bm, make_group("b", [*p, *q, *r, 21], 1, BS))
    c = admit(bm, make_group("c", [*range(30, 38), 22], 2, BS))
    assert (a.block_table, b.block_table, c.block_table) == ([0, 1, 2], [3, 4, 5, 6], [7, 8, 9])
    for seq in (a, b, c):
        compute_all(bm, seq)
    for seq in (a, c):
        seq.status = SequenceStatus.FINISHED_STOPPED
        bm.free(seq)
    first = Sequence(10, [*range(40, 48), 23], BS)
    second = Sequence(11, [*p, *q, *r, 24], BS)
    group = SequenceGroup("g", [first, second], make_group("x", [0], 0, BS).sampling_params, 0.0)
    assert bm.can_allocate(group) is AllocStatus.OK
    bm.allocate(group)
    assert second.block_table[:3] == [0, 1, 5] and second.num_cached_tokens == 12
    assert len(set(first.block_table) | set(second.block_table)) == 7
    assert bm.device_pool.num_free_blocks == 0
