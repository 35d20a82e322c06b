"""load_tokenizer picks the backend by the files a checkpoint directory holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagedserve.server.tokenizer import TokenizerLoadError, load_tokenizer
from pagedserve.server.tokenizer.hf import HFTokenizer
from pagedserve.server.tokenizer.tiktoken_tokenizer import TiktokenTokenizer
from tests.tokenizer_files import write_hf_tokenizer, write_tiktoken_tokenizer


def test_tokenizer_json_is_a_hugging_face_tokenizer(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(write_hf_tokenizer(tmp_path / "hf", 300))
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.name == "hf"


def test_tiktoken_json_is_a_tiktoken_tokenizer(tmp_path: Path) -> None:
    tokenizer = load_tokenizer(str(write_tiktoken_tokenizer(tmp_path)))
    assert isinstance(tokenizer, TiktokenTokenizer)
    assert tokenizer.eos_token_id == 100257


def test_tokenizer_json_wins_when_both_are_present(tmp_path: Path) -> None:
    write_tiktoken_tokenizer(write_hf_tokenizer(tmp_path, 300))
    assert isinstance(load_tokenizer(tmp_path), HFTokenizer)


def test_directory_without_tokenizer_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(tmp_path)
    assert str(info.value) == (
        f"no tokenizer in {str(tmp_path)!r}: expected tokenizer.json (Hugging Face) or "
        "tiktoken.json (tiktoken)"
    )


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(tmp_path / "nope")
    assert str(info.value) == f"model directory {str(tmp_path / 'nope')!r} does not exist"
