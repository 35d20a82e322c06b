"""Drives a model through the paged KV cache the way the engine does, for the model tests.

Blocks are handed out in a shuffled order, the pools start as NaN (so a kernel that reads an
unwritten slot poisons the logits), and each step packs several sequences' new tokens.
"""

from __future__ import annotations

import math

import torch

from pagedserve.server.engine.kv_cache import KVCache
from pagedserve.server.models.attention import AttentionMetadata
from pagedserve.server.models.base import CausalLM
from pagedserve.server.models.config import ModelConfig


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
        self.tables: dict[int, list[int]] = {}
        self.tokens: dict[int, list[int]] = {}

    def _slots(self, seq: int, start: int, end: int) -> list[int]:
        table = self.tables.setdefault(seq, [])
        while len(table) < math.ceil(end / self.block_size):
            table.append(self.free.pop())
        b = self.block_size
        return [table[p // b] * b + p % b for p in range(start, end)]

    def step(self, chunks: list[tuple[int, list[int]]]) -> list[torch.Tensor]:
        """Computes each (sequence id, new tokens) chunk in one packed forward pass; returns
        float32 logits [len(new tokens), vocab] per chunk."""
        ids, positions, slots, seq_lens, starts = [], [], [], [], [0]
        for seq, new in chunks:
            done = self.tokens.setdefault(seq, [])
            start, end = len(done), len(done) + len(new)
            ids += new
            positions += range(start, end)
            slots += self._slots(seq, start, end)
            seq_lens.append(end)
            starts.append(starts[-1] + len(new))
            done += new
        width = max(len(self.tables[seq]) for seq, _ in chunks)
        tables = [self.tables[seq] + [0] * (width - len(self.tables[seq])) for seq, _ in chunks]
        query_lens = [len(new) for _, new in chunks]
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
            query_start_loc=torch.tensor(starts, dtype=torch.int32),
            max_query_len=max(query_lens),
            is_decode_only=all(q == 1 for q in query_lens),
        )
        with torch.inference_mode():
            hidden = self.model(
                torch.tensor(ids), torch.tensor(positions), attn, self.cache.device_caches
            )
            logits = self.model.compute_logits(hidden)
        return list(logits.split(query_lens))


def hf_logits(hf_model: torch.nn.Module, tokens: list[int]) -> torch.Tensor:
    """transformers' float32 logits [len(tokens), vocab] for one unpadded sequence."""
    with torch.inference_mode():
        return hf_model(torch.tensor([tokens])).logits[0].float()
