"""SchedulerOutput → the tensors one forward pass reads: the one place inputs are packed.

The scheduled sequences' new tokens are packed back to back. For each sequence the step
computes tokens ``[num_computed_tokens, seq_len)`` as scheduled (not as the sequence stands
later), each written to the cache slot ``block_table[pos // block_size] * block_size +
pos % block_size``. The model runner, the test fakes and the model tests' harness all build
their inputs here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.models.attention import AttentionMetadata


@dataclass(slots=True)
class ModelInput:
    input_ids: torch.Tensor  # [T] long
    positions: torch.Tensor  # [T] long
    attn: AttentionMetadata
    # For each scheduled sequence: the rows of the step's hidden states that belong to it.
    query_start_loc: list[int]


def prepare_model_input(out: SchedulerOutput, block_size: int,
                        device: torch.device | str) -> ModelInput:
    """The packed inputs of ``out.scheduled`` (which must not be empty)."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    seq_lens: list[int] = []
    starts = [0]
    tables: list[list[int]] = []
    for item in out.scheduled:
        start, end = item.num_computed_tokens, item.seq_len
        table = item.seq.block_table
        input_ids.extend(item.seq.token_ids[start:end])
        span = range(start, end)
        positions.extend(span)
        slots.extend(table[p // block_size] * block_size + p % block_size for p in span)
        seq_lens.append(end)
        starts.append(starts[-1] + item.num_new_tokens)
        tables.append(table)
    width = max(len(t) for t in tables)
    padded = [t + [0] * (width - len(t)) for t in tables]
    query_lens = [item.num_new_tokens for item in out.scheduled]
    attn = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        block_tables=torch.tensor(padded, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        max_query_len=max(query_lens),
        is_decode_only=all(q == 1 for q in query_lens),
    )
    return ModelInput(
        input_ids=torch.tensor(input_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        attn=attn,
        query_start_loc=starts,
    )
