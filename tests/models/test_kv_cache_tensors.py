"""KV cache tensors: sizing, the max_model_len refusal, swap and copy through the kernel ops."""

from __future__ import annotations

import pytest
import torch

from pagedserve.kernels.dispatch import TORCH_OPS
from pagedserve.server.engine.config.engine_config import CacheConfig, GiB
from pagedserve.server.engine.worker.kv_cache import KVCache, check_max_model_len
from pagedserve.server.models.model_config import ModelConfig

CONFIG = ModelConfig.from_dict({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 256,
})
# K and V x 2 layers x 2 KV heads x 16 dims x 16 tokens x 4 bytes.
BYTES_PER_BLOCK = 2 * 2 * 2 * 16 * 16 * 4


def _create(max_model_len: int = 64, **cache) -> KVCache:
    config = CacheConfig(block_size=16, **cache)
    return KVCache.create(CONFIG, config, max_model_len, torch.float32, "cpu", TORCH_OPS)


def test_sized_from_block_count_and_swap_space():
    cache = _create(num_kv_blocks=10, swap_space=3 * BYTES_PER_BLOCK / GiB)
    assert cache.bytes_per_block == BYTES_PER_BLOCK
    assert (cache.num_device_blocks, cache.num_cpu_blocks) == (10, 3)
    assert len(cache.key_caches) == len(cache.value_caches) == 2
    for pool in cache.key_caches + cache.value_caches:
        assert pool.shape == (10, 16, 2, 16) and pool.dtype == torch.float32
    for pool in cache.cpu_key_caches + cache.cpu_value_caches:
        assert pool.shape == (3, 16, 2, 16) and pool.device.type == "cpu"
    assert [(k, v) for k, v in cache.device_caches] == list(
        zip(cache.key_caches, cache.value_caches, strict=True)
    )


def test_sized_from_memory():
    cache = _create(kv_cache_memory=5 * BYTES_PER_BLOCK + 100, swap_space=0)
    assert (cache.num_device_blocks, cache.num_cpu_blocks) == (5, 0)


def test_max_model_len_that_cannot_fit_is_refused():
    _create(max_model_len=64, num_kv_blocks=4, swap_space=0)
    with pytest.raises(ValueError) as info:
        _create(max_model_len=65, num_kv_blocks=4, swap_space=0)
    assert str(info.value) == (
        "max_model_len 65 needs 5 KV blocks of 16 tokens, but the KV cache holds 4 blocks "
        "(64 tokens); raise num_kv_blocks or kv_cache_memory, or lower max_model_len"
    )
    with pytest.raises(ValueError, match="max_model_len 2048 needs 128 KV blocks"):
        check_max_model_len(2048, 127, 16)


def _fill(cache: KVCache) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    pools = cache.key_caches + cache.value_caches
    for pool in pools:
        pool.copy_(torch.randn(pool.shape, generator=gen))
    return [pool.clone() for pool in pools]


def test_swap_out_then_in_restores_blocks_in_every_layer():
    cache = _create(num_kv_blocks=10, swap_space=3 * BYTES_PER_BLOCK / GiB)
    original = _fill(cache)

    cache.swap_out([(2, 0), (5, 2)])
    for pool in cache.key_caches + cache.value_caches:
        pool[2].zero_()
        pool[5].zero_()
    cache.swap_in([(0, 7), (2, 5)])

    for pool, before in zip(cache.key_caches + cache.value_caches, original, strict=True):
        assert torch.equal(pool[7], before[2])
        assert torch.equal(pool[5], before[5])
        assert torch.equal(pool[2], torch.zeros_like(pool[2]))


def test_copy_on_write_copies_every_layer():
    cache = _create(num_kv_blocks=10, swap_space=0)
    original = _fill(cache)
    cache.copy([(1, 3), (1, 4)])
    for pool, before in zip(cache.key_caches + cache.value_caches, original, strict=True):
        assert torch.equal(pool[3], before[1]) and torch.equal(pool[4], before[1])
        assert torch.equal(pool[0], before[0])


def test_out_of_range_mapping_is_refused():
    cache = _create(num_kv_blocks=10, swap_space=3 * BYTES_PER_BLOCK / GiB)
    with pytest.raises(ValueError) as info:
        cache.swap_in([(3, 0)])
    assert str(info.value) == (
        "swap_in pair (3, 0) is out of range: source pool has 3 blocks, destination pool 10"
    )
    with pytest.raises(ValueError, match=r"copy pair \(0, 10\) is out of range"):
        cache.copy([(0, 10)])
