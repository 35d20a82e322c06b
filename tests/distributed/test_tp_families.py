"""Every family and sharding case split over two ranks gives transformers' greedy tokens, and
those of one rank, token for token.

- ``llama``: GQA, one of the two KV heads per rank;
- ``llama_kv1``: the single KV head replicated on both ranks, a padded vocabulary split,
  tied embeddings;
- ``qwen2``: q/k/v biases split with their heads, a KV head replicated, a checkpoint in
  several safetensors files;
- ``opt``: multi-head attention, learned positions, biases on row-parallel layers added once,
  embeddings projected in and out;
- ``qwen3``: per-head q/k norms on each rank's heads;
- ``phi3``: stacked q/k/v and gate/up tensors, each part split by rank.

The ranks are threads of this process with real gloo collectives (thread_ranks.py); the
engine's process path runs in test_tp_engine.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed.conftest import greedy_case
from tests.distributed.thread_ranks import greedy_on_ranks

NEW_TOKENS = 20


@pytest.mark.parametrize("name", ["llama", "llama_kv1", "qwen2", "opt", "qwen3", "phi3"])
def test_two_ranks_match_one_rank_and_transformers(tp_checkpoints: dict[str, Path],
                                                   name: str) -> None:
    path = tp_checkpoints[name]
    prompts, expected = greedy_case(path, NEW_TOKENS)
    assert greedy_on_ranks(path, prompts, NEW_TOKENS, world_size=2) == expected
    assert greedy_on_ranks(path, prompts, NEW_TOKENS, world_size=1) == expected
