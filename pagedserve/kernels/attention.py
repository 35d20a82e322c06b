"""Paged attention, torch reference.

Each op gathers every sequence's K/V through its block table with one index tensor, pads the
batch to the longest sequence, masks, and runs a single ``scaled_dot_product_attention`` over
the whole batch (grouped-query attention through ``enable_gqa``: no copy of the KV heads).
When padding would more than double the work (one long prompt beside short ones), sequences
are first split into a few groups of similar size — at most one group per power of two of
their length, never one call per sequence.
SDPA's CPU and CUDA kernels accumulate the softmax in float32 for half types; the output has
the query's dtype. A cache in another dtype than the query (a float32 model over a bfloat16
KV cache) is read in the query's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F


def _check_one_device(**tensors: torch.Tensor) -> None:
    """Raises ValueError unless every tensor is on the first one's device: a kernel that read a
    pointer from another device would crash the process, not fail."""
    if all(t.is_cpu for t in tensors.values()):
        return  # the CPU kernels' case, without building a device object per tensor
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"paged attention needs all its inputs on one device, got {where}")


def _check_common(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    _check_one_device(query=query, key_cache=key_cache, value_cache=value_cache,
                      block_tables=block_tables, seq_lens=seq_lens)
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {list(key_cache.shape)} and {list(value_cache.shape)}"
        )
    num_heads, head_dim = query.shape[1], query.shape[2]
    num_kv_heads = key_cache.shape[2]
    if head_dim != key_cache.shape[3] or num_heads % num_kv_heads != 0:
        raise ValueError(
            f"query heads x dim {num_heads}x{head_dim} do not fit the cache's "
            f"{num_kv_heads}x{key_cache.shape[3]} (query heads must be a multiple of KV heads)"
        )
    if block_tables.dim() != 2 or seq_lens.shape != (block_tables.shape[0],):
        raise ValueError(
            f"block_tables must be [S, M] and seq_lens [S], got {list(block_tables.shape)} "
            f"and {list(seq_lens.shape)}"
        )


def check_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Raises ValueError unless the decode inputs fit together (one query per sequence)."""
    _check_common(query, key_cache, value_cache, block_tables, seq_lens)
    if query.shape[0] != seq_lens.shape[0]:
        raise ValueError(
            f"decode takes one query per sequence: query has {query.shape[0]} rows for "
            f"{seq_lens.shape[0]} sequences"
        )


def max_seq_len(seq_lens: torch.Tensor, block_tables: torch.Tensor, block_size: int) -> int:
    lo, hi = (int(x) for x in torch.aminmax(seq_lens))
    capacity = block_tables.shape[1] * block_size
    if lo < 1 or hi > capacity:
        raise ValueError(
            f"seq_lens must lie in [1, {capacity}] (block table width "
            f"{block_tables.shape[1]} x block size {block_size}), got min {lo} max {hi}"
        )
    return hi


def check_prefill(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                  block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                  seq_lens: torch.Tensor) -> None:
    """Raises ValueError unless the packed prefill inputs fit together (the query lengths
    themselves: :func:`query_lengths`)."""
    _check_common(query, key_cache, value_cache, block_tables, seq_lens)
    _check_one_device(query=query, query_start_loc=query_start_loc)


