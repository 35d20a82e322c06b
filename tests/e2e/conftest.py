"""Tiny random checkpoints with tokenizers, and transformers' greedy outputs as the oracle."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from pagedserve.kernels.dispatch import BACKEND_ENV
from tests.checkpoints import load_hf_model, make_checkpoint
from tests.tokenizer_files import write_hf_tokenizer

MAX_NEW_TOKENS = 64


@pytest.fixture(scope="module", autouse=True)
def default_kernels() -> Iterator[None]:
    """Parity runs the default kernel path (on CPU: the compiled attention), whatever the
    rest of the suite uses; module scope, so that module-scoped engines get it too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(BACKEND_ENV, "auto")
        yield


def prompt_token_ids(vocab_size: int, seed: int = 0) -> list[list[int]]:
    """Eight prompts of 1 to ~200 tokens; ids avoid the special tokens 0-5."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 7, 16, 17, 33, 64, 120, 200]
    return [torch.randint(6, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt, one at a time (no padding)."""
    model = load_hf_model(model_dir)
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            full = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                  dtype=torch.long), do_sample=False,
                                  max_new_tokens=max_new_tokens, pad_token_id=0)
            outputs.append(full[0, len(ids):].tolist())
    return outputs


def _checkpoint(tmp_path_factory: pytest.TempPathFactory, family: str) -> Path:
    path = make_checkpoint(tmp_path_factory.mktemp(f"e2e-{family}"), family,
                           max_position_embeddings=512)
    write_hf_tokenizer(path, _vocab_size(path))
    return path


def _vocab_size(path: Path) -> int:
    import json

    return json.loads((path / "config.json").read_text())["vocab_size"]


def _case(tmp_path_factory: pytest.TempPathFactory, family: str) -> tuple[Path, list, list]:
    path = _checkpoint(tmp_path_factory, family)
    prompts = prompt_token_ids(_vocab_size(path))
    return path, prompts, hf_greedy(path, prompts, MAX_NEW_TOKENS)


@pytest.fixture(scope="session")
def llama_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, list]:
    return _case(tmp_path_factory, "llama")


@pytest.fixture(scope="session", params=["llama", "qwen2", "opt"])
def family_case(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, list]:
    if request.param == "llama":
        return request.getfixturevalue("llama_case")
    return _case(tmp_path_factory, request.param)
