from __future__ import annotations

import pytest

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.kv_allocation import ContiguousAllocation, PagedAllocation
from pagedserve.server.engine.core.scheduler_stats import PreemptionStats, TokenOccupancy
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup, SequenceStatus


def test_statuses() -> None:
    finished = {s for s in SequenceStatus if s.is_finished}
    assert finished == {SequenceStatus.FINISHED_STOPPED, SequenceStatus.FINISHED_LENGTH,
                        SequenceStatus.FINISHED_ABORTED, SequenceStatus.FINISHED_IGNORED,
                        SequenceStatus.FINISHED_ERROR}
    assert [s.finish_reason for s in SequenceStatus] == [
        None, None, None, "stop", "length", "abort", "length", "error"]


def test_append_token_tracks_tokens_and_cumulative_logprob() -> None:
    seq = Sequence(3, [5, 6], block_size=4)
    seq.append_token(7, -0.25)
    seq.append_token(8, -1.0)
    assert seq.token_ids == [5, 6, 7, 8] and seq.output_token_ids == [7, 8]
    assert (seq.num_tokens, seq.num_prompt_tokens, seq.num_output_tokens) == (4, 2, 2)
    assert seq.last_token_id == 8 and seq.cumulative_logprob == -1.25
    assert seq.prompt_token_ids == [5, 6]


def test_fork_copies_everything_mutable() -> None:
    parent = Sequence(0, [1, 2, 3], block_size=4)
    parent.append_token(4, -0.5)
    parent.block_table = [7]
    parent.num_computed_tokens = 4
    child = parent.fork(9)
    child.append_token(6, -2.0)
    child.block_table.append(8)
    assert child.seq_id == 9 and child.num_computed_tokens == 4
    assert parent.token_ids == [1, 2, 3, 4] and child.token_ids == [1, 2, 3, 4, 6]
    assert parent.block_table == [7] and child.block_table == [7, 8]
    assert parent.output_token_ids == [4] and child.output_token_ids == [4, 6]
    assert child.cumulative_logprob == -2.5 and parent.cumulative_logprob == -0.5


def test_reset_for_recompute_keeps_tokens() -> None:
    seq = Sequence(0, [1, 2], block_size=4)
    seq.append_token(3, 0.0)
    seq.block_table, seq.num_computed_tokens, seq.num_cached_tokens = [4], 3, 2
    seq.status = SequenceStatus.RUNNING
    seq.reset_for_recompute()
    assert (seq.status, seq.block_table, seq.num_computed_tokens, seq.num_cached_tokens) == (
        SequenceStatus.WAITING, [], 0, 0)
    assert seq.token_ids == [1, 2, 3] and seq.num_uncomputed_tokens == 3


def test_group_views() -> None:
    seqs = [Sequence(i, [1, 2], block_size=4) for i in range(3)]
    group = SequenceGroup("r", seqs, SamplingParams(n=3), arrival_time=5.0, cache_salt="s")
    seqs[1].status = SequenceStatus.RUNNING
    seqs[2].status = SequenceStatus.FINISHED_STOPPED
    assert group.prompt_token_ids == [1, 2] and group.arrival_time == 5.0
    assert group.get_seqs(SequenceStatus.RUNNING) == [seqs[1]]
    assert group.num_unfinished_seqs() == 2 and not group.is_finished()
    assert group.find(2) is seqs[2]
    group.remove(0)
    with pytest.raises(KeyError):
        group.find(0)
    with pytest.raises(ValueError, match="request 'r' already has sequence 1"):
        group.add(Sequence(1, [1], block_size=4))
    with pytest.raises(ValueError, match="request 'x' needs at least one sequence"):
        SequenceGroup("x", [], SamplingParams(), 0.0)


@pytest.mark.parametrize(("params", "num_seqs", "expected"), [
    (SamplingParams(), 1, 1),
    (SamplingParams(n=2, best_of=4), 1, 4),  # forks still to come
    (SamplingParams(n=2, best_of=4), 4, 4),
    (SamplingParams(n=3, temperature=0.0, use_beam_search=True), 1, 3),
])
def test_max_num_running_seqs(params: SamplingParams, num_seqs: int, expected: int) -> None:
    group = SequenceGroup("r", [Sequence(i, [1], 4) for i in range(num_seqs)], params, 0.0)
    assert group.max_num_running_seqs() == expected


def test_a_forked_request_that_lost_a_sequence_has_no_forks_to_come() -> None:
    # best_of 4 forked on its first token, then one sequence was dropped: 3 can run, not 4.
    seqs = [Sequence(i, [1], 4) for i in range(4)]
    for seq in seqs:
        seq.append_token(7, 0.0)
    group = SequenceGroup("r", seqs, SamplingParams(n=2, best_of=4), 0.0)
    group.remove(2)
    assert group.max_num_running_seqs() == 3


def test_allocation_policies() -> None:
    paged = PagedAllocation(16)
    contiguous = ContiguousAllocation(16, max_model_len=2048)
    assert [paged.num_blocks_for(n) for n in (1, 16, 17)] == [1, 1, 2]
    assert [contiguous.num_blocks_for(n) for n in (1, 2048, 2049)] == [128, 128, 129]
    assert paged.shares_blocks and not contiguous.shares_blocks


def test_occupancy_counts_shared_blocks_once() -> None:
    a = Sequence(0, list(range(6)), block_size=4)
    b = Sequence(1, list(range(7)), block_size=4)
    c = Sequence(2, list(range(9)), block_size=4)
    a.block_table, b.block_table, c.block_table = [0, 1], [0, 1], [0, 2, 3]
    occupancy = TokenOccupancy.of([a, b, c], block_size=4)
    # Block 0 full; block 1 holds b's 3 tokens (a's 2 are the same slots); block 2 full;
    # block 3 holds 1.
    assert (occupancy.num_token_slots, occupancy.num_real_tokens) == (16, 12)
    assert occupancy.utilization == 0.75
    assert TokenOccupancy.of([], 4).utilization == 1.0


def test_preemption_stats_total() -> None:
    stats = PreemptionStats(num_recompute=2, num_swap=3)
    assert stats.total == 5