def _gather_slots(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, max_len: int, block_size: int
) -> torch.Tensor:
    """Flat slot ids [S, max_len] of every sequence's positions 0..max_len-1."""
    pos = torch.arange(max_len, device=seq_lens.device)
    # Positions past a sequence's end re-read its last written slot rather than an unwritten
    # one: garbage there (even NaN) would survive a zero attention weight as 0 * NaN.
    pos = torch.minimum(pos[None, :], (seq_lens.long() - 1)[:, None])
    blocks = torch.gather(block_tables.long(), 1, pos // block_size)
    return blocks * block_size + pos % block_size


def _gather(cache: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Cache rows at ``slots`` [S, L] → [S, L, Hkv, D] in ``dtype`` (the query's: a cache may
    be kept in a narrower type than the model computes in)."""
    flat = cache.view(-1, cache.shape[2], cache.shape[3])
    rows = flat.index_select(0, slots.view(-1)).view(*slots.shape, *flat.shape[1:])
    return rows.to(dtype)


def _attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    allowed: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """query [S, Q, H, D], key/value [S, L, Hkv, D], allowed bool [S, Q, L] → [S, Q, H, D].
    ``allowed`` None: query row i sees key positions 0..i (Q == L)."""
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2),
        key.transpose(1, 2),
        value.transpose(1, 2),
        attn_mask=None if allowed is None else allowed[:, None],
        is_causal=allowed is None,
        scale=scale,
        enable_gqa=query.shape[2] != key.shape[2],
    )
    return out.transpose(1, 2)


# Padded work above this multiple of the real work splits a batch into length groups.
_MAX_PADDING_FACTOR = 2.0


def length_groups(lengths: torch.Tensor, costs: torch.Tensor) -> list[torch.Tensor] | None:
    """Row indices grouped by the power of two of ``lengths``, or None when padding every row
    to the largest cost wastes less than ``_MAX_PADDING_FACTOR``."""
    if lengths.numel() < 2:
        return None
    if float(costs.max()) * costs.numel() <= _MAX_PADDING_FACTOR * float(costs.sum()):
        return None
    keys = torch.frexp(lengths.float()).exponent
    return [(keys == key).nonzero()[:, 0] for key in keys.unique()]


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token [S, H, D] per sequence, at position ``seq_lens[s] - 1``, attending to
    all ``seq_lens[s]`` cached positions (its own K/V already written) → [S, H, D]."""
    check_decode(query, key_cache, value_cache, block_tables, seq_lens)
    groups = length_groups(seq_lens, seq_lens)
    if groups is None:
        return _decode_padded(query, key_cache, value_cache, block_tables, seq_lens, scale)
    out = torch.empty_like(query)
    for rows in groups:
        out[rows] = _decode_padded(query[rows], key_cache, value_cache, block_tables[rows],
                                   seq_lens[rows], scale)
    return out


def _decode_padded(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    block_size = key_cache.shape[1]
    max_len = max_seq_len(seq_lens, block_tables, block_size)
    slots = _gather_slots(block_tables, seq_lens, max_len, block_size)
    key, value = (_gather(key_cache, slots, query.dtype),
                  _gather(value_cache, slots, query.dtype))
    positions = torch.arange(max_len, device=query.device)
    allowed = (positions[None, :] < seq_lens[:, None])[:, None, :]  # [S, 1, L]
    return _attend(query[:, None], key, value, allowed, scale)[:, 0]


def query_lengths(
    query_start_loc: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Each sequence's query rows from ``query_start_loc`` [S+1]; ValueError unless every
    sequence has 1..seq_len of them and they add up to the ``num_tokens`` rows."""
    if query_start_loc.shape != (seq_lens.shape[0] + 1,):
        raise ValueError(
            f"query_start_loc must be [S+1] = [{seq_lens.shape[0] + 1}], "
            f"got {list(query_start_loc.shape)}"
        )
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    bad = (query_lens < 1) | (seq_lens < query_lens)
    if bool(bad.any()) or int(query_start_loc[-1]) != num_tokens:
        raise ValueError(
            "every sequence needs 1 <= q_len <= seq_len and the q_lens must sum to the "
            f"{num_tokens} query rows; got q_lens {query_lens.tolist()}, "
            f"seq_lens {seq_lens.tolist()}"
        )
    return query_lens


def _prefill_padded(
    query: torch.Tensor,
    out: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    starts: torch.Tensor,
    query_lens: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> None:
    """Causal attention for sequences with q_len > 1, padded to the longest query; writes the
    real rows of ``out``."""
    block_size = key_cache.shape[1]
    max_len = max_seq_len(seq_lens, block_tables, block_size)
    max_q = int(query_lens.max())
    step = torch.arange(max_q, device=query.device)
    # Padding rows repeat the sequence's last query row, so they stay inside its length.
    step_clamped = torch.minimum(step[None, :], (query_lens - 1)[:, None])  # [S, Q]
    rows = starts[:, None] + step_clamped
    # Query row i of a sequence sits at position context_len + i.
    # Prompts without cached context see positions 0..i, the causal mask itself: SDPA then
    # skips the masked blocks and builds no mask (about half of a prompt's attention).
    allowed = None
    if bool((seq_lens != query_lens).any()):
        last_visible = (seq_lens - query_lens)[:, None] + step_clamped  # [S, Q]
        positions = torch.arange(max_len, device=query.device)
        allowed = positions[None, None, :] <= last_visible[:, :, None]  # [S, Q, L]
    slots = _gather_slots(block_tables, seq_lens, max_len, block_size)
    key, value = (_gather(key_cache, slots, query.dtype),
                  _gather(value_cache, slots, query.dtype))
    first, num = int(starts[0]), starts.numel()
    in_order = torch.arange(first, first + num * max_q, device=rows.device)
    if bool((rows.view(-1) == in_order).all()):
        # Queries of one length packed in order (a batch of prompts): views, not copies.
        packed = slice(first, first + num * max_q)
        out[packed] = _attend(query[packed].view(num, max_q, *query.shape[1:]), key, value,
                              allowed, scale).reshape(-1, *query.shape[1:])
        return
    result = _attend(query[rows], key, value, allowed, scale)  # [S, Q, H, D]
    real = step[None, :] < query_lens[:, None]
    out[rows[real]] = result[real]


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    decode: Callable[..., torch.Tensor] | None = None,
) -> torch.Tensor:
    """Packed queries [T, H, D]: sequence s owns rows ``query_start_loc[s]:[s+1]``, its last
    q_len positions; row i attends causally to positions ``<= seq_lens[s] - q_len + i``,
    cached context included (chunked prefill, prefix hits) → [T, H, D]. ``decode`` (default
    :func:`paged_attention_decode`) computes the rows with q_len 1."""
    check_prefill(query, key_cache, value_cache, block_tables, query_start_loc, seq_lens)
    decode = decode or paged_attention_decode
    query_lens = query_lengths(query_start_loc, seq_lens, query.shape[0]).long()
    single = query_lens == 1
    if bool(single.all()):
        return decode(query, key_cache, value_cache, block_tables, seq_lens, scale)
    # Decode rows go through the decode path so that a long prefill in the same step does not
    # pad every decode to its query length.
    out = torch.empty_like(query)
    starts = query_start_loc[:-1].long()
    decodes = single.nonzero()[:, 0]
    if decodes.numel() > 0:
        rows = starts[decodes]
        out[rows] = decode(
            query[rows], key_cache, value_cache, block_tables[decodes], seq_lens[decodes], scale
        )
    prefills = (~single).nonzero()[:, 0]
    lens = seq_lens[prefills].long()
    groups = length_groups(query_lens[prefills], query_lens[prefills] * lens)
    for group in groups or [torch.arange(prefills.numel(), device=prefills.device)]:
        chosen = prefills[group]
        _prefill_padded(
            query, out, key_cache, value_cache, starts[chosen], query_lens[chosen],
            block_tables[chosen], lens[group], scale,
        )
    return out
