from __future__ import annotations

import pytest
from engine_fakes import make_group

from pagedserve.common.engine_errors import BlockAllocationError
from pagedserve.server.engine.core.block_manager import AllocStatus, BlockManager
from pagedserve.server.engine.core.kv_allocation import ContiguousAllocation, make_kv_allocation
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus

BS = 4


def running(bm: BlockManager, prompt_len: int, seq_id: int = 0) -> Sequence:
    group = make_group(f"r{seq_id}", list(range(prompt_len)), seq_id, BS)
    bm.allocate(group)
    (seq,) = group.seqs
    seq.status = SequenceStatus.RUNNING
    return seq


def computed(seq: Sequence) -> Sequence:
    seq.num_computed_tokens = seq.num_tokens
    return seq


def test_allocate_covers_the_prompt() -> None:
    bm = BlockManager(BS, 8, 0)
    seq = running(bm, 9)
    assert seq.block_table == [0, 1, 2]
    assert (seq.num_computed_tokens, seq.num_cached_tokens) == (0, 0)
    bm.check_integrity([seq])


def test_append_slots_allocates_only_when_the_last_block_is_full() -> None:
    bm = BlockManager(BS, 8, 0)
    seq = computed(running(bm, 7))
    seq.append_token(100, 0.0)  # 8 tokens: fits block 1
    assert bm.append_slots(seq, 1) == [] and seq.block_table == [0, 1]
    computed(seq).append_token(101, 0.0)  # 9th token: needs block 2
    assert bm.append_slots(seq, 1) == [] and seq.block_table == [0, 1, 2]
    bm.check_integrity([seq])


def test_append_slots_rejects_bad_counts() -> None:
    bm = BlockManager(BS, 8, 0)
    seq = running(bm, 5)
    with pytest.raises(ValueError) as info:
        bm.append_slots(seq, 6)
    assert str(info.value) == "num_new_tokens must be in [1, 5] for sequence 0, got 6"


def test_fork_shares_every_block() -> None:
    bm = BlockManager(BS, 8, 0)
    parent = computed(running(bm, 6))
    child = parent.fork(1)
    assert bm.fork(parent, child) == []
    assert child.block_table == parent.block_table == [0, 1]
    assert [bm.device_pool.ref_cnt(b) for b in (0, 1)] == [2, 2]
    bm.check_integrity([parent, child])


def test_copy_on_write_exactly_when_a_shared_block_is_written() -> None:
    bm = BlockManager(BS, 8, 0)
    parent = computed(running(bm, 6))  # block 1 holds 2 of 4 tokens
    child = parent.fork(1)
    bm.fork(parent, child)
    parent.append_token(100, 0.0)
    child.append_token(200, 0.0)
    # The first writer copies the shared partial block; the second then owns the original.
    assert bm.append_slots(parent, 1) == [(1, 2)]
    assert parent.block_table == [0, 2]
    assert bm.append_slots(child, 1) == []
    assert child.block_table == [0, 1]
    assert [bm.device_pool.ref_cnt(b) for b in (0, 1, 2)] == [2, 1, 1]
    bm.check_integrity([parent, child])


def test_no_copy_when_the_shared_last_block_is_full() -> None:
    bm = BlockManager(BS, 8, 0)
    parent = computed(running(bm, 8))
    child = parent.fork(1)
    bm.fork(parent, child)
    for seq, token in ((parent, 100), (child, 200)):
        seq.append_token(token, 0.0)
        assert bm.append_slots(seq, 1) == []
    assert (parent.block_table, child.block_table) == ([0, 1, 2], [0, 1, 3])


def test_can_append_counts_one_copy_per_shared_block_and_new_blocks() -> None:
    bm = BlockManager(BS, 3, 0)
    parent = computed(running(bm, 6))
    child = parent.fork(1)
    bm.fork(parent, child)
    group = SequenceGroup("g", [parent, child], make_group("x", [1], 9, BS).sampling_params, 0)
    for seq, token in ((parent, 100), (child, 200)):
        seq.append_token(token, 0.0)
    assert bm._num_blocks_to_append_all(group.seqs, bm.device_pool) == 1
    assert bm.can_append_slots(group)  # two writers of block 1, one copy: one free block
    for seq in group.seqs:
        bm.append_slots(seq, 1)
        computed(seq).append_token(300, 0.0)
    assert bm._num_blocks_to_append_all(group.seqs, bm.device_pool) == 0
    for seq in group.seqs:
        bm.append_slots(seq, 1)
        computed(seq).append_token(400, 0.0)  # 9 tokens: each needs a third block
    assert bm._num_blocks_to_append_all(group.seqs, bm.device_pool) == 2
    assert not bm.can_append_slots(group)


def test_free_releases_shared_blocks_once_per_reference() -> None:
    bm = BlockManager(BS, 8, 0)
    parent = computed(running(bm, 6))
    child = parent.fork(1)
    bm.fork(parent, child)
    bm.free(parent)
    assert parent.block_table == [] and bm.device_pool.num_free_blocks == 6
    bm.free(child)
    assert bm.device_pool.num_free_blocks == 8
    bm.check_integrity([])


