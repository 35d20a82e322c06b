"""The inductor-compiled CPU decode attention against a float64 reference and the project's
torch reference: shuffled paged layouts with NaN in every unwritten slot, block sizes 8/16/32,
GQA and MHA, ragged lengths (one batch split into length groups), a batch of one, chunked
prefill and prefix hits with decode rows mixed in."""

from __future__ import annotations

import pytest
import torch
from cpu_attention_cases import (
    REFERENCE,
    SCALE,
    check_bad_decode_input,
    check_prefill_with_prefix_hits,
    cpu_paged_kv,
    cpu_queries,
)
from triton_cases import assert_matches, naive_decode

from pagedserve.kernels import compiled_attention
from pagedserve.kernels.dispatch import has_cpp_compiler

pytestmark = pytest.mark.skipif(not has_cpp_compiler(), reason="inductor needs a C++ compiler")

# One compile per (heads, KV heads, head size, dtype): block sizes and lengths are dynamic.
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("dtype,num_heads,num_kv_heads", [
    pytest.param(torch.float32, 8, 2, id="fp32-gqa4"),
    pytest.param(torch.bfloat16, 4, 4, id="bf16-mha"),
])
def test_decode_matches_reference(block_size, dtype, num_heads, num_kv_heads):
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 2, 5]
    kv = cpu_paged_kv(seq_lens, num_kv_heads, 64, block_size, dtype)
    query = cpu_queries(len(seq_lens), num_heads, 64, dtype)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)

    out = compiled_attention.paged_attention_decode(*args)

    assert out.dtype == dtype and out.shape == query.shape
    assert_matches(out, naive_decode(query, kv, SCALE), dtype)
    assert_matches(out, REFERENCE.paged_attention_decode(*args).double(), dtype)


def test_ragged_batch_and_a_batch_of_one():
    # 3 vs 300 positions: padding would waste > 2x, so the batch runs as length groups.
    kv = cpu_paged_kv([3, 300, 17], 2, 64, 16, torch.float32)
    query = cpu_queries(3, 8, 64, torch.float32)
    out = compiled_attention.paged_attention_decode(
        query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)
    assert_matches(out, naive_decode(query, kv, SCALE), torch.float32)

    one = compiled_attention.paged_attention_decode(
        query[1:2], kv.key_cache, kv.value_cache, kv.block_tables[1:2], kv.seq_lens[1:2], SCALE)
    assert_matches(one, naive_decode(query, kv, SCALE)[1:2], torch.float32)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_prefill_with_prefix_hits_and_decode_rows(block_size):
    check_prefill_with_prefix_hits(compiled_attention.paged_attention_prefill, block_size)


def test_bad_input_is_the_reference_error():
    check_bad_decode_input(compiled_attention.paged_attention_decode)


def test_warm_up_compiles_before_the_first_call():
    seconds = compiled_attention.warm_up(8, 2, 64, 16, torch.float32)
    assert seconds > 0
