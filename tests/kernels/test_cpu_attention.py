"""The C decode attention (the default CPU backend) against a float64 reference and the torch
reference: shuffled paged layouts with NaN in every unwritten slot, block sizes 8/16/32, GQA
and MHA, head sizes with and without a specialised loop, float32 and bfloat16, ragged batches
split across threads, a batch of one, and decode rows inside a mixed prefill step. Also the
build: cached per machine, and a compiler failure reported with its output."""

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

from pagedserve.common.cache_dir import CACHE_ENV
from pagedserve.kernels import cpu_attention, cpu_parallel, native_build

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")

def _decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, dtype):
    kv = cpu_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, dtype)
    query = cpu_queries(len(seq_lens), num_heads, head_dim, dtype)
    args = (query, kv.key_cache, kv.value_cache, kv.block_tables, kv.seq_lens, SCALE)
    return cpu_attention.paged_attention_decode(*args), query, kv, args


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("dtype,num_heads,num_kv_heads,head_dim", [
    pytest.param(torch.float32, 8, 2, 64, id="fp32-gqa4-d64"),
    pytest.param(torch.float32, 6, 3, 40, id="fp32-gqa2-d40"),
    pytest.param(torch.bfloat16, 4, 4, 128, id="bf16-mha-d128"),
])
def test_decode_matches_reference(block_size, dtype, num_heads, num_kv_heads, head_dim):
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 3 * block_size + 2, 5]
    out, query, kv, args = _decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size,
                                   dtype)
    assert out.dtype == dtype and out.shape == query.shape
    assert not out.isnan().any()
    assert_matches(out, naive_decode(query, kv, SCALE), dtype)
    assert_matches(out, REFERENCE.paged_attention_decode(*args).double(), dtype)


@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [8, 16])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 2, 64), (6, 3, 40)])
def test_a_float32_query_over_a_16_bit_cache(block_size, num_heads, num_kv_heads, head_dim,
                                             cache_dtype):
    # A float32 model may keep its KV cache in 16 bits: the kernel reads the 16-bit rows and
    # computes in float32, so it matches float32 math over the same (rounded) values.
    seq_lens = [1, block_size + 1, 3 * block_size + 2, 5]
    kv = cpu_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, cache_dtype)
    query = cpu_queries(len(seq_lens), num_heads, head_dim, torch.float32)
    out = cpu_attention.paged_attention_decode(query, kv.key_cache, kv.value_cache,
                                               kv.block_tables, kv.seq_lens, SCALE)
    assert out.dtype == torch.float32
    assert_matches(out, naive_decode(query, kv, SCALE), torch.float32)
    reference = REFERENCE.paged_attention_decode(query, kv.key_cache, kv.value_cache,
                                                 kv.block_tables, kv.seq_lens, SCALE)
    assert reference.dtype == torch.float32
    assert_matches(out, reference.double(), torch.float32)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [
    (16, 2, 64), (12, 4, 80), (4, 1, 96), (3, 3, 128)])
