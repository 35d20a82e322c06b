"""One tiny random checkpoint per family per run, with our model and transformers' loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.server.models.loader import load_model
from tests.checkpoints import LLAMA3_ROPE, LONGROPE, checkpoint_fixture, load_hf_model

llama_checkpoint = checkpoint_fixture("llama")
qwen2_checkpoint = checkpoint_fixture("qwen2")
qwen3_checkpoint = checkpoint_fixture("qwen3")
phi3_checkpoint = checkpoint_fixture("phi3")
phi3_longrope_checkpoint = checkpoint_fixture("phi3", rope_parameters=LONGROPE,
                                              original_max_position_embeddings=64)
# Llama 3.2's shape: llama3 rope scaling and tied embeddings.
llama3_checkpoint = checkpoint_fixture("llama", rope_scaling=LLAMA3_ROPE,
                                       tie_word_embeddings=True)
opt_checkpoint = checkpoint_fixture("opt")
# opt-350m's shape: post-norm layers, embeddings narrower than the hidden size.
opt_post_norm_checkpoint = checkpoint_fixture(
    "opt", word_embed_proj_dim=32, do_layer_norm_before=False
)

FAMILY_FIXTURES = {
    "llama": "llama_checkpoint",
    "llama3": "llama3_checkpoint",
    "qwen2": "qwen2_checkpoint",
    "qwen3": "qwen3_checkpoint",
    "phi3": "phi3_checkpoint",
    "phi3-longrope": "phi3_longrope_checkpoint",
    "opt": "opt_checkpoint",
    "opt-post-norm": "opt_post_norm_checkpoint",
}


@pytest.fixture(scope="session", params=sorted(FAMILY_FIXTURES))
def family_checkpoint(request: pytest.FixtureRequest) -> Path:
    return request.getfixturevalue(FAMILY_FIXTURES[request.param])


@pytest.fixture(scope="session")
def family_models(family_checkpoint: Path):
    """(our float32 model, its ModelConfig, transformers' model) for one family."""
    model, config = load_model(family_checkpoint, dtype="float32")
    return model, config, load_hf_model(family_checkpoint)
