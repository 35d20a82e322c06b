"""Drives a model through the paged KV cache the way the engine does, for the model tests.

Blocks are handed out in a shuffled order, the pools start as NaN (so a kernel that reads an
unwritten slot poisons the logits), and each step packs several sequences' new tokens.
"""

from __future__ import annotations

import math

import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.engine.core.scheduler_output import ScheduledSequence, SchedulerOutput
from pagedserve.server.engine.core.sequence import Sequence, SequenceGroup
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.engine.worker.model_input import prepare_model_input
from pagedserve.server.models.base import CausalLM
from pagedserve.server.models.model_config import ModelConfig


class PagedHarness:
    def __init__(
        self, model: CausalLM, config: ModelConfig, block_size: int = 4, num_blocks: int = 96,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.block_size = block_size
        self.cache = KVCache(
            config, block_size, num_blocks, 0, model.dtype, "cpu", model.kernel_ops
        )
        for pool in self.cache.key_caches + self.cache.value_caches:
            pool.fill_(float("nan"))
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
        self.free = order.tolist()
        self.seqs: dict[int, SequenceGroup] = {}

    def _schedule(self, seq_id: int, new: list[int]) -> ScheduledSequence:
        group = self.seqs.get(seq_id)
        if group is None:
            group = self.seqs[seq_id] = SequenceGroup(
                str(seq_id), [Sequence(seq_id, [], self.block_size)], SamplingParams(), 0.0)
        seq = group.seqs[0]
        start = seq.num_tokens
        for token in new:
            seq.append_token(token, 0.0)
        while len(seq.block_table) < math.ceil(seq.num_tokens / self.block_size):
            seq.block_table.append(self.free.pop())
        return ScheduledSequence(seq, group, len(new), start, seq.num_tokens)

    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Computes each (sequence id, new tokens) chunk in one packed forward pass, packed by
        the engine's own ``prepare_model_input``; returns float32 logits [len(new tokens),
        vocab] per chunk."""
        out = SchedulerOutput(scheduled=[self._schedule(seq, new) for seq, new in chunks])
        inp = prepare_model_input(out, self.block_size, "cpu")
        for item in out.scheduled:
            item.seq.num_computed_tokens = item.seq_len
        with torch.inference_mode():
            hidden = self.model(inp.input_ids, inp.positions, inp.attn, self.cache.device_caches)
            logits = self.model.compute_logits(hidden)
        return list(logits.split([len(new) for _, new in chunks]))


def hf_logits(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """transformers' float32 logits [len(tokens), vocab] for one unpadded sequence."""
    with torch.inference_mode():
        return hf_model(torch.tensor([tokens])).logits[0].float()
