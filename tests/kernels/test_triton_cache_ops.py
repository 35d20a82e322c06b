"""Triton reshape_and_cache and copy_blocks, and swap_blocks: exact bits against the torch
reference, padding slots skipped, untouched blocks left alone."""

from __future__ import annotations

import pytest
import torch
from triton_cases import DEVICE, NEEDS_CUDA

from pagedserve.kernels.dispatch import get_kernel_ops
from pagedserve.kernels.triton import copy_blocks, reshape_and_cache, swap_blocks

TORCH_OPS = get_kernel_ops(DEVICE, backend="torch")


def _randn(*shape, dtype=torch.float32, seed=0, device=DEVICE):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen).to(device, dtype)


@pytest.mark.parametrize(
    "dtype,block_size,num_kv_heads,head_dim",
    [(torch.float32, 8, 2, 64), (torch.bfloat16, 16, 3, 80), (torch.float16, 32, 1, 64)],
)
def test_reshape_and_cache_writes_exactly_the_mapped_slots(dtype, block_size, num_kv_heads,
                                                           head_dim):
    num_blocks = 5
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key_cache = _randn(*shape, dtype=dtype, seed=1)
    value_cache = _randn(*shape, dtype=dtype, seed=2)
    key = _randn(6, num_kv_heads, head_dim, dtype=dtype, seed=3)
    value = _randn(6, num_kv_heads, head_dim, dtype=dtype, seed=4)
    # Shuffled blocks, a slot at each end of a block, and two padding tokens.
    b = block_size
    slots = torch.tensor([3 * b, -1, b - 1, 4 * b + 2, -1, 2 * b + 1], device=DEVICE)
    expected_key, expected_value = key_cache.clone(), value_cache.clone()
    TORCH_OPS.reshape_and_cache(key, value, expected_key, expected_value, slots)

    reshape_and_cache(key, value, key_cache, value_cache, slots)

    assert torch.equal(key_cache, expected_key)
    assert torch.equal(value_cache, expected_value)
    assert torch.equal(key_cache[3, 0], key[0])
    assert torch.equal(value_cache[0, b - 1], value[2])


def test_reshape_and_cache_rounds_other_dtypes_to_nearest():
    key_cache = torch.zeros(2, 8, 1, 64, dtype=torch.bfloat16, device=DEVICE)
    value_cache = torch.zeros_like(key_cache)
    key = _randn(2, 1, 64, seed=5)
    slots = torch.tensor([9, 0], device=DEVICE)
    reshape_and_cache(key, key * 2, key_cache, value_cache, slots)
    assert torch.equal(key_cache[1, 1], key[0].bfloat16())
    assert torch.equal(value_cache[0, 0], (key[1] * 2).bfloat16())


@pytest.mark.parametrize(
    "overrides,error,message",
    [
        ({"slot_mapping": torch.zeros(2, dtype=torch.int32)}, ValueError,
         r"slot_mapping must be int64 of shape \[2\], got torch.int32"),
        ({"key": torch.zeros(2, 2, 32)}, ValueError,
         r"key must have shape \[2, 2, 64\] .* got \(2, 2, 32\)"),
        ({"value": torch.zeros(2, 2, 64, dtype=torch.int32)}, TypeError,
         "value must be a floating-point tensor, got torch.int32"),
    ],
)
def test_reshape_and_cache_rejects_bad_arguments(overrides, error, message):
    args = dict(
        key=torch.zeros(2, 2, 64), value=torch.zeros(2, 2, 64),
        key_cache=torch.zeros(3, 8, 2, 64), value_cache=torch.zeros(3, 8, 2, 64),
        slot_mapping=torch.zeros(2, dtype=torch.int64),
    )
    args.update(overrides)
    with pytest.raises(error, match=message):
        reshape_and_cache(**args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_blocks_copies_every_layer_and_nothing_else(dtype):
    layers = 2
    key_caches = [_randn(6, 8, 2, 64, dtype=dtype, seed=10 + i) for i in range(layers)]
    value_caches = [_randn(6, 8, 2, 64, dtype=dtype, seed=20 + i) for i in range(layers)]
    mapping = torch.tensor([[1, 4], [0, 5], [3, 2]])
    expected_keys = [c.clone() for c in key_caches]
    expected_values = [c.clone() for c in value_caches]
    TORCH_OPS.copy_blocks(expected_keys, expected_values, mapping)

    copy_blocks(key_caches, value_caches, mapping)

    for got, want in zip(key_caches + value_caches, expected_keys + expected_values):
        assert torch.equal(got, want)
    assert torch.equal(key_caches[1][5], key_caches[1][0])


def test_copy_blocks_checks_ids_and_layouts():
    caches = [torch.zeros(4, 8, 2, 64, device=DEVICE)]
    with pytest.raises(ValueError, match="destination block id 4 is outside the pool of 4 blocks"):
        copy_blocks(caches, [c.clone() for c in caches], torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match="got 1 key caches but 2 value caches"):
        copy_blocks(caches, caches * 2, torch.tensor([[0, 1]]))
    strided = torch.zeros(4, 8, 2, 128, device=DEVICE)[..., :64]
    with pytest.raises(ValueError, match="layer 0 key cache blocks must be contiguous"):
        copy_blocks([strided], [strided.clone()], torch.tensor([[0, 1]]))


def test_swap_blocks_between_cpu_pools():
    src, dst = _randn(5, 8, 2, 64, device="cpu"), _randn(3, 8, 2, 64, seed=9, device="cpu")
    expected = dst.clone()
    expected[2], expected[0] = src[4], src[1]
    swap_blocks(src, dst, torch.tensor([[4, 2], [1, 0]]))
    assert torch.equal(dst, expected)


def test_swap_blocks_rejects_mismatched_pools():
    src = torch.zeros(4, 8, 2, 64)
    with pytest.raises(ValueError, match=r"pools must share the block shape, got src "
                                         r"\(4, 8, 2, 64\) and dst \(4, 8, 2, 32\)"):
        swap_blocks(src, torch.zeros(4, 8, 2, 32), torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match="source block id 7 is outside the pool of 4 blocks"):
        swap_blocks(src, torch.zeros(2, 8, 2, 64), torch.tensor([[7, 1]]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NEEDS_CUDA)
def test_swap_out_and_back_in_through_pinned_memory():
    device_pool = _randn(16, 16, 8, 128, dtype=torch.bfloat16, seed=30, device="cuda")
    cpu_pool = torch.zeros(8, 16, 8, 128, dtype=torch.bfloat16)
    swap_blocks(device_pool, cpu_pool, torch.tensor([[3, 0], [15, 7], [8, 2]]))
    assert torch.equal(cpu_pool[7], device_pool[15].cpu())
    assert torch.equal(cpu_pool[2], device_pool[8].cpu())

    restored = torch.zeros_like(device_pool)
    swap_blocks(cpu_pool, restored, torch.tensor([[0, 5], [7, 1]]))
    assert torch.equal(restored[5], device_pool[3])
    assert torch.equal(restored[1], device_pool[15])
    assert not restored[0].any()
