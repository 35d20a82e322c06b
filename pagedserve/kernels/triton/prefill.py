"""Paged attention for prefill: a chunk of new query tokens per sequence, attending causally to
themselves and to the sequence's already cached context (chunked prefill, prefix-cache hits).

The query rows are packed ([T, H, D], sequence s owns rows query_start_loc[s]:[s+1]). A program
takes ``BLOCK_Q`` consecutive query tokens of one sequence times the query heads of one KV head,
so each K/V tile it gathers serves the whole GQA group.

The grid needs no host sync: sequence s numbers its query tiles from
``query_start_loc[s] // BLOCK_Q + s``, which never overlaps the next sequence's numbers, so
``T // BLOCK_Q + S`` programs cover every tile and a program finds its sequence by binary search.
Programs that land in the gaps between sequences do nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_tile import LOG2_E, load_kv_tile, online_softmax_step
from .checks import check_attention_inputs, check_query_start_loc
from .launch_config import MIN_DOT_SIZE, PrefillConfig, choose_prefill_config, padded_head_dim
from .runtime import (
    dot_dtype,
    kernel_output_dtype,
    next_power_of_2,
    require_launchable,
)


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, tile, BLOCK_Q: tl.constexpr):
    """The last sequence whose first tile number is <= ``tile``."""
    # Annotated so both bounds are int32 values from the start: the compiler rejects a
    # constant that becomes a tensor inside the loop.
    low: tl.int32 = 0
    high: tl.int32 = num_seqs
    while low < high - 1:
        middle = (low + high) // 2
        first_tile = tl.load(query_start_loc_ptr + middle) // BLOCK_Q + middle
        if first_tile <= tile:
            low = middle
        else:
            high = middle
    return low


@triton.jit(do_not_specialize=["num_seqs"])
def _prefill_kernel(
    query_ptr, key_cache_ptr, value_cache_ptr, block_tables_ptr, query_start_loc_ptr,
    seq_lens_ptr, out_ptr,
    scale_log2, num_seqs,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ko, stride_kh, stride_kd,
    stride_vb, stride_vo, stride_vh, stride_vd,
    stride_bts,
    stride_ot, stride_oh, stride_od,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, KV_TILE: tl.constexpr,
    DOT_DTYPE: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(query_start_loc_ptr, num_seqs, tile, BLOCK_Q)
    query_start = tl.load(query_start_loc_ptr + seq)
    query_len = tl.load(query_start_loc_ptr + seq + 1) - query_start
    q_tile = tile - (query_start // BLOCK_Q + seq)
    if q_tile * BLOCK_Q < query_len:
        seq_len = tl.load(seq_lens_ptr + seq)
        context_len = seq_len - query_len

        # Row r is query token r // GROUP_PAD of the tile and head r % GROUP_PAD of the group.
        rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
        tokens = q_tile * BLOCK_Q + rows // GROUP_PAD
        group_rows = rows % GROUP_PAD
        heads = kv_head * GROUP + group_rows
        row_mask = (tokens < query_len) & (group_rows < GROUP)
        dims = tl.arange(0, HEAD_DIM_PAD)
        dim_mask = dims < HEAD_DIM
        row_offsets = (query_start + tokens).to(tl.int64)
        q = tl.load(
            query_ptr + row_offsets[:, None] * stride_qt + heads[:, None] * stride_qh
            + dims[None, :] * stride_qd,
            mask=row_mask[:, None] & dim_mask[None, :],
            other=0.0,
        ).to(DOT_DTYPE)
        # Rows past the chunk's end get positions past the context; their results are
        # never stored, and position 0 keeps every row's first tile non-empty.
        query_positions = context_len + tokens
        kv_end = tl.minimum(seq_len, context_len + (q_tile + 1) * BLOCK_Q)

        block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bts
        running_max = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD], dtype=tl.float32)
        for tile_start in range(0, kv_end, KV_TILE):
            positions = tile_start + tl.arange(0, KV_TILE)
            position_mask = positions < kv_end
            k = load_kv_tile(
                key_cache_ptr, block_table_ptr, positions, position_mask, kv_head,
                stride_kb, stride_ko, stride_kh, stride_kd, dims, dim_mask, BLOCK_SIZE,
                DOT_DTYPE,
            )
            v = load_kv_tile(
                value_cache_ptr, block_table_ptr, positions, position_mask, kv_head,
                stride_vb, stride_vo, stride_vh, stride_vd, dims, dim_mask, BLOCK_SIZE,
                DOT_DTYPE,
            )
            causal = (positions[None, :] <= query_positions[:, None]) & position_mask[None, :]
            running_max, running_sum, acc = online_softmax_step(
                q, k, v, causal, running_max, running_sum, acc, scale_log2, DOT_DTYPE, PRECISION
            )

        result = acc / running_sum[:, None]
        tl.store(
            out_ptr + row_offsets[:, None] * stride_ot + heads[:, None] * stride_oh
            + dims[None, :] * stride_od,
            result.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & dim_mask[None, :],
        )


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    config: PrefillConfig | None = None,
) -> torch.Tensor:
    """Causal attention of packed query chunks over their paged context.

    query [T, H, D]; caches [N, B, Hkv, D]; block_tables int32 [S, M];
    query_start_loc int32 [S + 1]; seq_lens int32 [S] (context plus the chunk).
    Returns [T, H, D] in the query's dtype. ``config`` overrides the heuristic choice.
    """
    shape = check_attention_inputs(query, key_cache, value_cache, block_tables, seq_lens)
    num_seqs = block_tables.shape[0]
    check_query_start_loc(query_start_loc, num_seqs, query.device)
    require_launchable(_prefill_kernel, query, key_cache, block_tables, query_start_loc)
    if config is None:
        config = choose_prefill_config(shape, query.element_size())
    group_pad = next_power_of_2(shape.group_size)
    if config.block_q * group_pad < MIN_DOT_SIZE:
        raise ValueError(
            f"block_q {config.block_q} times the padded group size {group_pad} must be at "
            f"least {MIN_DOT_SIZE} rows"
        )
    num_tokens = query.shape[0]
    out = torch.empty(
        query.shape, dtype=kernel_output_dtype(_prefill_kernel, query.dtype), device=query.device
    )
    if num_tokens == 0 or num_seqs == 0:
        return out.to(query.dtype)
    operand_dtype, precision = dot_dtype(_prefill_kernel, key_cache.dtype)
    grid = (num_tokens // config.block_q + num_seqs, shape.num_kv_heads)
    _prefill_kernel[grid](
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, out,
        scale * LOG2_E, num_seqs,
        *query.stride(), *key_cache.stride(), *value_cache.stride(), block_tables.stride(0),
        *out.stride(),
        GROUP=shape.group_size, GROUP_PAD=group_pad,
        HEAD_DIM=shape.head_dim, HEAD_DIM_PAD=padded_head_dim(shape.head_dim),
        BLOCK_SIZE=shape.block_size, BLOCK_Q=config.block_q, KV_TILE=config.kv_tile,
        DOT_DTYPE=operand_dtype, PRECISION=precision,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out.to(query.dtype)
