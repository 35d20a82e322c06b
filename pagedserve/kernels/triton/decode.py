"""Paged attention for decode: one query token per sequence against its paged K/V.

One program handles one (sequence, KV head) and all query heads of that group, so each K/V tile
is read once per group (GQA). With a split configuration the context is partitioned across
programs that write partial (max, sum, acc) and a second kernel merges them (split-K, as in
FlashDecoding), which keeps the device busy at small batch and long context.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .attention_tile import LOG2_E, load_kv_tile, online_softmax_step
from .checks import AttentionShape, check_attention_inputs
from .launch_config import DecodeConfig, choose_decode_config, padded_group_size, padded_head_dim
from .runtime import (
    dot_dtype,
    kernel_output_dtype,
    multiprocessor_count,
    next_power_of_2,
    require_launchable,
)

# Splits merged per step of the reduce loop.
MAX_SPLIT_TILE = 32


@triton.jit
def _decode_kernel(
    query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, split_max_ptr, split_sum_ptr,
    scale_log2, partition_size,
    stride_qs, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_bts,
    stride_os, stride_oh, stride_op, stride_od,
    stride_ms, stride_mh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, KV_TILE: tl.constexpr, SPLIT: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    start = split * partition_size
    end = tl.minimum(start + partition_size, seq_len)

    group_rows = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + group_rows
    head_mask = group_rows < GROUP
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM
    q = tl.load(
        query_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh
        + dims[None, :] * stride_qd,
        mask=head_mask[:, None] & dim_mask[None, :],
        other=0.0,
    ).to(DOT_DTYPE)

    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bts
    running_max = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
    for tile_start in range(start, end, KV_TILE):
        positions = tile_start + tl.arange(0, KV_TILE)
        position_mask = positions < end
        k = load_kv_tile(
            key_cache_ptr, block_table_ptr, positions, position_mask, kv_head,
            stride_kb, stride_ko, stride_kh, stride_kd, dims, dim_mask, BLOCK_SIZE, DOT_DTYPE,
        )
        v = load_kv_tile(
            value_cache_ptr, block_table_ptr, positions, position_mask, kv_head,
            stride_vb, stride_vo, stride_vh, stride_vd, dims, dim_mask, BLOCK_SIZE, DOT_DTYPE,
        )
        running_max, running_sum, acc = online_softmax_step(
            q, k, v, position_mask[None, :], running_max, running_sum, acc,
            scale_log2, DOT_DTYPE, PRECISION,
        )

    out_rows = out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh
    out_cols = dims[None, :] * stride_od
    if SPLIT:
        # Partials stay unnormalised; splits past the sequence's end are never read back.
        row_mask = head_mask & (start < seq_len)
        stat_offsets = seq.to(tl.int64) * stride_ms + heads * stride_mh + split
        tl.store(split_max_ptr + stat_offsets, running_max, mask=row_mask)
        tl.store(split_sum_ptr + stat_offsets, running_sum, mask=row_mask)
        tl.store(
            out_rows + split * stride_op + out_cols, acc,
            mask=row_mask[:, None] & dim_mask[None, :],
        )
    else:
        # An empty context (seq_len 0) yields zeros rather than 0/0.
        denom = tl.where(running_sum > 0.0, running_sum, 1.0)
        result = acc / denom[:, None]
        tl.store(
            out_rows + out_cols, result.to(out_ptr.dtype.element_ty),
            mask=head_mask[:, None] & dim_mask[None, :],
        )


@triton.jit
def _decode_reduce_kernel(
    partial_ptr, split_max_ptr, split_sum_ptr, seq_lens_ptr, out_ptr,
    partition_size,
    stride_ps, stride_ph, stride_pp,
    stride_ms, stride_mh,
    stride_os, stride_oh, stride_od,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr, SPLIT_TILE: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + seq)
    num_used = tl.cdiv(seq_len, partition_size)
    stats = seq.to(tl.int64) * stride_ms + head * stride_mh
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_mask = dims < HEAD_DIM

    # Two passes over the split statistics: the global max first, so every weight is <= 1.
    # Accumulators are per-lane vectors reduced once at the end, a loop-carried shape that
    # compiles the same on every backend.
    lane_max = tl.full([SPLIT_TILE], float("-inf"), dtype=tl.float32)
    for first in range(0, num_used, SPLIT_TILE):
        splits = first + tl.arange(0, SPLIT_TILE)
        split_max = tl.load(
            split_max_ptr + stats + splits, mask=splits < num_used, other=float("-inf")
        )
        lane_max = tl.maximum(lane_max, split_max)
    global_max = tl.max(lane_max, axis=0)

    lane_sum = tl.zeros([SPLIT_TILE], dtype=tl.float32)
    acc = tl.zeros([HEAD_DIM_PAD], dtype=tl.float32)
    partial_rows = partial_ptr + seq.to(tl.int64) * stride_ps + head * stride_ph
    for first in range(0, num_used, SPLIT_TILE):
        splits = first + tl.arange(0, SPLIT_TILE)
        used = splits < num_used
        split_max = tl.load(split_max_ptr + stats + splits, mask=used, other=float("-inf"))
        split_sum = tl.load(split_sum_ptr + stats + splits, mask=used, other=0.0)
        weight = tl.where(used, tl.exp2(split_max - global_max), 0.0)
        lane_sum += weight * split_sum
        partial = tl.load(
            partial_rows + splits[:, None] * stride_pp + dims[None, :],
            mask=used[:, None] & dim_mask[None, :],
            other=0.0,
        )
        acc += tl.sum(weight[:, None] * partial, axis=0)

    total = tl.sum(lane_sum, axis=0)
    denom = tl.where(total > 0.0, total, 1.0)
    result = acc / denom
    tl.store(
        out_ptr + seq.to(tl.int64) * stride_os + head * stride_oh + dims * stride_od,
        result.to(out_ptr.dtype.element_ty),
        mask=dim_mask,
    )


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    config: DecodeConfig | None = None,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    query [S, H, D]; caches [N, B, Hkv, D]; block_tables int32 [S, M]; seq_lens int32 [S].
    Returns [S, H, D] in the query's dtype. ``config`` overrides the heuristic choice.
    """
    shape = check_attention_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    num_seqs = query.shape[0]
    if num_seqs != seq_lens.shape[0]:
        raise ValueError(
            f"decode takes one query row per sequence: query has {num_seqs} rows for "
            f"{seq_lens.shape[0]} sequences"
        )
    require_launchable(_decode_kernel, query, key_cache, value_cache, block_tables, seq_lens)
    if config is None:
        config = choose_decode_config(
            shape, num_seqs, multiprocessor_count(query.device), query.element_size()
        )
    out = torch.empty(
        query.shape, dtype=kernel_output_dtype(_decode_kernel, query.dtype), device=query.device
    )
    if num_seqs == 0:
        return out.to(query.dtype)
    inputs = _DecodeInputs(query, key_cache, value_cache, block_tables, seq_lens, scale)
    max_context_len = shape.max_blocks_per_seq * shape.block_size
    num_splits = config.num_splits(max_context_len)
    if num_splits == 1:
        _launch_decode(inputs, shape, config, max_context_len, out)
    else:
        _launch_split_decode(inputs, shape, config, num_splits, out)
    return out.to(query.dtype)


