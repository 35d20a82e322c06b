"""Argument checks shared by the Triton ops.

Only metadata (shapes, dtypes, devices) is checked: reading tensor contents such as block ids or
sequence lengths would force a device→host sync on every layer of every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .runtime import SUPPORTED_DTYPES

MAX_HEAD_DIM = 256
MIN_BLOCK_SIZE = 8


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """The sizes an attention launch is specialised on."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    max_blocks_per_seq: int

    @property
    def group_size(self) -> int:
        """Query heads that share one KV head (1 for MHA, H for MQA)."""
        return self.num_heads // self.num_kv_heads


def _require_dims(name: str, tensor: torch.Tensor, ndim: int) -> None:
    if tensor.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(tensor.shape)}")


def _require_dtype(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> None:
    if tensor.dtype != dtype:
        raise TypeError(f"{name} must be {dtype}, got {tensor.dtype}")


def require_same_device(**tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"tensors must share one device, got {listing}")


def check_kv_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    """Both caches are [num_blocks, block_size, num_kv_heads, head_dim] of one supported dtype."""
    _require_dims("key_cache", key_cache, 4)
    if value_cache.shape != key_cache.shape:
        raise ValueError(
            f"value_cache shape {tuple(value_cache.shape)} differs from key_cache shape "
            f"{tuple(key_cache.shape)}"
        )
    if key_cache.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"key_cache dtype {key_cache.dtype} is not one of {SUPPORTED_DTYPES}")
    _require_dtype("value_cache", value_cache, key_cache.dtype)
    block_size, head_dim = key_cache.shape[1], key_cache.shape[3]
    if block_size < MIN_BLOCK_SIZE or block_size & (block_size - 1):
        raise ValueError(
            f"block_size {block_size} must be a power of two >= {MIN_BLOCK_SIZE}"
        )
    if not 1 <= head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"head_dim {head_dim} is outside the supported range 1..{MAX_HEAD_DIM}")


def check_attention_inputs(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> AttentionShape:
    """Validate the arguments both attention ops share and return the launch sizes."""
    _require_dims("query", query, 3)
    check_kv_cache_pair(key_cache, value_cache)
    _require_dtype("query", query, key_cache.dtype)
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    if head_dim != key_cache.shape[3]:
        raise ValueError(f"query head_dim {head_dim} differs from the cache's {key_cache.shape[3]}")
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}"
        )
    _require_dims("block_tables", block_tables, 2)
    _require_dtype("block_tables", block_tables, torch.int32)
    _require_dims("seq_lens", seq_lens, 1)
    _require_dtype("seq_lens", seq_lens, torch.int32)
    if seq_lens.shape[0] != block_tables.shape[0]:
        raise ValueError(
            f"seq_lens has {seq_lens.shape[0]} sequences but block_tables has "
            f"{block_tables.shape[0]}"
        )
    require_same_device(
        query=query, key_cache=key_cache, value_cache=value_cache,
        block_tables=block_tables, seq_lens=seq_lens,
    )
    return AttentionShape(
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=key_cache.shape[1],
        max_blocks_per_seq=block_tables.shape[1],
    )


def check_query_start_loc(
    query_start_loc: torch.Tensor, num_seqs: int, device: torch.device
) -> None:
    _require_dims("query_start_loc", query_start_loc, 1)
    _require_dtype("query_start_loc", query_start_loc, torch.int32)
    if query_start_loc.shape[0] != num_seqs + 1:
        raise ValueError(
            f"query_start_loc must hold num_seqs + 1 = {num_seqs + 1} offsets, got "
            f"{query_start_loc.shape[0]}"
        )
    if query_start_loc.device != device:
        raise ValueError(f"query_start_loc is on {query_start_loc.device}, expected {device}")


def check_block_mapping(block_mapping: torch.Tensor, num_src: int, num_dst: int) -> None:
    """[K, 2] int64 pairs (src, dst); ids are range-checked when the mapping is on the CPU,
    where reading it costs no device sync."""
    _require_dims("block_mapping", block_mapping, 2)
    _require_dtype("block_mapping", block_mapping, torch.int64)
    if block_mapping.shape[1] != 2:
        raise ValueError(
            f"block_mapping must have shape [K, 2], got {tuple(block_mapping.shape)}"
        )
    if block_mapping.device.type != "cpu" or block_mapping.numel() == 0:
        return
    for column, name, limit in ((0, "source", num_src), (1, "destination", num_dst)):
        ids = block_mapping[:, column]
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= limit:
            bad = low if low < 0 else high
            raise ValueError(f"{name} block id {bad} is outside the pool of {limit} blocks")
