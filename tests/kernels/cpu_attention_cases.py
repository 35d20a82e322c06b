"""Cases every CPU attention backend (compiled, C) passes alike, on CPU tensors: mixed
prefill steps against the float64 reference and the torch backend, and the torch backend's
errors for bad decode input."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from triton_cases import PagedKV, assert_matches, build_paged_kv, naive_prefill

from pagedserve.kernels.dispatch import get_kernel_ops

SCALE = 0.125
REFERENCE = get_kernel_ops("cpu", backend="torch")


def cpu_paged_kv(seq_lens: list[int], num_kv_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype) -> PagedKV:
    """The shared paged layout, on the CPU even where CUDA is there."""
    return build_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype,
                          device=torch.device("cpu"))


def cpu_queries(num_rows: int, num_heads: int, head_dim: int,
                dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randn(num_rows, num_heads, head_dim, generator=gen).to(dtype)


def check_prefill_with_prefix_hits(prefill: Callable[..., torch.Tensor],
                                   block_size: int) -> None:
    # (cached context, new tokens): a fresh prompt, decodes at both sides of a block boundary,
    # a chunk after a prefix hit one past a boundary, a short chunk after a long context.
    chunks = [(0, 7), (block_size - 1, 1), (block_size, 1), (block_size + 1, block_size + 2),
              (2 * block_size + 8, 5)]
    query_lens = [q for _, q in chunks]
    starts = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    kv = cpu_paged_kv([c + q for c, q in chunks], 2, 64, block_size, torch.float32)
    query = cpu_queries(sum(query_lens), 8, 64, torch.float32)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, starts, kv.seq_lens, SCALE)

    out = prefill(*args)

    assert_matches(out, naive_prefill(query, kv, query_lens, SCALE), torch.float32)
    assert_matches(out, REFERENCE.paged_attention_prefill(*args).double(), torch.float32)


def check_bad_decode_input(decode: Callable[..., torch.Tensor]) -> None:
    kv = cpu_paged_kv([5, 9], 2, 64, 8, torch.float32)
    query = cpu_queries(3, 8, 64, torch.float32)
    with pytest.raises(ValueError, match="decode takes one query per sequence: query has 3 "
                                         "rows for 2 sequences"):
        decode(query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)
    # A cache on another device would hand the C kernel a pointer it cannot read.
    elsewhere = kv.key_cache.to("meta")
    with pytest.raises(ValueError, match=r"^paged attention needs all its inputs on one device, "
                                         r"got query on cpu, key_cache on meta, value_cache on "
                                         r"cpu, block_tables on cpu, seq_lens on cpu$"):
        decode(query[:2], elsewhere, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)
    too_long = torch.tensor([5, 99], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"seq_lens must lie in \[1, 24\]"):
        decode(query[:2], kv.key_cache, kv.value_cache, kv.block_tables, too_long, SCALE)
