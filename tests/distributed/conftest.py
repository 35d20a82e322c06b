"""Tiny checkpoints for the tensor-parallel tests, one per sharding case, and transformers'
greedy continuations as the oracle.

- ``llama``: GQA with 4 query and 2 KV heads, so each of 2 ranks holds one KV head.
- ``llama_kv1``: one KV head, replicated on both ranks; an odd vocabulary (383), so the
  vocabulary split pads; tied embeddings.
- ``qwen2``: one KV head, q/k/v biases; saved in several safetensors shards with an index.
- ``opt``: multi-head attention, biases everywhere, embeddings narrower than the hidden size.
- ``qwen3``: per-head q/k norms on each rank's heads, heads wider than the hidden size.
- ``phi3``: q/k/v and gate/up stacked in one tensor each, split into parts, then by rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.checkpoints import make_checkpoint
from tests.e2e.conftest import hf_greedy, prompt_token_ids

CHECKPOINTS = {
    "llama": ("llama", {}),
    "llama_kv1": ("llama", {"num_key_value_heads": 1, "vocab_size": 383,
                            "tie_word_embeddings": True}),
    "qwen2": ("qwen2", {"max_shard_size": "40KB"}),
    "opt": ("opt", {"word_embed_proj_dim": 32}),
    "qwen3": ("qwen3", {}),
    "phi3": ("phi3", {}),
}


@pytest.fixture(scope="session")
def tp_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    paths = {}
    for name, (family, overrides) in CHECKPOINTS.items():
        paths[name] = make_checkpoint(tmp_path_factory.mktemp(f"tp-{name}"), family,
                                      max_position_embeddings=512, **overrides)
    return paths


def greedy_case(path: Path, max_new_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, transformers' greedy continuations): four of the e2e prompts, of 7, 17, 64
    and 200 tokens (one and several blocks, a partial last block)."""
    import json

    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    prompts = prompt_token_ids(vocab)[1::2]
    return prompts, hf_greedy(path, prompts, max_new_tokens)
