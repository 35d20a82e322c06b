"""Test doubles for the engine core: request factories, a token-level KV cache, a fake runner.

``FakeKVCache`` stores token ids where the real cache stores K/V, applies a step's block
operations in the documented order and writes each computed token into its slot; then every
scheduled sequence's context is read back through its block table. Any missed copy-on-write,
wrong swap mapping or bad prefix hit shows up as a wrong token.
"""

from __future__ import annotations

from dataclasses import replace

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup
from pagedserve.server.engine.logits.sampling_plan import SampledBatch, SampledToken, SamplingPlan
from pagedserve.server.engine.worker.model_input import prepare_model_input


def make_group(request_id: str, prompt: list[int], seq_id: int, block_size: int, *,
               best_of: int = 1, beam: bool = False, cache_salt: str | None = None,
               arrival_time: float = 0.0, tenant: str | None = None) -> SequenceGroup:
    params = (SamplingParams(n=best_of, temperature=0.0, use_beam_search=True) if beam
              else SamplingParams(n=best_of))
    return SequenceGroup(request_id, [Sequence(seq_id, prompt, block_size)], params,
                         arrival_time, cache_salt=cache_salt, tenant=tenant)


def next_token(seq: Sequence, index: int = 0) -> int:
    """A deterministic token that differs between forks of one sequence."""
    return 1000 + (seq.seq_id * 7919 + seq.num_tokens * 31 + index * 13) % 97


class FakeKVCache:
    def __init__(self, num_device_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.device: list[list[int | None]] = [[None] * block_size
                                               for _ in range(num_device_blocks)]
        self.cpu: list[list[int | None]] = [[None] * block_size for _ in range(num_cpu_blocks)]

    def run(self, out: SchedulerOutput) -> list[int]:
        """Applies the step to the cache; returns each scheduled sequence's first row."""
        for src, dst in out.blocks_to_swap_out:
            self.cpu[dst] = list(self.device[src])
        for src, dst in out.blocks_to_swap_in:
            self.device[dst] = list(self.cpu[src])
        for src, dst in out.blocks_to_copy:
            self.device[dst] = list(self.device[src])
        if not out.scheduled:
            return [0]
        # The production packing: token i of the batch goes to slot_mapping[i].
        inp = prepare_model_input(out, self.block_size, "cpu")
        for token, slot in zip(inp.input_ids.tolist(), inp.attn.slot_mapping.tolist(),
                               strict=True):
            block, offset = divmod(slot, self.block_size)
            self.device[block][offset] = token
        for item in out.scheduled:
            context = self.read(item.seq.block_table, item.seq_len)
            expected = item.seq.token_ids[:item.seq_len]
            assert context == expected, (
                f"sequence {item.seq.seq_id} reads {context}, expected {expected}")
        return inp.query_start_loc

    def read(self, block_table: list[int], num_tokens: int) -> list[int | None]:
        size = self.block_size
        return [self.device[block_table[pos // size]][pos % size] for pos in range(num_tokens)]


class FakeRunner:
    """Plays model runner and sampler around the real scheduler: the production input
    packing and sampling plan, one deterministic token per draw (``best_of`` draws on a
    request's first token, forked by ``update_from_output``); a request finishes at its
    ``max_tokens`` entry (default 4) or at max_model_len."""

    def __init__(self, scheduler: Scheduler, max_tokens: dict[str, int] | None = None) -> None:
        self.scheduler = scheduler
        manager = scheduler.block_manager
        self.cache = FakeKVCache(manager.device_pool.num_blocks, manager.cpu_pool.num_blocks,
                                 manager.block_size)
        self.max_tokens = {} if max_tokens is None else max_tokens
        self.finished: list[str] = []

    def step(self) -> SchedulerOutput:
        out = self.scheduler.schedule()
        self.check_limits(out)
        starts = self.cache.run(out)
        plan = SamplingPlan.of(out, starts)
        for draw in plan.draws:
            self._apply_limit(draw.group)
        tokens = [SampledToken(draw, next_token(draw.seq, draw.index), -0.5, None)
                  for draw in plan.draws]
        self.scheduler.update_from_output(out, SampledBatch(tokens=tokens))
        self.finished.extend(out.finished_request_ids)
        self.scheduler.check_integrity()
        return out
    def run_until_done(self, max_steps: int = 10_000) -> int:
        steps = 0
        while self.scheduler.has_unfinished_requests():
            self.step()
            steps += 1
            assert steps < max_steps, "the scheduler made no progress"
        self.finished.extend(self.scheduler.schedule().finished_request_ids)
        return steps

    def check_limits(self, out: SchedulerOutput) -> None:
        config = self.scheduler.config
        assert out.num_batched_tokens <= config.max_num_batched_tokens
        assert out.num_seqs <= config.max_num_seqs
        seq_ids = [item.seq.seq_id for item in out.scheduled]
        assert len(seq_ids) == len(set(seq_ids))
        for item in out.scheduled:
            assert item.num_new_tokens >= 1
            assert item.seq_len <= item.num_tokens

    def _apply_limit(self, group: SequenceGroup) -> None:
        limit = self.max_tokens.get(group.request_id, 4)
        if group.sampling_params.max_tokens != limit:
            group.sampling_params = replace(group.sampling_params, max_tokens=limit)
