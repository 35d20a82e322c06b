"""The CPU KV cache made resident at start-up (prefault): its memory is resident once the
prefault is done (a thread where Linux populates pages), its contents are never changed by
it, and the setting comes from the argument, else $PAGEDSERVE_KV_CACHE_PREFAULT."""

from __future__ import annotations

import os

import pytest
import torch

from pagedserve.kernels.dispatch import TORCH_OPS
from pagedserve.server.engine.config import engine_args
from pagedserve.server.engine.config.engine_args import PREFAULT_ENV, EngineArgs
from pagedserve.server.engine.worker.kv_cache import KVCache
from pagedserve.server.models.model_config import ModelConfig

MiB = 1 << 20
CONFIG = ModelConfig.from_dict({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 512,
    "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 8,
    "num_key_value_heads": 8, "max_position_embeddings": 64,
})
# A pool is 1,280 blocks x 16 tokens x 8 KV heads x 64 dims x 4 bytes = 40 MiB: above glibc's
# largest mmap threshold, so each is fresh memory, not a reused (already resident) chunk.
NUM_BLOCKS = 1280
POOL_BYTES = 40 * MiB


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def build(prefault: bool) -> tuple[KVCache, int]:
    before = resident_bytes()
    cache = KVCache(CONFIG, 16, NUM_BLOCKS, 0, torch.float32, "cpu", TORCH_OPS,
                    prefault=prefault)
    cache.wait_prefault()
    return cache, resident_bytes() - before


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_a_prefaulted_pool_is_resident_and_a_lazy_one_is_not() -> None:
    lazy, lazy_growth = build(prefault=False)
    eager, eager_growth = build(prefault=True)
    assert NUM_BLOCKS * CONFIG.bytes_per_block(16, torch.float32) == 2 * POOL_BYTES  # K, V
    assert lazy_growth < 4 * MiB
    assert eager_growth >= 2 * POOL_BYTES - 4 * MiB
    assert lazy.prefault_seconds is None
    assert eager.prefault_seconds is not None and eager.prefault_seconds > 0


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="reads Linux's /proc")
def test_the_prefault_keeps_what_is_written_meanwhile() -> None:
    cache = KVCache(CONFIG, 16, NUM_BLOCKS, 0, torch.float32, "cpu", TORCH_OPS, prefault=True)
    # The engine may write its first blocks while the pages are still being made resident.
    cache.value_caches[0][-1].fill_(3.0)
    cache.wait_prefault()
    assert bool((cache.value_caches[0][-1] == 3.0).all())
    assert not cache.prefaulting


def test_the_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREFAULT_ENV, "0")
    assert engine_args.resolve_kv_cache_prefault(True) is True
    assert EngineArgs(kv_cache_prefault=True).cache_config().prefault is True
    assert EngineArgs().cache_config().prefault is False
    monkeypatch.setenv(PREFAULT_ENV, "1")
    assert engine_args.resolve_kv_cache_prefault(False) is False
    assert EngineArgs().cache_config().prefault is True


def test_unset_means_on_and_other_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PREFAULT_ENV, raising=False)
    assert engine_args.resolve_kv_cache_prefault(None) is True
    monkeypatch.setenv(PREFAULT_ENV, "yes")
    with pytest.raises(ValueError, match=r"^PAGEDSERVE_KV_CACHE_PREFAULT must be 0 or 1, "
                                         r"got 'yes'$"):
        EngineArgs().cache_config()
