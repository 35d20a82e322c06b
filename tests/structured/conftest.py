"""The live test checkpoint (tiny seeded Llama, trained BPE tokenizer) and one offline engine
on it, shared by the structured-output tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.server import LLM
from tests.live_model import write_live_model


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_live_model(tmp_path_factory.mktemp("structured-llama"))


@pytest.fixture(scope="session")
def llm(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), num_kv_blocks=64, max_model_len=512)
