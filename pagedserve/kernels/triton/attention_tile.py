"""Device helpers shared by the decode and prefill kernels: gathering a tile of K or V through
the block table, and one step of the online softmax (FlashAttention's running max and sum)."""

from __future__ import annotations

import triton
import triton.language as tl

# Scores are kept in the log2 domain so the softmax can use exp2.
LOG2_E = 1.4426950408889634


@triton.jit
def load_kv_tile(
    cache_ptr,
    block_table_ptr,
    positions,
    position_mask,
    kv_head,
    stride_block,
    stride_offset,
    stride_head,
    stride_dim,
    dims,
    dim_mask,
    BLOCK_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
):
    """[KV_TILE, HEAD_DIM_PAD] cache rows for context ``positions`` of one sequence.

    Each position looks up its own block, so a tile may span several blocks (block size 8) or
    part of one (block size 128). Masked lanes read block 0, which always exists.
    """
    block_ids = tl.load(block_table_ptr + positions // BLOCK_SIZE, mask=position_mask, other=0)
    # block id times block stride passes 2**31 in pools of a few GiB: do it in int64.
    row_offsets = block_ids.to(tl.int64) * stride_block + (positions % BLOCK_SIZE) * stride_offset
    pointers = (
        cache_ptr
        + row_offsets[:, None]
        + kv_head * stride_head
        + dims[None, :].to(tl.int64) * stride_dim
    )
    tile = tl.load(pointers, mask=position_mask[:, None] & dim_mask[None, :], other=0.0)
    return tile.to(DOT_DTYPE)


@triton.jit
def online_softmax_step(
    q,
    k,
    v,
    score_mask,
    running_max,
    running_sum,
    acc,
    scale_log2,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Fold one K/V tile into the running (max, sum, acc) of every query row.

    Scores live in the log2 domain (scale premultiplied by log2 e) so exp2 can be used. A row
    whose scores are all masked in this tile keeps its state: its max stays finite because the
    caller always starts with a tile holding at least one visible position for every row.
    """
    scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale_log2
    scores = tl.where(score_mask, scores, float("-inf"))
    new_max = tl.maximum(running_max, tl.max(scores, axis=1))
    rescale = tl.exp2(running_max - new_max)
    probs = tl.exp2(scores - new_max[:, None])
    running_sum = running_sum * rescale + tl.sum(probs, axis=1)
    acc = acc * rescale[:, None] + tl.dot(probs.to(DOT_DTYPE), v, input_precision=PRECISION)
    return new_max, running_sum, acc
