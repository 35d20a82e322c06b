"""Triton paged prefill attention (chunked prefill and prefix-cache hits) against a float64
reference and the project's torch reference; interpreted on the CPU without CUDA."""

from __future__ import annotations

import pytest
import torch
from triton_cases import (
    DEVICE,
    NEEDS_CUDA,
    assert_matches,
    build_paged_kv,
    naive_prefill,
    random_queries,
)

from pagedserve.kernels.dispatch import get_kernel_ops
from pagedserve.kernels.triton import PrefillConfig, paged_attention_prefill

SCALE = 0.125


def _chunks(block_size: int) -> list[tuple[int, int]]:
    """(cached context, new query tokens) per sequence: a fresh prompt, a decode-like row at
    each side of a block boundary, a chunk that crosses blocks after a one-past-boundary
    prefix hit, and a short chunk after a long context."""
    return [
        (0, 7),
        (block_size - 1, 1),
        (block_size, 2),
        (block_size + 1, block_size + 2),
        (2 * block_size + 8, 5),
    ]


def _packed(chunks):
    query_lens = [q_len for _, q_len in chunks]
    starts = [0]
    for q_len in query_lens:
        starts.append(starts[-1] + q_len)
    query_start_loc = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    return query_lens, query_start_loc, [context + q_len for context, q_len in chunks]


# (dtype, head_dim, block_size, num_heads, num_kv_heads, config)
CASES = [
    pytest.param(torch.float32, 64, 16, 8, 2, PrefillConfig(block_q=4, kv_tile=16),
                 id="fp32-d64-b16-gqa4"),
    pytest.param(torch.float16, 80, 8, 2, 2, PrefillConfig(block_q=16, kv_tile=16),
                 id="fp16-d80-b8-mha"),
    pytest.param(torch.bfloat16, 64, 32, 8, 1, PrefillConfig(block_q=2, kv_tile=32),
                 id="bf16-d64-b32-gqa8"),
    pytest.param(torch.float32, 80, 16, 8, 2, None, id="fp32-d80-b16-gqa4-default"),
]


@pytest.mark.parametrize("dtype,head_dim,block_size,num_heads,num_kv_heads,config", CASES)
def test_prefill_matches_reference(dtype, head_dim, block_size, num_heads, num_kv_heads,
                                   config):
    query_lens, query_start_loc, seq_lens = _packed(_chunks(block_size))
    kv = build_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    query = random_queries(sum(query_lens), num_heads, head_dim, dtype)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, query_start_loc,
            kv.seq_lens, SCALE)

    out = paged_attention_prefill(*args, config=config)

    assert out.dtype == dtype and out.shape == query.shape
    assert_matches(out, naive_prefill(query, kv, query_lens, SCALE), dtype)
    reference = get_kernel_ops(DEVICE, backend="torch").paged_attention_prefill(*args)
    assert_matches(out, reference.double(), dtype)


def test_tiles_of_one_query_token_with_a_large_group():
    # block_q 1: every query token is its own tile, so sequence lookup sees no gaps at all.
    query_lens, query_start_loc, seq_lens = _packed([(3, 4), (0, 1), (20, 3)])
    kv = build_paged_kv(seq_lens, 1, 64, 8, torch.float32)
    query = random_queries(sum(query_lens), 16, 64, torch.float32)
    out = paged_attention_prefill(
        query, kv.key_cache, kv.value_cache, kv.block_tables, query_start_loc, kv.seq_lens,
        SCALE, config=PrefillConfig(block_q=1, kv_tile=16),
    )
    assert_matches(out, naive_prefill(query, kv, query_lens, SCALE), torch.float32)


def test_tile_rows_below_the_dot_minimum_are_rejected():
    kv = build_paged_kv([4], 2, 64, 8, torch.float32)
    with pytest.raises(ValueError, match="block_q 4 times the padded group size 2 must be at "
                                         "least 16 rows"):
        paged_attention_prefill(
            random_queries(4, 4, 64, torch.float32), kv.key_cache, kv.value_cache,
            kv.block_tables, torch.tensor([0, 4], dtype=torch.int32, device=DEVICE),
            kv.seq_lens, SCALE, config=PrefillConfig(block_q=4, kv_tile=16),
        )


@pytest.mark.parametrize(
    "query_start_loc,message",
    [
        (torch.tensor([0, 4]), "query_start_loc must be torch.int32, got torch.int64"),
        (torch.tensor([0, 2, 4], dtype=torch.int32),
         "query_start_loc must hold num_seqs \\+ 1 = 2 offsets, got 3"),
    ],
)
def test_bad_query_start_loc(query_start_loc, message):
    kv = build_paged_kv([4], 2, 64, 8, torch.float32)
    with pytest.raises((TypeError, ValueError), match=message):
        paged_attention_prefill(
            random_queries(4, 4, 64, torch.float32), kv.key_cache, kv.value_cache,
            kv.block_tables, query_start_loc.to(DEVICE), kv.seq_lens, SCALE,
        )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
def test_llama_shapes_in_bf16_on_cuda():
    chunks = [(0, 300), (1000, 129), (37, 1), (512, 64), (2000, 17)]
    query_lens, query_start_loc, seq_lens = _packed(chunks)
    kv = build_paged_kv(seq_lens, 8, 128, 16, torch.bfloat16, seed=3)
    query = random_queries(sum(query_lens), 32, 128, torch.bfloat16)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, query_start_loc,
            kv.seq_lens, SCALE)
    reference = get_kernel_ops(DEVICE, backend="torch").paged_attention_prefill(*args)
    out = paged_attention_prefill(*args)
    torch.testing.assert_close(out.float(), reference.float(), atol=2e-2, rtol=2e-2)
