"""Paged decode attention compiled by inductor for the CPU: reads the KV blocks where they are.

The torch reference (``attention.py``) gathers every sequence's whole context into a padded
copy each step, then runs SDPA over the copy; on a CPU that copy costs as much as the attention
itself. Written as element-wise products and reductions, the same math lets inductor fuse the
block-table lookup into the loads: one C++ loop nest per reduction, each K/V row read once,
straight out of the cache, nothing materialised but the [S, L, heads] scores.

One graph with dynamic sizes serves every batch: sizes 1 are padded to 2, because inductor
specialises on size 1 and would compile again mid-serving. :func:`warm_up` compiles it before
the first request. Softmax and accumulation run in float32; the output has the query's dtype.
Prefill rows (q_len > 1) keep the reference path; decode rows of a mixed step come here.
"""

from __future__ import annotations

import functools
import logging
import time

import torch

from pagedserve.kernels import attention

logger = logging.getLogger(__name__)


def _decode_math(
    query: torch.Tensor,  # [S, H, D]
    key_cache: torch.Tensor,  # [N, B, Hkv, D]
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,  # int32 [S, M]
    seq_lens: torch.Tensor,  # int32 [S]
    scale: float,
) -> torch.Tensor:
    num_seqs, num_heads, head_dim = query.shape
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    group = num_heads // num_kv_heads
    max_len = block_tables.shape[1] * block_size
    pos = torch.arange(max_len, device=query.device)
    # Positions past a sequence's end re-read its last slot: unwritten slots may hold NaN,
    # which a zero weight would not cancel.
    clamped = torch.minimum(pos[None, :], (seq_lens.long() - 1)[:, None])  # [S, L]
    blocks = torch.gather(block_tables.long(), 1, clamped // block_size)
    slots = blocks * block_size + clamped % block_size  # [S, L]
    rows = num_blocks * block_size
    # Scores keep L outside the head dims: the QK reduction then runs over contiguous D and
    # PV over L with D vectorised (measured 5x faster than an [S, Hkv, G, L] layout).
    key = key_cache.view(rows, num_kv_heads, 1, head_dim)[slots]  # [S, L, Hkv, 1, D]
    q = query.view(num_seqs, 1, num_kv_heads, group, head_dim).float()
    scores = (q * key.float()).sum(-1) * scale  # [S, L, Hkv, G]
    valid = (pos[None, :] < seq_lens[:, None])[:, :, None, None]
    probs = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=1)
    value = value_cache.view(rows, num_kv_heads, 1, head_dim)[slots]
    out = (probs[..., None] * value.float()).sum(1)  # [S, Hkv, G, D]
    return out.reshape(num_seqs, num_heads, head_dim).to(query.dtype)


@functools.cache
def _compiled():
    return torch.compile(_decode_math, fullgraph=True)


def _mark_dynamic(*tensors_and_dims: tuple[torch.Tensor, tuple[int, ...]]) -> None:
    # Batch, cache and table sizes vary; heads and head size stay static so that the loops
    # over them vectorise without tails. A size-1 dim would be specialised anyway.
    for tensor, dims in tensors_and_dims:
        wanted = [d for d in dims if tensor.shape[d] > 1]
        if wanted:
            torch._dynamo.mark_dynamic(tensor, wanted)


def _pad_to_two(
    query: torch.Tensor, block_tables: torch.Tensor, seq_lens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if block_tables.shape[1] < 2:
        # The extra column is never read: positions are clamped to each sequence's length.
        block_tables = torch.cat([block_tables, block_tables], dim=1)
    if query.shape[0] < 2:
        query, block_tables, seq_lens = (
            torch.cat([t, t]) for t in (query, block_tables, seq_lens)
        )
    return query, block_tables, seq_lens


def _decode_rows(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    max_len: int,
) -> torch.Tensor:
    width = -(-max_len // key_cache.shape[1])
    num_seqs = query.shape[0]
    # Contiguous inputs: dynamo guards on strides, and a sliced table would compile again.
    query, tables, lens = _pad_to_two(query.contiguous(),
                                      block_tables[:, :width].contiguous(), seq_lens)
    _mark_dynamic((query, (0,)), (key_cache, (0, 1)), (value_cache, (0, 1)), (tables, (0, 1)),
                  (lens, (0,)))
    # One grad mode for every call: a change of global state is a recompile.
    with torch.inference_mode():
        try:
            out = _compiled()(query, key_cache, value_cache, tables, lens, scale)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            # Each head layout and dtype is its own graph; a process that has loaded more
            # models than dynamo keeps graphs for runs the rest on the reference.
            _warn_recompile_limit()
            out = attention.paged_attention_decode(query, key_cache, value_cache, tables, lens,
                                                   scale)
    return out[:num_seqs]


@functools.cache
def _warn_recompile_limit() -> None:
    logger.warning("the compiled decode attention reached dynamo's recompile limit; new "
                   "head layouts run the torch reference")


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.attention.paged_attention_decode`."""
    attention.check_decode(query, key_cache, value_cache, block_tables, seq_lens)
    block_size = key_cache.shape[1]
    groups = attention.length_groups(seq_lens, seq_lens)
    if groups is None:
        max_len = attention.max_seq_len(seq_lens, block_tables, block_size)
        return _decode_rows(query, key_cache, value_cache, block_tables, seq_lens, scale,
                            max_len)
    attention.max_seq_len(seq_lens, block_tables, block_size)
    out = torch.empty_like(query)
    for rows in groups:
        lens = seq_lens[rows]
        out[rows] = _decode_rows(query[rows], key_cache, value_cache, block_tables[rows], lens,
                                 scale, int(lens.max()))
    return out


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.attention.paged_attention_prefill`; its
    decode rows run the compiled kernel."""
    return attention.paged_attention_prefill(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
        decode=paged_attention_decode,
    )


def warm_up(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> float:
    """Compiles the decode kernel for this shape family now, not on the first request;
    returns the seconds it took."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    # Distinct K and V tensors: dynamo guards on aliasing, and the engine's never alias.
    key, value = (torch.randn(6, block_size, num_kv_heads, head_dim, generator=gen).to(dtype)
                  for _ in range(2))
    query = torch.randn(2, num_heads, head_dim, generator=gen).to(dtype)
    tables = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)
    lens = torch.tensor([block_size + 1, 2], dtype=torch.int32)
    # Dynamo tells inference tensors apart: the engine's caches are made outside inference
    # mode, a step's queries and tables inside it.
    with torch.inference_mode():
        query, tables, lens = (t.clone() for t in (query, tables, lens))
        try:
            paged_attention_decode(query, key, value, tables, lens, head_dim**-0.5)
        except Exception as exc:  # inductor reports compiler trouble under many types
            raise RuntimeError(
                f"compiling the CPU attention kernel failed ({type(exc).__name__}: {exc}); "
                "run with --kernel-backend torch (or PAGEDSERVE_KERNEL_BACKEND=torch)"
            ) from exc
    seconds = time.perf_counter() - start
    logger.info("compiled the CPU decode attention kernel (%s) in %.1f s", dtype, seconds)
    return seconds
