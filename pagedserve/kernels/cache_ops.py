"""KV-cache ops, torch reference: write new K/V into paged blocks, copy and swap whole blocks.

Cache layout everywhere: ``[num_blocks, block_size, num_kv_heads, head_dim]`` per layer, so a
slot id (``block_id * block_size + offset``) indexes the cache viewed as
``[num_blocks * block_size, num_kv_heads, head_dim]``.
"""

from __future__ import annotations

import torch


def _flat_slots(cache: torch.Tensor) -> torch.Tensor:
    # A view, not a copy: writes through it land in the cache.
    return cache.view(-1, cache.shape[-2], cache.shape[-1])


def _check_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4 or key_cache.shape != value_cache.shape:
        raise ValueError(
            "key_cache and value_cache must both be [num_blocks, block_size, num_kv_heads, "
            f"head_dim], got {list(key_cache.shape)} and {list(value_cache.shape)}"
        )


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Writes token ``t``'s key/value [T, Hkv, D] into slot ``slot_mapping[t]``; slots < 0 are
    padding and skipped."""
    check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    padded = slot_mapping < 0
    if bool(padded.any()):
        # Masking costs three boolean gathers per layer: only when there is padding.
        keep = ~padded
        slot_mapping, key, value = slot_mapping[keep], key[keep], value[keep]
    _flat_slots(key_cache).index_copy_(0, slot_mapping, key.to(key_cache.dtype))
    _flat_slots(value_cache).index_copy_(0, slot_mapping, value.to(value_cache.dtype))


def check_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """The shape checks of ``reshape_and_cache``, shared by the backends that write in place."""
    _check_cache_pair(key_cache, value_cache)
    if key.shape != value.shape or key.shape[1:] != key_cache.shape[2:]:
        raise ValueError(
            f"key {list(key.shape)} and value {list(value.shape)} must be [T, "
            f"{key_cache.shape[2]}, {key_cache.shape[3]}] to match the cache"
        )
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping must be [{key.shape[0]}] (one slot per token), "
            f"got {list(slot_mapping.shape)}"
        )


def _check_mapping(block_mapping: torch.Tensor) -> None:
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2:
        raise ValueError(
            f"block_mapping must be [K, 2] (src, dst), got {list(block_mapping.shape)}"
        )


def copy_blocks(
    key_caches: list[torch.Tensor],
    value_caches: list[torch.Tensor],
    block_mapping: torch.Tensor,
) -> None:
    """Copies block ``src`` onto block ``dst`` in every layer (copy-on-write)."""
    _check_mapping(block_mapping)
    if len(key_caches) != len(value_caches):
        raise ValueError(
            f"got {len(key_caches)} key caches but {len(value_caches)} value caches"
        )
    if block_mapping.shape[0] == 0 or not key_caches:
        return
    mapping = block_mapping.to(key_caches[0].device, torch.int64)
    src, dst = mapping[:, 0], mapping[:, 1]
    for cache in (*key_caches, *value_caches):
        # index_select materialises the sources first, so a block that is both a source and
        # a destination in one call is read before it is overwritten.
        cache.index_copy_(0, dst, cache.index_select(0, src))


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Copies block ``src_id`` of pool ``src`` into block ``dst_id`` of pool ``dst`` (the pools
    may live on different devices: device ↔ CPU swap space)."""
    _check_mapping(block_mapping)
    if src.shape[1:] != dst.shape[1:]:
        raise ValueError(
            f"pools must share the block layout, got {list(src.shape)} and {list(dst.shape)}"
        )
    if block_mapping.shape[0] == 0:
        return
    src_ids = block_mapping[:, 0].to(src.device, torch.int64)
    dst_ids = block_mapping[:, 1].to(dst.device, torch.int64)
    # A blocking copy: a non-blocking device→host copy could be read before it lands.
    blocks = src.index_select(0, src_ids).to(dst.device)
    dst.index_copy_(0, dst_ids, blocks)
