"""Attention over the paged KV cache: the step's metadata and the layer that calls the kernels."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from pagedserve.kernels.dispatch import KernelOps


@dataclass(slots=True)
class AttentionMetadata:
    """Where the step's tokens live in the paged cache; built by the runner, read by every
    layer. S sequences, T tokens, M block-table width."""

    slot_mapping: torch.Tensor  # int64 [T]: block_id * block_size + offset, < 0 = padding
    block_tables: torch.Tensor  # int32 [S, M]
    seq_lens: torch.Tensor  # int32 [S]: cached + new tokens after this step
    query_start_loc: torch.Tensor  # int32 [S + 1]: sequence s owns rows [s] : [s + 1]
    max_query_len: int
    is_decode_only: bool  # every sequence has exactly one new token: the decode kernel runs

    def __post_init__(self) -> None:
        num_seqs = self.seq_lens.shape[0]
        if self.block_tables.dim() != 2 or self.block_tables.shape[0] != num_seqs:
            raise ValueError(
                f"block_tables must be [{num_seqs}, M] for {num_seqs} sequences, "
                f"got {list(self.block_tables.shape)}"
            )
        if self.query_start_loc.shape != (num_seqs + 1,):
            raise ValueError(
                f"query_start_loc must be [{num_seqs + 1}], got {list(self.query_start_loc.shape)}"
            )
        if self.is_decode_only and self.slot_mapping.shape[0] != num_seqs:
            raise ValueError(
                f"a decode-only step has one token per sequence, got "
                f"{self.slot_mapping.shape[0]} tokens for {num_seqs} sequences"
            )

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


class PagedAttention(nn.Module):
    """Writes the step's K/V into the cache, then attends with the decode or prefill op of the
    ``KernelOps`` it was built with."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, ops: KernelOps
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.ops = ops

    def forward(
        self,
        query: torch.Tensor,  # [T, H, D]
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],  # [N, B, Hkv, D] each
    ) -> torch.Tensor:  # [T, H, D]
        key_cache, value_cache = kv_cache
        self.ops.reshape_and_cache(key, value, key_cache, value_cache, attn.slot_mapping)
        if attn.is_decode_only:
            return self.ops.paged_attention_decode(
                query, key_cache, value_cache, attn.block_tables, attn.seq_lens, self.scale
            )
        return self.ops.paged_attention_prefill(
            query, key_cache, value_cache, attn.block_tables, attn.query_start_loc,
            attn.seq_lens, self.scale,
        )


    def decode_from_qkv(
        self,
        qkv: torch.Tensor,  # [T, (H + 2 Hkv) D], q and k not yet rotated
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor | None:  # [T, H, D]
        """A decode-only step's rotary embedding, KV write and attention as one call of the
        backend (``KernelOps.rotary_cache_decode``); None where it has none, or for a step
        with prompt tokens: the caller then runs them one by one."""
        fused = self.ops.rotary_cache_decode
        if fused is None or not attn.is_decode_only:
            return None
        key_cache, value_cache = kv_cache
        return fused(qkv, self.num_heads, self.num_kv_heads, cos, sin, key_cache, value_cache,
                     attn.slot_mapping, attn.block_tables, attn.seq_lens, self.scale)


def warm_up_attention(model: nn.Module, block_size: int, dtype: torch.dtype) -> float:
    """Compiles the attention kernels of a compiling backend (``KernelOps.warm_up``) for each
    distinct layer shape now, so that the first request does not wait; returns the seconds
    spent (0 for a backend that does not compile)."""
    seconds = 0.0
    seen: set[tuple[int, int, int]] = set()
    for module in model.modules():
        if not isinstance(module, PagedAttention) or module.ops.warm_up is None:
            continue
        shape = (module.num_heads, module.num_kv_heads, module.head_dim)
        if shape not in seen:
            seen.add(shape)
            seconds += module.ops.warm_up(*shape, block_size, dtype)
    return seconds
