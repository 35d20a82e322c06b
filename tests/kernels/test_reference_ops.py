"""The torch reference ops against naive per-sequence loops written out here."""

from __future__ import annotations

import math

import pytest
import torch

from pagedserve.kernels.attention import paged_attention_decode, paged_attention_prefill
from pagedserve.kernels.cache_ops import copy_blocks, reshape_and_cache, swap_blocks

BLOCK = 4
HEAD_DIM = 8
NUM_BLOCKS = 40


def _tables(seq_lens: list[int], gen: torch.Generator) -> torch.Tensor:
    """Block tables [S, M] over shuffled physical blocks; unused entries hold 0."""
    needed = [math.ceil(n / BLOCK) for n in seq_lens]
    physical = torch.randperm(NUM_BLOCKS - 1, generator=gen)[: sum(needed)] + 1
    width = max(needed) + 1  # one spare column: the kernel must not read it
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    start = 0
    for s, n in enumerate(needed):
        tables[s, :n] = physical[start : start + n]
        start += n
    return tables


def _filled_cache(seq_lens, tables, num_kv_heads, gen):
    """Caches whose unwritten slots hold NaN, with each sequence's positions written."""
    shape = (NUM_BLOCKS, BLOCK, num_kv_heads, HEAD_DIM)
    key_cache = torch.full(shape, float("nan"))
    value_cache = torch.full(shape, float("nan"))
    for s, n in enumerate(seq_lens):
        for p in range(n):
            block, offset = int(tables[s, p // BLOCK]), p % BLOCK
            key_cache[block, offset] = torch.randn(num_kv_heads, HEAD_DIM, generator=gen)
            value_cache[block, offset] = torch.randn(num_kv_heads, HEAD_DIM, generator=gen)
    return key_cache, value_cache


def _naive_attention(q, key_cache, value_cache, table, visible, scale):
    """One query [H, D] attending to positions 0..visible-1 of one sequence, in float64."""
    num_heads, num_kv_heads = q.shape[0], key_cache.shape[2]
    out = torch.empty(num_heads, HEAD_DIM, dtype=torch.float64)
    for h in range(num_heads):
        kv_head = h // (num_heads // num_kv_heads)
        keys, values = [], []
        for p in range(visible):
            block, offset = int(table[p // BLOCK]), p % BLOCK
            keys.append(key_cache[block, offset, kv_head].double())
            values.append(value_cache[block, offset, kv_head].double())
        scores = torch.stack(keys) @ q[h].double() * scale
        out[h] = torch.softmax(scores, 0) @ torch.stack(values)
    return out


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (8, 2)])
def test_decode_matches_naive_on_ragged_lengths(num_heads, num_kv_heads):
    gen = torch.Generator().manual_seed(0)
    seq_lens = [1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 2]
    tables = _tables(seq_lens, gen)
    key_cache, value_cache = _filled_cache(seq_lens, tables, num_kv_heads, gen)
    query = torch.randn(len(seq_lens), num_heads, HEAD_DIM, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)

    out = paged_attention_decode(query, key_cache, value_cache, tables, lens, 0.3)

    assert out.shape == query.shape and out.dtype == torch.float32
    for s, n in enumerate(seq_lens):
        expected = _naive_attention(query[s], key_cache, value_cache, tables[s], n, 0.3)
        torch.testing.assert_close(out[s].double(), expected, atol=1e-5, rtol=1e-5)


# (cached context, query length) per sequence: whole prompts, chunks after a cached prefix,
# and decodes mixed into the same packed batch.
PREFILL_CASES = [
    [(0, 5), (0, 1), (0, BLOCK)],
    [(BLOCK, BLOCK + 1), (7, 1), (0, 2 * BLOCK + 3), (3, 6)],
    [(2 * BLOCK - 1, 1), (BLOCK + 1, 1)],
]


@pytest.mark.parametrize("case", PREFILL_CASES)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(2, 2), (4, 2), (8, 2)])
def test_prefill_matches_naive_with_cached_context(case, num_heads, num_kv_heads):
    gen = torch.Generator().manual_seed(1)
    seq_lens = [ctx + q for ctx, q in case]
    tables = _tables(seq_lens, gen)
    key_cache, value_cache = _filled_cache(seq_lens, tables, num_kv_heads, gen)
    starts = [0]
    for _, q_len in case:
        starts.append(starts[-1] + q_len)
    query = torch.randn(starts[-1], num_heads, HEAD_DIM, generator=gen)

    out = paged_attention_prefill(
        query, key_cache, value_cache, tables,
        torch.tensor(starts, dtype=torch.int32), torch.tensor(seq_lens, dtype=torch.int32), 0.5,
    )

    assert out.shape == query.shape
    for s, (ctx, q_len) in enumerate(case):
        for i in range(q_len):
            row = starts[s] + i
            expected = _naive_attention(
                query[row], key_cache, value_cache, tables[s], ctx + i + 1, 0.5
            )
            torch.testing.assert_close(out[row].double(), expected, atol=1e-5, rtol=1e-5)