def test_long_contexts_match_the_reference(cache_dtype, block_size, num_heads, num_kv_heads,
                                           head_dim):
    # Hundreds of positions under one softmax beside short and partial blocks, each
    # specialised head size, and 1 to 8 query heads a KV head, over every cache type.
    seq_lens = [1, 17, 15, 700, 2 * block_size]
    kv = cpu_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, cache_dtype)
    query = cpu_queries(len(seq_lens), num_heads, head_dim, torch.float32) * 3.0
    out = cpu_attention.paged_attention_decode(query, kv.key_cache, kv.value_cache,
                                               kv.block_tables, kv.seq_lens, SCALE)
    assert not out.isnan().any()
    assert_matches(out, naive_decode(query, kv, SCALE), torch.float32)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_ragged_batch_split_across_threads(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, query, kv, _ = _decode([3, 300, 17, 1, 64, 250, 9], 8, 2, 64, 16, torch.float32)
    finally:
        torch.set_num_threads(before)
    assert_matches(out, naive_decode(query, kv, SCALE), torch.float32)


@pytest.mark.parametrize("threads", [2, 3, 8])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 8), (6, 3), (4, 1)])
def test_fewer_sequences_than_threads_split_their_kv_heads(threads, num_heads, num_kv_heads):
    # One stream's attention is cut by KV heads so that every thread reads part of the
    # context; each part writes only its own query heads of the output.
    seq_lens = [300] if threads != 3 else [300, 9]
    parts = cpu_attention.decode_parts(torch.tensor(seq_lens, dtype=torch.int32),
                                       num_kv_heads, threads)
    covered = [(s, h) for s0, s1, h0, h1 in parts for s in range(s0, s1) for h in range(h0, h1)]
    assert sorted(covered) == [(s, h) for s in range(len(seq_lens)) for h in range(num_kv_heads)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, query, kv, _ = _decode(seq_lens, num_heads, num_kv_heads, 64, 16, torch.float32)
    finally:
        torch.set_num_threads(before)
    assert_matches(out, naive_decode(query, kv, SCALE), torch.float32)


def test_decode_parts_cut_one_sequence_by_kv_heads_and_many_by_context():
    one = torch.tensor([500], dtype=torch.int32)
    assert cpu_attention.decode_parts(one, 8, 2) == [[0, 1, 0, 4], [0, 1, 4, 8]]
    assert cpu_attention.decode_parts(one, 3, 2) == [[0, 1, 0, 1], [0, 1, 1, 3]]
    assert cpu_attention.decode_parts(one, 8, 1) == [[0, 1, 0, 8]]
    many = torch.tensor([100, 1, 1, 1, 100, 1, 1, 1], dtype=torch.int32)
    assert cpu_attention.decode_parts(many, 8, 2) == [[0, 4, 0, 8], [4, 8, 0, 8]]


def test_a_batch_of_one():
    kv = cpu_paged_kv([3, 300, 17], 2, 64, 16, torch.float32)
    query = cpu_queries(3, 8, 64, torch.float32)
    one = cpu_attention.paged_attention_decode(
        query[1:2], kv.key_cache, kv.value_cache, kv.block_tables[1:2], kv.seq_lens[1:2], SCALE)
    assert_matches(one, naive_decode(query, kv, SCALE)[1:2], torch.float32)


def test_the_step_layout_follows_tables_and_lengths_rewritten_in_place():
    # Every layer of a step passes the same tables and lengths, and the kernel derives its
    # layout from them once; a caller that rewrites them in place between calls must be
    # served the new ones.
    kv = cpu_paged_kv([40, 7, 33], 2, 64, 16, torch.float32)
    query = cpu_queries(3, 8, 64, torch.float32)
    tables, lens = kv.block_tables.clone(), kv.seq_lens.clone()
    first = cpu_attention.paged_attention_decode(query, kv.key_cache, kv.value_cache, tables,
                                                 lens, SCALE)
    assert_matches(first, naive_decode(query, kv, SCALE), torch.float32)
    lens[0], lens[2] = 17, 1
    tables[[0, 1]] = tables[[1, 0]]
    lens[[0, 1]] = lens[[1, 0]].clone()
    again = cpu_attention.paged_attention_decode(query, kv.key_cache, kv.value_cache, tables,
                                                 lens, SCALE)
    expected = REFERENCE.paged_attention_decode(query, kv.key_cache, kv.value_cache, tables,
                                                lens, SCALE)
    assert_matches(again, expected.double(), torch.float32)
    assert not torch.allclose(again, first)


def test_split_balances_the_context_read():
    lens = torch.tensor([100, 1, 1, 1, 100, 1, 1, 1], dtype=torch.int32)
    assert cpu_parallel.balanced_bounds(lens, 2) == [0, 4, 8]
    assert cpu_parallel.balanced_bounds(lens, 1) == [0, 8]
    assert cpu_parallel.balanced_bounds(lens[:1], 4) == [0, 1]


# 0: every prefill takes the reference path (SDPA), its decode rows in C; the default: these
# short sequences run row by row in the decode kernel.
@pytest.mark.parametrize("row_wise_max_len", [0, cpu_attention.ROW_WISE_MAX_LEN])
@pytest.mark.parametrize("block_size", [8, 16])
def test_prefill_with_prefix_hits_and_decode_rows(block_size, row_wise_max_len, monkeypatch):
    monkeypatch.setattr(cpu_attention, "ROW_WISE_MAX_LEN", row_wise_max_len)
    check_prefill_with_prefix_hits(cpu_attention.paged_attention_prefill, block_size)


def test_a_row_wise_prefill_refuses_what_the_reference_refuses():
    kv = cpu_paged_kv([5, 9], 2, 64, 8, torch.float32)
    query = cpu_queries(14, 8, 64, torch.float32)
    args = (kv.key_cache, kv.value_cache, kv.block_tables)
    uneven = torch.tensor([0, 6, 14], dtype=torch.int32)  # 6 rows for a sequence of 5
    for prefill in (cpu_attention.paged_attention_prefill, REFERENCE.paged_attention_prefill):
        with pytest.raises(ValueError, match=r"every sequence needs 1 <= q_len <= seq_len .* "
                                             r"got q_lens \[6, 8\], seq_lens \[5, 9\]"):
            prefill(query, *args, uneven, kv.seq_lens, SCALE)


def test_bad_input_is_the_reference_error():
    check_bad_decode_input(cpu_attention.paged_attention_decode)


def test_the_build_is_cached_per_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    library = native_build.load_library.__wrapped__("paged_decode")
    built = list((tmp_path / "kernels").glob("paged_decode-*.so"))
    assert len(built) == 1 and hasattr(library, "paged_decode_f32")
    mtime = built[0].stat().st_mtime_ns
    native_build.load_library.__wrapped__("paged_decode")
    assert built[0].stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "kernels").iterdir()] == [built[0].name]


