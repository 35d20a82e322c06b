"""The one input-packing path (``prepare_model_input``): exact token ids, positions, slot
mappings, sequence lengths and block tables for chunked prefill, prefix-cache hits,
copy-on-write forks and swap-in, driven by the real scheduler."""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine_fakes import make_group

from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.core.sequence import SequenceGroup
from pagedserve.server.engine.logits.sampling_plan import SampledBatch, SampledToken, SamplingPlan
from pagedserve.server.engine.worker.model_input import prepare_model_input

BS = 4


@dataclass
class Packed:
    input_ids: list[int]
    positions: list[int]
    slot_mapping: list[int]
    seq_lens: list[int]
    query_start_loc: list[int]
    block_tables: list[list[int]]


def pack(out: SchedulerOutput) -> Packed:
    inp = prepare_model_input(out, BS, "cpu")
    assert inp.attn.query_start_loc.tolist() == inp.query_start_loc
    return Packed(inp.input_ids.tolist(), inp.positions.tolist(),
                  inp.attn.slot_mapping.tolist(), inp.attn.seq_lens.tolist(),
                  inp.query_start_loc, inp.attn.block_tables.tolist())


def make_scheduler(num_blocks: int = 32, num_cpu_blocks: int = 0, *,
                   prefix_caching: bool = False, **config: object) -> Scheduler:
    config.setdefault("max_model_len", 64)
    cache = CacheConfig(block_size=BS, watermark=0.0, enable_prefix_caching=prefix_caching)
    return Scheduler(SchedulerConfig(**config), cache, num_blocks, num_cpu_blocks)


def add(scheduler: Scheduler, request_id: str, prompt: list[int], max_tokens: int = 8,
        **kwargs: object) -> SequenceGroup:
    group = make_group(request_id, prompt, scheduler.new_seq_id(), BS, **kwargs)
    group.sampling_params = replace(group.sampling_params, max_tokens=max_tokens)
    scheduler.add_seq_group(group)
    return group


def finish_step(scheduler: Scheduler, out: SchedulerOutput, token: int = 50) -> None:
    """Applies the step as the engine does, every draw sampling ``token + its index``."""
    starts = prepare_model_input(out, BS, "cpu").query_start_loc if out.scheduled else [0]
    plan = SamplingPlan.of(out, starts)
    # The engine plans before packing: its default starts must be the packing's.
    assert SamplingPlan.of(out).logit_rows() == plan.logit_rows()
    tokens = [SampledToken(d, token + d.index, -1.0, None) for d in plan.draws]
    scheduler.update_from_output(out, SampledBatch(tokens=tokens))
    scheduler.check_integrity()


def test_chunked_prefill_then_decode() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=3)
    add(scheduler, "a", [11, 12, 13, 14, 15, 16])
    out = scheduler.schedule()
    assert pack(out) == Packed([11, 12, 13], [0, 1, 2], [0, 1, 2], [3], [0, 3], [[0, 1]])
    finish_step(scheduler, out)
    out = scheduler.schedule()
    assert pack(out) == Packed([14, 15, 16], [3, 4, 5], [3, 4, 5], [6], [0, 3], [[0, 1]])
    finish_step(scheduler, out, token=77)
    out = scheduler.schedule()
    assert pack(out) == Packed([77], [6], [6], [7], [0, 1], [[0, 1]])


def test_decode_and_prefill_packed_in_one_step() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", [1, 2, 3])
    finish_step(scheduler, scheduler.schedule(), token=60)
    add(scheduler, "b", [5, 6, 7, 8, 9])
    out = scheduler.schedule()
    # a decodes its sampled token at position 3; b's prompt fills blocks 1 and 2.
    assert pack(out) == Packed([60, 5, 6, 7, 8, 9], [3, 0, 1, 2, 3, 4], [3, 4, 5, 6, 7, 8],
                               [4, 5], [0, 1, 6], [[0, 0], [1, 2]])


def test_prefix_hit_computes_only_the_uncached_tail() -> None:
    scheduler = make_scheduler(prefix_caching=True)
    first = add(scheduler, "a", list(range(1, 10)))
    finish_step(scheduler, scheduler.schedule(), token=70)
    assert first.seqs[0].block_table == [0, 1, 2]
    second = add(scheduler, "b", [*range(1, 9), 20, 21])
    out = scheduler.schedule()
    assert second.seqs[0].num_cached_tokens == 8
    # a decodes position 9 in its block 2; b reuses blocks 0 and 1 and computes 8 and 9.
    assert pack(out) == Packed([70, 20, 21], [9, 8, 9], [9, 12, 13], [10, 10], [0, 1, 3],
                               [[0, 1, 2], [0, 1, 3]])


def test_fork_copies_the_shared_last_block_before_writing() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", [1, 2, 3, 4, 5, 6], best_of=2)
    finish_step(scheduler, scheduler.schedule(), token=40)
    parent, child = group.seqs
    assert (parent.block_table, child.block_table) == ([0, 1], [0, 1])
    assert (parent.last_token_id, child.last_token_id) == (40, 41)
    out = scheduler.schedule()
    # Position 6 lands in the shared block 1: the first writer copies it to block 2.
    assert out.blocks_to_copy == [(1, 2)]
    assert pack(out) == Packed([40, 41], [6, 6], [10, 6], [7, 7], [0, 1, 2], [[0, 2], [0, 1]])


def test_swap_in_packs_into_the_new_device_blocks() -> None:
    scheduler = make_scheduler(num_blocks=4, num_cpu_blocks=8, preemption_mode="swap")
    add(scheduler, "a", list(range(1, 9)), max_tokens=1)
    add(scheduler, "b", list(range(21, 28)), max_tokens=3)
    finish_step(scheduler, scheduler.schedule(), token=90)  # a is done; b has 8 tokens
    add(scheduler, "c", list(range(31, 39)), max_tokens=2)
    out = scheduler.schedule()  # b decodes into its block 3, c takes blocks 0 and 1
    assert pack(out).slot_mapping == [15, 0, 1, 2, 3, 4, 5, 6, 7]
    finish_step(scheduler, out, token=91)
    out = scheduler.schedule()  # b needs a block for position 8: c, the latest, swaps out
    assert out.preempted == ["c"] and out.blocks_to_swap_out == [(0, 0), (1, 1)]
    assert pack(out) == Packed([91], [8], [0], [9], [0, 1], [[2, 3, 0]])
    finish_step(scheduler, out, token=92)  # b is done: blocks 2, 3 and 0 are free again
    assert scheduler.block_manager.device_pool.free_block_ids() == [2, 3, 0, 1]
    out = scheduler.schedule()
    assert out.blocks_to_swap_in == [(0, 2), (1, 3)]
    # c decodes the token it sampled before the swap (91) at position 8, in a new block 0.
    assert pack(out) == Packed([91], [8], [0], [9], [0, 1], [[2, 3, 0]])