def test_prefill_of_single_tokens_equals_decode():
    gen = torch.Generator().manual_seed(2)
    seq_lens = [3, 9, 1]
    tables = _tables(seq_lens, gen)
    key_cache, value_cache = _filled_cache(seq_lens, tables, 2, gen)
    query = torch.randn(3, 4, HEAD_DIM, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    starts = torch.tensor([0, 1, 2, 3], dtype=torch.int32)

    prefill = paged_attention_prefill(query, key_cache, value_cache, tables, starts, lens, 0.4)
    decode = paged_attention_decode(query, key_cache, value_cache, tables, lens, 0.4)

    assert torch.equal(prefill, decode)


def test_bfloat16_output_has_query_dtype_and_tracks_float32():
    gen = torch.Generator().manual_seed(3)
    seq_lens = [BLOCK + 3, 2]
    tables = _tables(seq_lens, gen)
    key_cache, value_cache = _filled_cache(seq_lens, tables, 2, gen)
    query = torch.randn(2, 4, HEAD_DIM, generator=gen)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    args = (tables, lens, HEAD_DIM**-0.5)

    full = paged_attention_decode(query, key_cache, value_cache, *args)
    half = paged_attention_decode(
        query.bfloat16(), key_cache.bfloat16(), value_cache.bfloat16(), *args
    )

    assert half.dtype == torch.bfloat16
    # bf16 inputs carry ~3 significant digits; the float32 softmax keeps the error at that level.
    torch.testing.assert_close(half.float(), full, atol=3e-2, rtol=0)


def test_reshape_and_cache_writes_slots_and_skips_padding():
    gen = torch.Generator().manual_seed(4)
    key_cache = torch.zeros(6, BLOCK, 2, HEAD_DIM)
    value_cache = torch.zeros(6, BLOCK, 2, HEAD_DIM)
    slots = [5 * BLOCK + 1, -1, 2 * BLOCK, 0, -1, 3 * BLOCK + 3]
    key = torch.randn(len(slots), 2, HEAD_DIM, generator=gen)
    value = torch.randn(len(slots), 2, HEAD_DIM, generator=gen)

    reshape_and_cache(key, value, key_cache, value_cache, torch.tensor(slots))

    expected_k, expected_v = torch.zeros_like(key_cache), torch.zeros_like(value_cache)
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected_k[slot // BLOCK, slot % BLOCK] = key[t]
            expected_v[slot // BLOCK, slot % BLOCK] = value[t]
    assert torch.equal(key_cache, expected_k)
    assert torch.equal(value_cache, expected_v)


def test_copy_blocks_copies_every_layer_and_nothing_else():
    gen = torch.Generator().manual_seed(5)
    keys = [torch.randn(5, BLOCK, 2, HEAD_DIM, generator=gen) for _ in range(3)]
    values = [torch.randn(5, BLOCK, 2, HEAD_DIM, generator=gen) for _ in range(3)]
    before = [c.clone() for c in keys + values]
    mapping = [(1, 3), (4, 0)]

    copy_blocks(keys, values, torch.tensor(mapping))

    for cache, old in zip(keys + values, before, strict=True):
        expected = old.clone()
        for src, dst in mapping:
            expected[dst] = old[src]
        assert torch.equal(cache, expected)


def test_swap_blocks_between_pools_of_different_sizes():
    gen = torch.Generator().manual_seed(6)
    device_pool = torch.randn(6, BLOCK, 2, HEAD_DIM, generator=gen)
    cpu_pool = torch.zeros(3, BLOCK, 2, HEAD_DIM)

    swap_blocks(device_pool, cpu_pool, torch.tensor([(5, 0), (2, 2)]))
    assert torch.equal(cpu_pool[0], device_pool[5])
    assert torch.equal(cpu_pool[2], device_pool[2])
    assert torch.equal(cpu_pool[1], torch.zeros(BLOCK, 2, HEAD_DIM))

    swap_blocks(cpu_pool, device_pool, torch.tensor([(0, 1)]))
    assert torch.equal(device_pool[1], device_pool[5])


def test_empty_mappings_are_no_ops():
    cache = torch.ones(2, BLOCK, 1, HEAD_DIM)
    empty = torch.empty(0, 2, dtype=torch.int64)
    copy_blocks([cache], [cache], empty)
    swap_blocks(cache, cache, empty)
    assert torch.equal(cache, torch.ones(2, BLOCK, 1, HEAD_DIM))


def test_seq_len_beyond_block_table_is_refused():
    cache = torch.zeros(4, BLOCK, 1, HEAD_DIM)
    tables = torch.tensor([[1, 2]], dtype=torch.int32)
    with pytest.raises(ValueError) as info:
        paged_attention_decode(
            torch.zeros(1, 1, HEAD_DIM), cache, cache, tables,
            torch.tensor([2 * BLOCK + 1], dtype=torch.int32), 1.0,
        )
    assert str(info.value) == (
        "seq_lens must lie in [1, 8] (block table width 2 x block size 4), got min 9 max 9"
    )


def test_query_lengths_must_fit_sequence_lengths():
    cache = torch.zeros(4, BLOCK, 1, HEAD_DIM)
    with pytest.raises(ValueError) as info:
        paged_attention_prefill(
            torch.zeros(5, 1, HEAD_DIM), cache, cache, torch.tensor([[1, 2], [3, 0]]).int(),
            torch.tensor([0, 4, 5]).int(), torch.tensor([3, 1]).int(), 1.0,
        )
    assert str(info.value) == (
        "every sequence needs 1 <= q_len <= seq_len and the q_lens must sum to the 5 query "
        "rows; got q_lens [4, 1], seq_lens [3, 1]"
    )


def test_heads_must_group_onto_kv_heads():
    cache = torch.zeros(4, BLOCK, 2, HEAD_DIM)
    with pytest.raises(ValueError) as info:
        paged_attention_decode(
            torch.zeros(1, 3, HEAD_DIM), cache, cache, torch.tensor([[1]]).int(),
            torch.tensor([1]).int(), 1.0,
        )
    assert str(info.value) == (
        "query heads x dim 3x8 do not fit the cache's 2x8 (query heads must be a multiple "
        "of KV heads)"
    )
