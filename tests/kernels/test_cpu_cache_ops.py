"""The C KV-cache write (the default CPU backend's ``reshape_and_cache``) against the torch
reference: exact bits for every dtype pair it takes, block sizes 8/16/32, GQA head counts, the
strided K/V views of a fused QKV output, padding slots, both sides of the threading threshold,
and the fallbacks and errors."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels import cache_ops, cpu_cache_ops, native_build

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")

HEAD_DIM = 64


def _randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _qkv_views(tokens: int, heads: int, kv_heads: int, dtype: torch.dtype, seed: int):
    """K and V as the model hands them over: views of one [T, (H + 2 Hkv) D] QKV output."""
    qkv = _randn(tokens, (heads + 2 * kv_heads) * HEAD_DIM, dtype=dtype, seed=seed)
    _, k, v = qkv.split([heads * HEAD_DIM, kv_heads * HEAD_DIM, kv_heads * HEAD_DIM], dim=-1)
    return k.view(tokens, kv_heads, HEAD_DIM), v.view(tokens, kv_heads, HEAD_DIM)


def _slots(tokens: int, num_blocks: int, block_size: int, seed: int) -> torch.Tensor:
    """Distinct slots scattered over shuffled blocks, every third token padding."""
    order = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(seed))
    slots = order[:tokens].clone()
    slots[::3] = -1
    return slots


def _both(key, value, cache_dtype, num_blocks, block_size, slots):
    """(C caches, reference caches) after the same write into the same random contents."""
    shape = (num_blocks, block_size, key.shape[1], HEAD_DIM)
    key_cache = _randn(*shape, dtype=cache_dtype, seed=7)
    value_cache = _randn(*shape, dtype=cache_dtype, seed=8)
    expected = key_cache.clone(), value_cache.clone()
    cache_ops.reshape_and_cache(key, value, *expected, slots)
    cpu_cache_ops.reshape_and_cache(key, value, key_cache, value_cache, slots)
    return (key_cache, value_cache), expected


@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 2), (4, 1)])
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32),
                                    (torch.bfloat16, torch.bfloat16),
                                    (torch.float32, torch.bfloat16),
                                    (torch.float32, torch.float16)],
                         ids=["f32", "bf16", "f32-over-bf16", "f32-over-f16"])
@pytest.mark.parametrize("tokens", [5, 600])
def test_write_matches_the_reference_bit_for_bit(block_size, heads, kv_heads, dtypes, tokens):
    dtype, cache_dtype = dtypes
    key, value = _qkv_views(tokens, heads, kv_heads, dtype, seed=tokens)
    num_blocks = tokens // block_size + 4
    slots = _slots(tokens, num_blocks, block_size, seed=block_size)
    (key_cache, value_cache), (expected_key, expected_value) = _both(
        key, value, cache_dtype, num_blocks, block_size, slots)
    assert torch.equal(key_cache, expected_key)
    assert torch.equal(value_cache, expected_value)
    # And the layout itself: token t's rows sit at block slot // B, offset slot % B.
    t = int(torch.nonzero(slots >= 0)[0])
    slot = int(slots[t])
    assert torch.equal(key_cache[slot // block_size, slot % block_size], key[t].to(cache_dtype))
    assert torch.equal(value_cache[slot // block_size, slot % block_size],
                       value[t].to(cache_dtype))


def test_float32_into_bfloat16_rounds_to_nearest_even_and_keeps_nan_and_inf():
    values = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8), float("inf"),
                           float("-inf"), float("nan"), 3.0e38, 1e-40])
    key = values.repeat(HEAD_DIM // len(values)).view(1, 1, HEAD_DIM)
    (key_cache, _), (expected, _) = _both(key, key.clone(), torch.bfloat16, 1, 8,
                                          torch.tensor([3]))
    # Every value exactly as torch converts it (a NaN stays a NaN, whatever its payload).
    torch.testing.assert_close(key_cache, expected, rtol=0, atol=0, equal_nan=True)
    assert key_cache[0, 3, 0, 0].item() == 1.0  # halfway: rounded to the even neighbour
    assert key_cache[0, 3, 0, 1].item() == 1.015625


def test_float32_into_float16_rounds_as_torch_does_across_the_range():
    # Halfway cases, subnormal halves, overflow to infinity, NaN and infinities, and the
    # largest finite half and its neighbours.
    values = torch.tensor([1.0 + 2**-11, 1.0 + 3 * 2**-11, -(1.0 + 2**-11), 65504.0, 65519.0,
                           65520.0, -1e6, float("inf"), float("-inf"), float("nan"), 2**-24,
                           1.5 * 2**-24, 2**-25, 2**-26, 3e-5, -6.1e-5, 0.0, -0.0,
                           *torch.randn(46, generator=torch.Generator().manual_seed(3)).tolist()])
    key = values.view(1, 1, HEAD_DIM)
    (key_cache, _), (expected, _) = _both(key, key.clone(), torch.float16, 1, 8,
                                          torch.tensor([5]))
    assert torch.equal(key_cache.view(torch.int16)[~expected.isnan()],
                       expected.view(torch.int16)[~expected.isnan()])
    assert key_cache.isnan().equal(expected.isnan())
    assert key_cache[0, 5, 0, 0].item() == 1.0  # halfway: rounded to the even neighbour
    assert key_cache[0, 5, 0, 5].item() == float("inf")


def test_a_slot_past_the_cache_is_refused_before_anything_is_written():
    key, value = _qkv_views(3, 2, 2, torch.float32, seed=1)
    key_cache, value_cache = torch.zeros(2, 8, 2, HEAD_DIM), torch.zeros(2, 8, 2, HEAD_DIM)
    with pytest.raises(IndexError, match=r"slot_mapping\[2\] = 16 is out of range for a cache "
                                         r"of 16 slots"):
        cpu_cache_ops.reshape_and_cache(key, value, key_cache, value_cache,
                                        torch.tensor([0, 5, 16]))
    assert not key_cache.any() and not value_cache.any()


@pytest.mark.parametrize("overrides,message", [
    ({"key": torch.zeros(2, 2, 32)}, r"key \[2, 2, 32\] and value \[2, 2, 64\] must be"),
    ({"slot_mapping": torch.zeros(3, dtype=torch.int64)},
     r"slot_mapping must be \[2\] \(one slot per token\), got \[3\]"),
    ({"value_cache": torch.zeros(3, 8, 2, 32)}, "key_cache and value_cache must both be"),
])
def test_bad_shapes_get_the_reference_errors(overrides, message):
    args = dict(key=torch.zeros(2, 2, HEAD_DIM), value=torch.zeros(2, 2, HEAD_DIM),
                key_cache=torch.zeros(3, 8, 2, HEAD_DIM),
                value_cache=torch.zeros(3, 8, 2, HEAD_DIM),
                slot_mapping=torch.zeros(2, dtype=torch.int64))
    args.update(overrides)
    with pytest.raises(ValueError, match=message):
        cpu_cache_ops.reshape_and_cache(**args)


@pytest.mark.parametrize("case", ["float16", "strided heads"])
def test_inputs_the_kernel_does_not_take_go_to_the_reference(case, monkeypatch):
    key, value = _qkv_views(4, 2, 2, torch.float32, seed=2)
    cache_dtype, slots = torch.float32, torch.tensor([1, 9, -1, 4])
    if case == "float16":
        key, value, cache_dtype = key.half(), value.half(), torch.float16
    else:  # heads one apart by two rows: not one run per token
        key = _randn(4, 2, 2 * HEAD_DIM)[..., :HEAD_DIM]
    calls = []
    reference = cache_ops.reshape_and_cache
    monkeypatch.setattr(cache_ops, "reshape_and_cache",
                        lambda *args: calls.append(1) or reference(*args))
    key_cache = torch.zeros(2, 8, 2, HEAD_DIM, dtype=cache_dtype)
    value_cache = torch.zeros_like(key_cache)
    cpu_cache_ops.reshape_and_cache(key, value, key_cache, value_cache, slots)
    assert calls == [1]
    assert torch.equal(key_cache[1, 1], key[1].to(cache_dtype))
