from __future__ import annotations

import pytest

from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.config.engine_config import (
    DEFAULT_KV_CACHE_MEMORY,
    CacheConfig,
    GiB,
    SchedulerConfig,
)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"block_size": 12}, "block_size must be a power of two in [1, 256], got 12"),
    ({"block_size": 512}, "block_size must be a power of two in [1, 256], got 512"),
    ({"block_size": 0}, "block_size must be a power of two in [1, 256], got 0"),
    ({"num_kv_blocks": 0}, "num_kv_blocks must be at least 1, got 0"),
    ({"kv_cache_memory": -5}, "kv_cache_memory must be at least 1 byte, got -5"),
    ({"num_kv_blocks": 8, "kv_cache_memory": 1024},
     "kv_cache_memory must be unset when num_kv_blocks is set (num_kv_blocks=8), got 1024"),
    ({"swap_space": -1.0}, "swap_space must be non-negative (GiB), got -1.0"),
    ({"kv_allocation": "slab"}, "kv_allocation must be one of paged, contiguous, got 'slab'"),
    ({"watermark": 1.0}, "watermark must be in [0, 1), got 1.0"),
    ({"enable_prefix_caching": True, "kv_allocation": "contiguous"},
     "enable_prefix_caching must be False with kv_allocation='contiguous', got True"),
])
def test_cache_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        CacheConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_num_seqs": 0}, "max_num_seqs must be at least 1, got 0"),
    ({"max_num_batched_tokens": 0}, "max_num_batched_tokens must be at least 1, got 0"),
    ({"max_model_len": -1}, "max_model_len must be at least 1, got -1"),
    ({"preemption_mode": "drop"},
     "preemption_mode must be one of auto, recompute, swap, got 'drop'"),
    ({"max_waiting_requests": 0}, "max_waiting_requests must be None or at least 1, got 0"),
    ({"max_shared_prefill_tokens": 0},
     "max_shared_prefill_tokens must be None or at least 1, got 0"),
    ({"tenant_linger_seconds": -0.5}, "tenant_linger_seconds must be at least 0, got -0.5"),
])
def test_scheduler_config_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        SchedulerConfig(**kwargs)
    assert str(info.value) == message


def test_batched_tokens_may_be_below_max_model_len() -> None:
    # Chunked prefill computes longer prompts over several steps.
    config = SchedulerConfig(max_num_batched_tokens=16, max_model_len=4096)
    assert (config.max_num_batched_tokens, config.max_model_len) == (16, 4096)


def test_shared_steps_default_to_a_sixteenth_of_a_step_per_tenant() -> None:
    assert SchedulerConfig(max_num_batched_tokens=512).max_shared_prefill_tokens == 32
    assert SchedulerConfig(max_num_batched_tokens=8).max_shared_prefill_tokens == 1
    assert SchedulerConfig(max_shared_prefill_tokens=100).max_shared_prefill_tokens == 100
    assert SchedulerConfig().tenant_linger_seconds == 5.0


def test_num_kv_blocks_wins() -> None:
    assert CacheConfig(num_kv_blocks=123).resolve_num_blocks(bytes_per_block=4096) == 123


def test_kv_cache_memory_is_divided_by_block_bytes() -> None:
    config = CacheConfig(kv_cache_memory=10_000)
    assert config.resolve_num_blocks(bytes_per_block=3_000) == 3


def test_default_memory_budget() -> None:
    assert CacheConfig().resolve_num_blocks(bytes_per_block=1 << 20) == (
        DEFAULT_KV_CACHE_MEMORY >> 20)


def test_budget_smaller_than_one_block_raises() -> None:
    with pytest.raises(ValueError) as info:
        CacheConfig(kv_cache_memory=100).resolve_num_blocks(bytes_per_block=4096)
    assert str(info.value) == "kv_cache_memory must be at least one block (4096 bytes), got 100"


def test_cpu_blocks_from_swap_space() -> None:
    assert CacheConfig(swap_space=0.5).num_cpu_blocks(bytes_per_block=GiB // 64) == 32
    assert CacheConfig(swap_space=0).num_cpu_blocks(bytes_per_block=4096) == 0


def test_bytes_per_block_must_be_positive() -> None:
    with pytest.raises(ValueError) as info:
        CacheConfig().num_cpu_blocks(bytes_per_block=0)
    assert str(info.value) == "bytes_per_block must be at least 1, got 0"


def test_swap_space_defaults_to_none_on_the_cpu_and_4_gib_with_an_accelerator() -> None:
    # On the CPU the KV cache is in CPU memory already: a swap would copy CPU memory to CPU
    # memory, so none is reserved unless asked for.
    assert EngineArgs().cache_config("cpu").swap_space == 0.0
    assert EngineArgs().cache_config("cuda").swap_space == 4.0
    assert EngineArgs(swap_space=0.5).cache_config("cpu").swap_space == 0.5
    assert EngineArgs(swap_space=0).cache_config("cuda").swap_space == 0.0


def test_the_models_context_is_cut_to_what_the_kv_cache_holds_unless_asked_for(caplog) -> None:
    from pagedserve.server import LLM

    # tiny's 2,048 positions in 16 blocks of 16 tokens: 256 tokens a request, with a warning.
    llm = LLM("tiny", num_kv_blocks=16, skip_tokenizer_init=True)
    assert llm.engine.max_model_len == 256
    assert llm.engine.scheduler_config.max_model_len == 256
    assert "max_model_len 2048 (the model's) does not fit the KV cache" in caplog.text
    with pytest.raises(ValueError, match="max_model_len 512 needs 32 KV blocks of 16 tokens, "
                                         "but the KV cache holds 16 blocks"):
        LLM("tiny", num_kv_blocks=16, max_model_len=512, skip_tokenizer_init=True)


def test_the_weights_move_onto_huge_pages_only_after_an_engine_came_up(monkeypatch) -> None:
    from pagedserve.kernels.weight_arena import ARENA
    from pagedserve.server import LLM

    waits = []
    monkeypatch.setattr(ARENA, "move_to_huge_pages",
                        lambda after=None, background=True: waits.append(after))
    with pytest.raises(ValueError, match="but the KV cache holds 16 blocks"):
        LLM("tiny", num_kv_blocks=16, max_model_len=512, skip_tokenizer_init=True)
    LLM("tiny", num_kv_blocks=16, skip_tokenizer_init=True)
    # The failed engine's wait calls the move off; the one that came up waits for its
    # KV cache, then lets it run.
    assert [wait() for wait in waits] == [False, True]