class _DecodeInputs(NamedTuple):
    query: torch.Tensor
    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    scale: float


def _launch_decode(
    inputs: _DecodeInputs,
    shape: AttentionShape,
    config: DecodeConfig,
    partition_size: int,
    out: torch.Tensor,
    split_stats: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """One launch over (sequence, KV head, split). Without ``split_stats`` ``out`` is the
    [S, H, D] result; with them it is the [S, H, splits, D_pad] unnormalised partials."""
    query, key_cache, value_cache, block_tables, seq_lens, scale = inputs
    split = split_stats is not None
    # The unsplit kernel never touches the statistics: any int32 tensor fills their slots.
    split_max, split_sum = split_stats if split else (seq_lens, seq_lens)
    out_strides = out.stride() if split else (out.stride(0), out.stride(1), 0, out.stride(2))
    stat_strides = split_max.stride()[:2] if split else (0, 0)
    operand_dtype, precision = dot_dtype(_decode_kernel, key_cache.dtype)
    grid = (query.shape[0], shape.num_kv_heads, out.shape[2] if split else 1)
    _decode_kernel[grid](
        query, key_cache, value_cache, block_tables, seq_lens,
        out, split_max, split_sum,
        scale * LOG2_E, partition_size,
        *query.stride(), *key_cache.stride(), *value_cache.stride(), block_tables.stride(0),
        *out_strides, *stat_strides,
        GROUP=shape.group_size, GROUP_PAD=padded_group_size(shape.group_size),
        HEAD_DIM=shape.head_dim, HEAD_DIM_PAD=padded_head_dim(shape.head_dim),
        BLOCK_SIZE=shape.block_size, KV_TILE=config.kv_tile, SPLIT=split,
        DOT_DTYPE=operand_dtype, PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def _launch_split_decode(
    inputs: _DecodeInputs,
    shape: AttentionShape,
    config: DecodeConfig,
    num_splits: int,
    out: torch.Tensor,
) -> None:
    num_seqs, num_heads = inputs.query.shape[0], shape.num_heads
    head_dim_pad = padded_head_dim(shape.head_dim)
    stats_shape = (num_seqs, num_heads, num_splits)
    device = inputs.query.device
    split_max = torch.empty(stats_shape, dtype=torch.float32, device=device)
    split_sum = torch.empty(stats_shape, dtype=torch.float32, device=device)
    partial = torch.empty((*stats_shape, head_dim_pad), dtype=torch.float32, device=device)
    _launch_decode(inputs, shape, config, config.partition_size, partial, (split_max, split_sum))
    _decode_reduce_kernel[(num_seqs, num_heads)](
        partial, split_max, split_sum, inputs.seq_lens, out,
        config.partition_size,
        *partial.stride()[:3], *split_max.stride()[:2], *out.stride(),
        HEAD_DIM=shape.head_dim, HEAD_DIM_PAD=head_dim_pad,
        SPLIT_TILE=min(MAX_SPLIT_TILE, next_power_of_2(num_splits)),
    )
