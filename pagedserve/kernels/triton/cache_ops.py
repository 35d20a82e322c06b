"""Writes into the paged KV cache: new tokens' K/V into their slots, and block copies for
copy-on-write."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .checks import check_block_mapping, check_kv_cache_pair, require_same_device
from .runtime import next_power_of_2, require_launchable

# Elements copied per program of copy_blocks: a 16-token block of 8 heads x 128 dims is 16384.
MAX_COPY_TILE = 4096


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
    num_kv_heads,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kco, stride_kch, stride_kcd,
    stride_vcb, stride_vco, stride_vch, stride_vcd,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_PAD: tl.constexpr, HEAD_DIM_PAD: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    heads = tl.arange(0, HEADS_PAD)
    dims = tl.arange(0, HEAD_DIM_PAD)
    # Negative slots mark padding tokens: every lane is masked off, nothing is written.
    mask = (slot >= 0) & (heads[:, None] < num_kv_heads) & (dims[None, :] < HEAD_DIM)
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE

    key = tl.load(
        key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :] * stride_kd,
        mask=mask,
    )
    tl.store(
        key_cache_ptr + block * stride_kcb + offset * stride_kco
        + heads[:, None] * stride_kch + dims[None, :] * stride_kcd,
        key,
        mask=mask,
    )
    value = tl.load(
        value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :] * stride_vd,
        mask=mask,
    )
    tl.store(
        value_cache_ptr + block * stride_vcb + offset * stride_vco
        + heads[:, None] * stride_vch + dims[None, :] * stride_vcd,
        value,
        mask=mask,
    )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write token t's key/value [Hkv, D] into cache slot ``slot_mapping[t]`` (block id times
    block size plus offset); tokens with a negative slot are skipped.

    key/value [T, Hkv, D] in another dtype are first converted by torch (round to nearest;
    the interpreter would truncate to bf16); in the cache's dtype they are copied bit for bit.
    """
    _check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    key, value = key.to(key_cache.dtype), value.to(key_cache.dtype)
    require_launchable(_reshape_and_cache_kernel, key, value, key_cache, value_cache,
                       slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        num_kv_heads,
        *key.stride(), *value.stride(), *key_cache.stride(), *value_cache.stride(),
        BLOCK_SIZE=key_cache.shape[1], HEAD_DIM=head_dim,
        HEADS_PAD=next_power_of_2(num_kv_heads), HEAD_DIM_PAD=next_power_of_2(head_dim),
    )


def _check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    check_kv_cache_pair(key_cache, value_cache)
    if key.dim() != 3:
        raise ValueError(f"key must have shape [T, Hkv, D], got {tuple(key.shape)}")
    expected = (key.shape[0], key_cache.shape[2], key_cache.shape[3])
    for name, tensor in (("key", key), ("value", value)):
        if tuple(tensor.shape) != expected:
            raise ValueError(
                f"{name} must have shape {list(expected)} (T from key, Hkv and D from the "
                f"cache), got {tuple(tensor.shape)}"
            )
        if not tensor.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    if slot_mapping.dtype != torch.int64 or tuple(slot_mapping.shape) != (key.shape[0],):
        raise ValueError(
            f"slot_mapping must be int64 of shape [{key.shape[0]}], got {slot_mapping.dtype} "
            f"of shape {tuple(slot_mapping.shape)}"
        )
    require_same_device(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                        slot_mapping=slot_mapping)


@triton.jit
def _copy_blocks_kernel(
    key_cache_ptr, value_cache_ptr, block_mapping_ptr,
    block_numel, stride_key_block, stride_value_block, stride_map,
    COPY_TILE: tl.constexpr,
):
    pair = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    src = tl.load(block_mapping_ptr + pair * stride_map).to(tl.int64)
    dst = tl.load(block_mapping_ptr + pair * stride_map + 1).to(tl.int64)
    offsets = chunk * COPY_TILE + tl.arange(0, COPY_TILE)
    mask = offsets < block_numel
    key = tl.load(key_cache_ptr + src * stride_key_block + offsets, mask=mask)
    tl.store(key_cache_ptr + dst * stride_key_block + offsets, key, mask=mask)
    value = tl.load(value_cache_ptr + src * stride_value_block + offsets, mask=mask)
    tl.store(value_cache_ptr + dst * stride_value_block + offsets, value, mask=mask)


def copy_blocks(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copy block ``src`` to block ``dst`` for every (src, dst) row of ``block_mapping``
    (int64 [K, 2]) in every layer's key and value cache (copy-on-write).

    Pairs run in parallel, so no destination may also be a source or appear twice; the block
    manager's fresh CoW destinations satisfy this.
    """
    if len(key_caches) != len(value_caches):
        raise ValueError(
            f"got {len(key_caches)} key caches but {len(value_caches)} value caches"
        )
    if not key_caches:
        return
    check_block_mapping(block_mapping, key_caches[0].shape[0], key_caches[0].shape[0])
    if block_mapping.shape[0] == 0:
        return
    mapping = block_mapping.to(key_caches[0].device).contiguous()
    # One launch per layer: layers may differ in shape, and L launches per CoW step are cheap.
    for layer, (key_cache, value_cache) in enumerate(zip(key_caches, value_caches)):
        _check_layer(layer, key_cache, value_cache, key_caches[0])
        require_launchable(_copy_blocks_kernel, key_cache, value_cache)
        block_numel = key_cache[0].numel()
        copy_tile = min(MAX_COPY_TILE, next_power_of_2(block_numel))
        grid = (mapping.shape[0], triton.cdiv(block_numel, copy_tile))
        _copy_blocks_kernel[grid](
            key_cache, value_cache, mapping,
            block_numel, key_cache.stride(0), value_cache.stride(0), mapping.stride(0),
            COPY_TILE=copy_tile,
        )


def _check_layer(layer: int, key_cache: torch.Tensor, value_cache: torch.Tensor,
                 first: torch.Tensor) -> None:
    check_kv_cache_pair(key_cache, value_cache)
    if key_cache.shape[0] != first.shape[0] or key_cache.device != first.device:
        raise ValueError(
            f"layer {layer} cache has {key_cache.shape[0]} blocks on {key_cache.device}, "
            f"layer 0 has {first.shape[0]} on {first.device}"
        )
    for name, cache in (("key", key_cache), ("value", value_cache)):
        # The kernel copies a block as one flat run of elements.
        if not cache[0].is_contiguous():
            raise ValueError(
                f"layer {layer} {name} cache blocks must be contiguous, got strides "
                f"{tuple(cache.stride())}"
            )
