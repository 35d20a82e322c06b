"""Triton paged decode attention against a float64 reference and the project's torch reference.

Without CUDA the kernels run under Triton's interpreter (see conftest.py), so shapes are small
and the parametrisation covers each axis (dtype, head dim incl. a padded one, block size, GQA
ratio, split or not) without taking the full cross product.
"""

from __future__ import annotations

import pytest
import torch
from triton_cases import (
    DEVICE,
    NEEDS_CUDA,
    assert_matches,
    build_paged_kv,
    naive_decode,
    random_queries,
)

from pagedserve.kernels.dispatch import get_kernel_ops
from pagedserve.kernels.triton import DecodeConfig, paged_attention_decode

SCALE = 0.125


def _ragged_lens(block_size: int) -> list[int]:
    """One token, a block boundary from each side, and a context of several blocks."""
    return [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 5]


# (dtype, head_dim, block_size, num_heads, num_kv_heads, kv_tile, partition_size)
CASES = [
    pytest.param(torch.float32, 64, 16, 8, 2, 16, 32, id="fp32-d64-b16-gqa4"),
    pytest.param(torch.float16, 80, 8, 4, 4, 16, 16, id="fp16-d80-b8-mha"),
    pytest.param(torch.bfloat16, 64, 32, 8, 1, 32, 64, id="bf16-d64-b32-gqa8"),
    pytest.param(torch.float32, 80, 32, 8, 1, 16, 48, id="fp32-d80-b32-gqa8"),
]


@pytest.mark.parametrize(
    "dtype,head_dim,block_size,num_heads,num_kv_heads,kv_tile,partition_size", CASES
)
def test_decode_matches_reference_split_and_unsplit(
    dtype, head_dim, block_size, num_heads, num_kv_heads, kv_tile, partition_size
):
    kv = build_paged_kv(_ragged_lens(block_size), num_kv_heads, head_dim, block_size, dtype)
    query = random_queries(5, num_heads, head_dim, dtype)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)

    whole = paged_attention_decode(*args, config=DecodeConfig(kv_tile=kv_tile))
    split = paged_attention_decode(
        *args, config=DecodeConfig(kv_tile=kv_tile, partition_size=partition_size)
    )

    assert whole.dtype == dtype and whole.shape == query.shape
    expected = naive_decode(query, kv, SCALE)
    assert_matches(whole, expected, dtype)
    assert_matches(split, expected, dtype)
    # Splitting changes only the float32 summation order: equal up to one output rounding.
    atol = 1e-6 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps
    torch.testing.assert_close(split.float(), whole.float(), atol=atol, rtol=atol)
    reference = get_kernel_ops(DEVICE, backend="torch").paged_attention_decode(*args)
    assert_matches(whole, reference.double(), dtype)


def test_default_config_on_a_batch_of_one_long_sequence():
    # One sequence and one KV head leave the device idle: the heuristic splits the context.
    kv = build_paged_kv([300], 1, 64, 16, torch.float32)
    query = random_queries(1, 4, 64, torch.float32)
    out = paged_attention_decode(
        query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE
    )
    assert_matches(out, naive_decode(query, kv, SCALE), torch.float32)


def test_non_contiguous_query_rows():
    # The model hands over a slice of a fused qkv projection: rows are strided.
    kv = build_paged_kv([9, 20], 2, 64, 8, torch.float32)
    fused = random_queries(2, 12, 64, torch.float32)
    query = fused[:, :4]
    out = paged_attention_decode(
        query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE,
        config=DecodeConfig(kv_tile=16),
    )
    assert_matches(out, naive_decode(query.contiguous(), kv, SCALE), torch.float32)


def test_triton_backend_dispatches_to_these_kernels():
    ops = get_kernel_ops(DEVICE, backend="triton")
    assert ops.name == "triton"
    assert ops.paged_attention_decode is paged_attention_decode


def _decode_args(**overrides):
    args = dict(
        query=torch.zeros(2, 4, 64),
        key_cache=torch.zeros(3, 16, 2, 64),
        value_cache=torch.zeros(3, 16, 2, 64),
        block_tables=torch.zeros(2, 2, dtype=torch.int32),
        seq_lens=torch.ones(2, dtype=torch.int32),
        scale=SCALE,
    )
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        ({"key_cache": torch.zeros(3, 16, 2, 512), "value_cache": torch.zeros(3, 16, 2, 512),
          "query": torch.zeros(2, 4, 512)},
         ValueError, "head_dim 512 is outside the supported range 1..256"),
        ({"key_cache": torch.zeros(3, 12, 2, 64), "value_cache": torch.zeros(3, 12, 2, 64)},
         ValueError, "block_size 12 must be a power of two >= 8"),
        ({"query": torch.zeros(2, 3, 64)},
         ValueError, "num_heads 3 is not a multiple of num_kv_heads 2"),
        ({"query": torch.zeros(2, 4, 64, dtype=torch.float16)},
         TypeError, "query must be torch.float32, got torch.float16"),
        ({"block_tables": torch.zeros(2, 2, dtype=torch.int64)},
         TypeError, "block_tables must be torch.int32, got torch.int64"),
        ({"seq_lens": torch.ones(3, dtype=torch.int32)},
         ValueError, "seq_lens has 3 sequences but block_tables has 2"),
        ({"query": torch.zeros(3, 4, 64)},
         ValueError, "query has 3 rows for 2 sequences"),
        ({"value_cache": torch.zeros(3, 16, 2, 32)},
         ValueError, r"value_cache shape \(3, 16, 2, 32\) differs from key_cache shape"),
    ],
)
def test_bad_arguments_name_the_value_and_the_limit(overrides, error, message):
    with pytest.raises(error, match=message):
        paged_attention_decode(**_decode_args(**overrides))


def test_partition_must_be_a_multiple_of_the_tile():
    with pytest.raises(ValueError, match="partition_size 40 must be a positive multiple of "
                                         "kv_tile 16"):
        DecodeConfig(kv_tile=16, partition_size=40)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
@pytest.mark.parametrize("num_seqs", [1, 8, 64])
def test_llama_shapes_in_bf16_on_cuda(num_seqs):
    gen = torch.Generator().manual_seed(num_seqs)
    lens = torch.randint(1, 2048, (num_seqs,), generator=gen).tolist()
    kv = build_paged_kv(lens, 8, 128, 16, torch.bfloat16, seed=num_seqs)
    query = random_queries(num_seqs, 32, 128, torch.bfloat16)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)
    reference = get_kernel_ops(DEVICE, backend="torch").paged_attention_decode(*args)
    for config in (None, DecodeConfig(kv_tile=64), DecodeConfig(kv_tile=64, partition_size=256)):
        out = paged_attention_decode(*args, config=config)
        torch.testing.assert_close(out.float(), reference.float(), atol=2e-2, rtol=2e-2)
