"""Sizing the KV cache from gpu_memory_utilization: the arithmetic (vLLM's meaning), and the
profile step (the largest batch the scheduler can build) running through the real model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.server.engine.config.engine_config import GiB, SchedulerConfig
from pagedserve.server.engine.worker.gpu_memory import MemorySnapshot, kv_cache_budget, profile_step
from pagedserve.server.models.loader import load_model
from tests.checkpoints import make_checkpoint


def test_budget_is_the_instance_share_minus_what_it_needs_besides() -> None:
    device = MemorySnapshot(free=70 * GiB, total=80 * GiB)
    # 0.5 × 80 GiB = 40 GiB for the instance; 15 GiB of weights and activations.
    assert kv_cache_budget(0.5, device, 15 * GiB) == 25 * GiB
    # Other processes' memory is not the instance's: 10 GiB used elsewhere changes nothing.
    assert kv_cache_budget(0.5, MemorySnapshot(free=80 * GiB, total=80 * GiB), 15 * GiB) == (
        25 * GiB)


def test_budget_refuses_a_share_the_device_does_not_have_free() -> None:
    with pytest.raises(ValueError, match=r"asks for 72\.00 GiB of the device's 80\.00 GiB, but "
                                         r"only 70\.00 GiB are free"):
        kv_cache_budget(0.9, MemorySnapshot(free=70 * GiB, total=80 * GiB), GiB)


def test_budget_refuses_weights_that_fill_the_share() -> None:
    with pytest.raises(ValueError, match=r"weights and activations take 40\.00 GiB, all of the "
                                         r"40\.00 GiB"):
        kv_cache_budget(0.5, MemorySnapshot(free=80 * GiB, total=80 * GiB), 40 * GiB)


def test_profile_step_runs_the_largest_batch(tmp_path: Path) -> None:
    model, config = load_model(make_checkpoint(tmp_path, "llama", vocab_size=128,
                                               max_position_embeddings=64), dtype="float32")
    # 100 tokens in sequences of at most max_model_len 40: 40 + 40 + 20, 3 blocks of 16 each.
    scheduler = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=100, max_model_len=40)
    scratch = profile_step(model, config, scheduler, block_size=16)
    assert scratch == 9 * config.bytes_per_block(16, torch.float32)