def test_swap_round_trip_keeps_shared_blocks_shared() -> None:
    bm = BlockManager(BS, 8, 8)
    parent = computed(running(bm, 6))
    child = parent.fork(1)
    bm.fork(parent, child)
    child.append_token(9, 0.0)
    bm.append_slots(child, 1)  # child: [0, 2]; parent: [0, 1]
    group = SequenceGroup("g", [parent, child], make_group("x", [1], 9, BS).sampling_params, 0)
    assert bm.can_swap_out(group)
    assert bm.swap_out(group) == [(0, 0), (1, 1), (2, 2)]
    for seq in group.seqs:
        seq.status = SequenceStatus.SWAPPED
    assert (parent.block_table, child.block_table) == ([0, 1], [0, 2])
    assert bm.cpu_pool.ref_cnt(0) == 2 and bm.device_pool.num_free_blocks == 8
    bm.check_integrity([], [parent, child])
    assert bm.device_pool.allocate() == 0  # ids come back different: the mapping follows
    assert bm.can_swap_in(group)
    assert bm.swap_in(group) == [(0, 2), (1, 1), (2, 3)]
    for seq in group.seqs:
        seq.status = SequenceStatus.RUNNING
    assert (parent.block_table, child.block_table) == ([2, 1], [2, 3])
    assert bm.device_pool.ref_cnt(2) == 2 and bm.cpu_pool.num_free_blocks == 8
    bm.device_pool.free(0)
    bm.check_integrity([parent, child])


def test_swap_needs_room() -> None:
    bm = BlockManager(BS, 8, 1, watermark=0.0)
    seq = computed(running(bm, 6))
    group = SequenceGroup("g", [seq], make_group("x", [1], 9, BS).sampling_params, 0)
    assert not bm.can_swap_out(group)
    with pytest.raises(BlockAllocationError) as info:
        bm.swap_out(group)
    assert str(info.value) == "request 'g' needs 2 free cpu blocks, 1 are free"


def test_can_swap_in_leaves_room_for_the_next_token_and_the_watermark() -> None:
    bm = BlockManager(BS, 10, 4, watermark=0.1)  # one block of watermark
    seq = computed(running(bm, 8))
    seq.append_token(1, 0.0)  # the next step needs a third block
    group = SequenceGroup("g", [seq], make_group("x", [1], 9, BS).sampling_params, 0)
    bm.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    hold = [bm.device_pool.allocate() for _ in range(6)]  # 4 free: 2 + 1 + watermark 1
    assert bm.can_swap_in(group)
    bm.device_pool.free(hold.pop())
    bm.device_pool.allocate()
    bm.device_pool.allocate()  # 3 free
    assert not bm.can_swap_in(group)
    assert bm.can_swap_in(group, use_watermark=False)


def test_can_allocate_respects_the_watermark() -> None:
    bm = BlockManager(BS, 10, 0, watermark=0.2)  # two blocks kept free
    assert bm.admission_capacity == 8
    assert bm.can_allocate(make_group("big", list(range(33)), 0, BS)) is AllocStatus.NEVER
    running(bm, 16, seq_id=1)  # 4 blocks used, 6 free
    assert bm.can_allocate(make_group("a", list(range(16)), 2, BS)) is AllocStatus.OK
    assert bm.can_allocate(make_group("b", list(range(17)), 3, BS)) is AllocStatus.LATER


def test_contiguous_reserves_max_model_len_and_copies_on_fork() -> None:
    policy = ContiguousAllocation(BS, max_model_len=16)
    bm = BlockManager(BS, 12, 0, policy=policy)
    parent = computed(running(bm, 5))
    assert parent.block_table == [0, 1, 2, 3]
    parent.append_token(1, 0.0)
    assert bm.append_slots(parent, 1) == [] and len(parent.block_table) == 4
    child = parent.fork(1)
    assert bm.can_fork(parent)
    assert bm.fork(parent, child) == [(0, 4), (1, 5)]
    assert child.block_table == [4, 5, 6, 7]
    bm.check_integrity([parent, child])
    bm.fork(parent, parent.fork(2))  # takes the last four blocks
    assert not bm.can_fork(parent)
    with pytest.raises(BlockAllocationError) as info:
        bm.fork(parent, parent.fork(3))
    assert str(info.value) == "fork of sequence 0 needs 4 free device blocks, 0 are free"


def test_contiguous_counts_future_forks_at_admission() -> None:
    bm = BlockManager(BS, 12, 0, policy=ContiguousAllocation(BS, max_model_len=16))
    group = make_group("g", [1, 2], 0, BS, best_of=3)
    assert bm.num_required_blocks(group) == 12
    assert bm.can_allocate(group) is AllocStatus.OK
    assert bm.can_allocate(make_group("h", [1, 2], 1, BS, best_of=4)) is AllocStatus.NEVER


def test_prefix_caching_needs_a_sharing_policy() -> None:
    with pytest.raises(ValueError) as info:
        BlockManager(BS, 4, 0, policy=make_kv_allocation("contiguous", BS, 16),
                     enable_prefix_caching=True)
    assert str(info.value) == "enable_prefix_caching needs a sharing policy, not 'contiguous'"


def test_integrity_check_catches_a_leak_and_a_dangling_table() -> None:
    bm = BlockManager(BS, 4, 0)
    seq = running(bm, 5)
    with pytest.raises(AssertionError, match="device block 0 has ref_cnt 1, block tables "
                                             "reference it 0 times"):
        bm.check_integrity([])
    bm.device_pool.free(1)
    with pytest.raises(AssertionError, match="device block 1 has ref_cnt 0"):
        bm.check_integrity([seq])


def test_integrity_check_catches_a_table_holding_a_block_never_allocated() -> None:
    bm = BlockManager(BS, 4, 0)
    seq = running(bm, 5)  # blocks 0 and 1
    seq.block_table.append(3)
    with pytest.raises(AssertionError, match=r"device block tables hold ids never allocated \[3\]"):
        bm.check_integrity([seq])
    seq.block_table[-1] = 9
    with pytest.raises(AssertionError, match=r"device block tables hold unknown ids \[9\]"):
        bm.check_integrity([seq])