def test_a_compiler_failure_carries_its_output(tmp_path, monkeypatch):
    (tmp_path / "broken.c").write_text("int f(void) { return undeclared; }\n")
    monkeypatch.setattr(native_build, "SOURCE_DIR", tmp_path)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(native_build.NativeBuildError) as info:
        native_build.load_library.__wrapped__("broken")
    assert str(info.value).startswith("compiling broken.c with ")
    assert "undeclared" in str(info.value)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    monkeypatch.setattr(native_build.shutil, "which", lambda name: None)
    with pytest.raises(native_build.NativeBuildError, match="no C compiler found"):
        native_build.load_library.__wrapped__("broken")


def test_warm_up_builds_the_kernel():
    assert cpu_attention.warm_up(8, 2, 64, 16, torch.float32) >= 0


def _fused_inputs(seq_lens, num_heads, num_kv_heads, cache_dtype):
    head_dim, block_size = 64, 16
    kv = cpu_paged_kv(seq_lens, num_kv_heads, head_dim, block_size, cache_dtype)
    gen = torch.Generator().manual_seed(4)
    num_seqs = len(seq_lens)
    # A fused projection's rows, wider than the three parts (as a bias-free layer may pad).
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_seqs, width + 8, generator=gen)[:, :width]
    angles = torch.rand(num_seqs, head_dim // 2, generator=gen) * 6.0
    cos, sin = angles.cos(), angles.sin()
    # Each sequence's new token at its last position, as the runner maps it.
    last = kv.seq_lens.long() - 1
    slots = kv.block_tables.long().gather(1, (last // block_size)[:, None])[:, 0] * block_size
    return qkv, cos, sin, kv, slots + last % block_size


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("seq_lens,num_heads,num_kv_heads", [
    ([40], 8, 2), ([3, 300, 17, 1], 8, 8), ([33, 5], 6, 3)])
def test_the_fused_decode_step_is_rotary_then_cache_write_then_attention(
        cache_dtype, threads, seq_lens, num_heads, num_kv_heads):
    from pagedserve.kernels import cpu_cache_ops, cpu_layer_ops

    qkv, cos, sin, kv, slots = _fused_inputs(seq_lens, num_heads, num_kv_heads, cache_dtype)
    composed_qkv, composed_k, composed_v = qkv.clone(), kv.key_cache.clone(), kv.value_cache.clone()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = cpu_attention.rotary_cache_decode(qkv, num_heads, num_kv_heads, cos, sin,
                                                kv.key_cache, kv.value_cache, slots,
                                                kv.block_tables, kv.seq_lens, SCALE)
        cpu_layer_ops.rotary_(composed_qkv, num_heads + num_kv_heads, cos, sin)
        q, k, v = composed_qkv.split([num_heads * 64, num_kv_heads * 64, num_kv_heads * 64],
                                     dim=-1)
        cpu_cache_ops.reshape_and_cache(k.view(-1, num_kv_heads, 64),
                                        v.view(-1, num_kv_heads, 64), composed_k, composed_v,
                                        slots)
        expected = cpu_attention.paged_attention_decode(
            q.view(-1, num_heads, 64), composed_k, composed_v, kv.block_tables, kv.seq_lens,
            SCALE)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(qkv, composed_qkv)  # q and k rotated in place, v as it was
    # Unwritten slots hold NaN (cpu_paged_kv): equal, NaN for NaN.
    torch.testing.assert_close(kv.key_cache, composed_k, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(kv.value_cache, composed_v, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(out, expected)


def test_the_fused_decode_step_skips_padding_and_refuses_a_slot_past_the_cache():
    qkv, cos, sin, kv, slots = _fused_inputs([20, 9, 40], 8, 2, torch.float32)
    rows = kv.key_cache.view(-1, 2, 64)  # one row per slot
    rows[slots] = float("nan")
    padded = slots.clone()
    padded[1] = -1
    cpu_attention.rotary_cache_decode(qkv.clone(), 8, 2, cos, sin, kv.key_cache,
                                      kv.value_cache, padded, kv.block_tables, kv.seq_lens,
                                      SCALE)
    assert not rows[slots[0]].isnan().any() and not rows[slots[2]].isnan().any()
    assert rows[slots[1]].isnan().all()  # the padded row's slot is left alone
    num_slots = kv.key_cache.shape[0] * 16
    padded[2] = num_slots
    before = kv.key_cache.clone()
    with pytest.raises(IndexError, match=rf"slot_mapping\[2\] = {num_slots} is out of range "
                                         rf"for a cache of {num_slots} slots"):
        cpu_attention.rotary_cache_decode(qkv.clone(), 8, 2, cos, sin, kv.key_cache,
                                          kv.value_cache, padded, kv.block_tables, kv.seq_lens,
                                          SCALE)
    torch.testing.assert_close(kv.key_cache, before, rtol=0, atol=0, equal_nan=True)
