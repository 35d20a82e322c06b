"""Test doubles for the engine core: request factories, a token-level KV cache, a fake runner.

``FakeKVCache`` stores token ids where the real cache stores K/V, applies a step's block
operations in the documented order and writes each computed token into its slot; then every
scheduled sequence's context is read back through its block table. Any missed copy-on-write,
wrong swap mapping or bad prefix hit shows up as a wrong token.
"""

from __future__ import annotations

from pagedserve.server.engine.scheduler import Scheduler
from pagedserve.server.engine.scheduler_output import SchedulerOutput
from pagedserve.server.engine.sequence import Sequence, SequenceGroup, SequenceStatus
from pagedserve.server.sampling_params import SamplingParams


def make_group(request_id: str, prompt: list[int], seq_id: int, block_size: int, *,
               best_of: int = 1, beam: bool = False, cache_salt: str | None = None,
               arrival_time: float = 0.0) -> SequenceGroup:
    params = (SamplingParams(n=best_of, temperature=0.0, use_beam_search=True) if beam
              else SamplingParams(n=best_of))
    return SequenceGroup(request_id, [Sequence(seq_id, prompt, block_size)], params,
                         arrival_time, cache_salt=cache_salt)


def next_token(seq: Sequence) -> int:
    """A deterministic token that differs between forks of one sequence."""
    return 1000 + (seq.seq_id * 7919 + seq.num_tokens * 31) % 97


class FakeKVCache:
    def __init__(self, num_device_blocks: int, num_cpu_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.device: list[list[int | None]] = [[None] * block_size
                                               for _ in range(num_device_blocks)]
        self.cpu: list[list[int | None]] = [[None] * block_size for _ in range(num_cpu_blocks)]

    def run(self, out: SchedulerOutput) -> None:
        for src, dst in out.blocks_to_swap_out:
            self.cpu[dst] = list(self.device[src])
        for src, dst in out.blocks_to_swap_in:
            self.device[dst] = list(self.cpu[src])
        for src, dst in out.blocks_to_copy:
            self.device[dst] = list(self.device[src])
        for item in out.scheduled:
            for pos, slot in zip(item.positions, item.slot_mapping(), strict=True):
                block, offset = divmod(slot, self.block_size)
                self.device[block][offset] = item.seq.token_ids[pos]
        for item in out.scheduled:
            context = self.read(item.seq.block_table, item.seq_len)
            expected = item.seq.token_ids[:item.seq_len]
            assert context == expected, (
                f"sequence {item.seq.seq_id} reads {context}, expected {expected}")

    def read(self, block_table: list[int], num_tokens: int) -> list[int | None]:
        size = self.block_size
        return [self.device[block_table[pos // size]][pos % size] for pos in range(num_tokens)]


class FakeRunner:
    """Plays model runner and engine: one token per sampling sequence, forks on the first
    sample of a request with ``best_of`` > 1, finishes at ``max_tokens`` or max_model_len."""

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
        self.cache.run(out)
        self.scheduler.update_after_step(out)
        for item in out.scheduled:
            # A sequence a fork preempted after the step still takes its sampled token.
            if item.samples and not item.seq.is_finished():
                self._sample(item.seq, item.seq_group)
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

    def _sample(self, seq: Sequence, seq_group: SequenceGroup) -> None:
        width = seq_group.sampling_params.best_of
        first = not seq.output_token_ids and len(seq_group.seqs) == 1
        if first and seq.status is SequenceStatus.RUNNING:
            for _ in range(width - 1):
                self._append(self.scheduler.fork_seq(seq, seq_group), seq_group)
        self._append(seq, seq_group)

    def _append(self, seq: Sequence, seq_group: SequenceGroup) -> None:
        seq.append_token(next_token(seq), -0.5)
        limit = self.max_tokens.get(seq_group.request_id, 4)
        max_model_len = self.scheduler.config.max_model_len
        if seq.num_output_tokens >= limit or seq.num_tokens >= max_model_len:
            self.scheduler.finish_seq(seq, SequenceStatus.FINISHED_LENGTH)
