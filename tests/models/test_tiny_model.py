"""The embedded tiny checkpoint: written once, atomically, loadable by us and by transformers."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest
import torch

from pagedserve.common.cache_dir import CACHE_ENV
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.model_path import resolve_model
from pagedserve.server.models.tiny import NOTE, TINY_DIR_NAME, ensure_tiny_model
from tests.checkpoints import load_hf_model
from tests.models.paged_harness import PagedHarness, hf_logits


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_tiny_model(tmp_path_factory.mktemp("cache"))


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_layout_and_config(tiny_dir):
    assert tiny_dir.name == TINY_DIR_NAME
    assert sorted(p.name for p in tiny_dir.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tiktoken.json",
    ]
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["vocab_size"] == 100277
    assert config["eos_token_id"] == 100257
    assert config["tie_word_embeddings"] is True
    assert config["pagedserve_note"] == NOTE and "random weights" in NOTE
    assert json.loads((tiny_dir / "tiktoken.json").read_text()) == {
        "encoding": "cl100k_base", "eos_token": "<|endoftext|>",
    }
    assert json.loads((tiny_dir / "generation_config.json").read_text())["eos_token_id"] == 100257


def test_created_once_then_reused(tiny_dir):
    before = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(tiny_dir.parent.parent) == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == before
    # No staging directory is left next to the model.
    assert [p.name for p in tiny_dir.parent.iterdir()] == [TINY_DIR_NAME]


def test_weights_are_seeded(tiny_dir, tmp_path):
    # A leftover staging directory of an interrupted writer does not get in the way.
    (tmp_path / "models" / f".{TINY_DIR_NAME}-stale").mkdir(parents=True)
    assert _digest(ensure_tiny_model(tmp_path)) == _digest(tiny_dir)


def test_resolve_model_uses_the_cache_environment(tiny_dir, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tiny_dir.parent.parent))
    assert resolve_model("tiny") == tiny_dir
    assert resolve_model(None) == tiny_dir
    assert resolve_model(str(tiny_dir)) == tiny_dir


def test_resolve_model_refuses_other_names(tmp_path):
    with pytest.raises(ModelLoadError) as info:
        resolve_model("meta-llama/Llama-3-8B")
    assert str(info.value) == (
        "model 'meta-llama/Llama-3-8B' is not a directory with a config.json nor a GGUF file; "
        "pass a local Hugging Face-format directory, a .gguf file, 'smollm2' or 'tiny' "
        "(nothing is downloaded)"
    )


def test_loader_warns_and_logits_match_transformers(tiny_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="pagedserve.server.models.loader"):
        model, config = load_model(tiny_dir, dtype="float32")
    assert [r.getMessage() for r in caplog.records] == [f"model {tiny_dir}: {NOTE}"]
    prompt = [791, 93315, 72, 100257, 15339, 1917]

    ours = PagedHarness(model, config, block_size=16, num_blocks=4).step([(0, prompt)])[0]

    torch.testing.assert_close(ours, hf_logits(load_hf_model(tiny_dir), prompt),
                               atol=1e-4, rtol=0)
    # Spread enough for sampling to matter, not so peaked that one token always wins.
    spread = ours.std(dim=-1)
    assert float(spread.min()) > 0.1 and float(spread.max()) < 1.0
    assert len(set(ours.argmax(dim=-1).tolist())) == len(prompt)
