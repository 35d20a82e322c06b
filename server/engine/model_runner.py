"""SchedulerOutput → model inputs → logits.

Everything a step needs is built here from the scheduler's plain data and passed to the model
explicitly; nothing lives in module-level state.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.server.engine.kv_cache import KVCache
from pagedserve.server.engine.scheduler_output import SchedulerOutput
from pagedserve.server.engine.step_timing import StepTimer
from pagedserve.server.models.attention import AttentionMetadata


@dataclass(slots=True)
class ModelInput:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    attn: AttentionMetadata
    # For each scheduled sequence: the rows of the step's hidden states that belong to it.
    query_start_loc: list[int]


class ModelRunner:
    """Runs one engine step's forward pass over the paged KV cache."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, block_size: int,
                 device: torch.device) -> None:
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = block_size
        self.device = device

    def prepare_input(self, out: SchedulerOutput) -> ModelInput:
        block_size = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        seq_lens: list[int] = []
        starts = [0]
        tables: list[list[int]] = []
        for item in out.scheduled:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            table = seq.block_table
            input_ids.extend(seq.token_ids[start:end])
            span = range(start, end)
            positions.extend(span)
            slots.extend(table[p // block_size] * block_size + p % block_size for p in span)
            seq_lens.append(end)
            starts.append(starts[-1] + item.num_new_tokens)
            tables.append(table)
        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        query_lens = [item.num_new_tokens for item in out.scheduled]
        dev = self.device
        attn = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
            max_query_len=max(query_lens),
            is_decode_only=all(q == 1 for q in query_lens),
        )
        return ModelInput(
            input_ids=torch.tensor(input_ids, dtype=torch.int64, device=dev),
            positions=torch.tensor(positions, dtype=torch.int64, device=dev),
            attn=attn,
            query_start_loc=starts,
        )

    def run_block_ops(self, out: SchedulerOutput) -> None:
        # Order matters: swap-out reads blocks that a copy or swap-in may then overwrite.
        if out.blocks_to_swap_out:
            self.kv_cache.swap_out(out.blocks_to_swap_out)
        if out.blocks_to_swap_in:
            self.kv_cache.swap_in(out.blocks_to_swap_in)
        if out.blocks_to_copy:
            self.kv_cache.copy(out.blocks_to_copy)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput,
                timer: StepTimer | None = None) -> tuple[torch.Tensor, list[int]]:
        """Runs the block ops and the forward pass; returns the hidden states of every packed
        token [T, hidden] and the query start offsets of the scheduled sequences. ``timer``
        books the block ops and packing as ``prepare``, the model as ``forward``."""
        self.run_block_ops(out)
        inp = self.prepare_input(out)
        if timer is not None:
            timer.mark("prepare")
        hidden = self.model(inp.input_ids, inp.positions, inp.attn, self.kv_cache.device_caches)
        if timer is not None:
            timer.mark("forward")
        return hidden, inp.query_start_loc

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """float32 logits [len(rows), vocab] for the given rows of ``hidden``."""
        index = torch.tensor(rows, dtype=torch.int64, device=hidden.device)
        return self.model.compute_logits(hidden.index_select(0, index))
