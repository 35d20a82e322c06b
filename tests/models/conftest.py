"""One tiny random checkpoint per family per run, with our model and transformers' loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.server.models.loader import load_model
from tests.checkpoints import checkpoint_fixture, load_hf_model

llama_checkpoint = checkpoint_fixture("llama")
qwen2_checkpoint = checkpoint_fixture("qwen2")
opt_checkpoint = checkpoint_fixture("opt")
# opt-350m's shape: post-norm layers, embeddings narrower than the hidden size.
opt_post_norm_checkpoint = checkpoint_fixture(
    "opt", word_embed_proj_dim=32, do_layer_norm_before=False
)

FAMILY_FIXTURES = {
    "llama": "llama_checkpoint",
    "qwen2": "qwen2_checkpoint",
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
