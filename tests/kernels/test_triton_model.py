"""The tiny Llama through the Triton kernels (the interpreter on CPU) generates the same greedy
tokens as through the torch reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.server import LLM, SamplingParams
from tests.checkpoints import make_checkpoint
from tests.tokenizer_files import write_hf_tokenizer

VOCAB = 288


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64: a head size the kernels are built for.
    path = make_checkpoint(tmp_path_factory.mktemp("triton-llama"), "llama", vocab_size=VOCAB,
                           hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                           num_hidden_layers=1, max_position_embeddings=128)
    write_hf_tokenizer(path, VOCAB)
    return path


def test_triton_path_matches_torch_path(model_dir: Path) -> None:
    generator = torch.Generator().manual_seed(3)
    prompts = [torch.randint(6, VOCAB, (n,), generator=generator).tolist() for n in (5, 19)]
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=3)
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(str(model_dir), dtype="float32", block_size=8, kernel_backend=backend,
                  max_model_len=128)
        assert llm.engine.model.kernel_ops.name == backend
        outputs[backend] = [r.outputs[0].token_ids for r in llm.generate(requests, params)]
    assert outputs["triton"] == outputs["torch"]
