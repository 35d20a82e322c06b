"""Shared checkpoints for the tokenizer tests: one trained byte-level BPE, one tiktoken."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from pagedserve.server.tokenizer import Tokenizer, load_tokenizer
from tests.tokenizer_files import write_hf_tokenizer, write_tiktoken_tokenizer

VOCAB_SIZE = 384


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_hf_tokenizer(tmp_path_factory.mktemp("hf"), VOCAB_SIZE)


@pytest.fixture(scope="session")
def hf_tokenizer(hf_dir: Path) -> Tokenizer:
    return load_tokenizer(hf_dir)


@pytest.fixture(scope="session")
def auto_tokenizer_for() -> Callable[[Path], object]:
    """transformers' AutoTokenizer for a directory (imported only by tests that compare)."""
    from transformers import AutoTokenizer

    return lambda path: AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def auto_tokenizer(hf_dir: Path, auto_tokenizer_for: Callable[[Path], object]) -> object:
    return auto_tokenizer_for(hf_dir)


@pytest.fixture(scope="session")
def tiktoken_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return load_tokenizer(write_tiktoken_tokenizer(tmp_path_factory.mktemp("tiktoken")))
