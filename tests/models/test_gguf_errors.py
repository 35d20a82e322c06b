"""Bad GGUF files fail to load with a typed error that names the problem, before any weight
is used, and the CLI exits with that one line instead of a traceback."""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from pagedserve.cli import serve
from pagedserve.server.models import loader
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.model_path import SMOLLM2_INSTALL, resolve_model
from pagedserve.server.tokenizer.base import TokenizerLoadError
from pagedserve.server.tokenizer.loader import load_tokenizer
from tests.checkpoints import checkpoint_fixture
from tests.gguf_files import set_number, truncate, write_gguf
from tests.llama_cpp_files import llama_cpp_files_fixture

llama_checkpoint = checkpoint_fixture("llama")
llama_cpp_files = llama_cpp_files_fixture()


def _load_error(path: Path) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(path, dtype="float32")
    return str(info.value)


@pytest.fixture
def good(tmp_path: Path, llama_checkpoint: Path) -> Path:
    return write_gguf(tmp_path / "good.gguf", llama_checkpoint, qtype="Q8_0")


@pytest.mark.parametrize("keep", [100, 20_000, -1000])
def test_a_truncated_file(good: Path, keep: int) -> None:
    size = good.stat().st_size
    truncate(good, keep if keep > 0 else size + keep)
    message = _load_error(good)
    assert message.startswith(f"{str(good.resolve())!r} is not a readable GGUF file (")
    with pytest.raises(TokenizerLoadError, match=re.escape("is not a readable GGUF file")):
        load_tokenizer(good)


def test_not_gguf_at_all(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 a zip file")
    assert "is not a readable GGUF file" in _load_error(path)


def test_an_unsupported_architecture(tmp_path: Path, llama_checkpoint: Path,
                                     no_allocation: None) -> None:
    path = write_gguf(tmp_path / "g.gguf", llama_checkpoint,
                      metadata={"general.architecture": "gemma"})
    assert _load_error(path) == (
        "unsupported GGUF architecture 'gemma'; supported: llama, phi3, qwen2, qwen3")


def test_missing_metadata(tmp_path: Path, llama_checkpoint: Path) -> None:
    path = write_gguf(tmp_path / "g.gguf", llama_checkpoint,
                      metadata={"llama.block_count": None})
    assert _load_error(path) == (
        f"GGUF file {str(path.resolve())!r} has no 'llama.block_count' metadata")


def test_a_tensor_of_the_wrong_shape(tmp_path: Path, llama_checkpoint: Path) -> None:
    path = write_gguf(tmp_path / "g.gguf", llama_checkpoint,
                      reshape={"blk.1.attn_v.weight": (16, 64)})
    assert _load_error(path) == (
        f"checkpoint {path} weight 'model.layers.1.self_attn.v_proj.weight' has shape "
        f"[16, 64], LlamaForCausalLM expects [32, 64]"
    )


def test_an_unsupported_tensor_type(tmp_path: Path, llama_checkpoint: Path,
                                   no_allocation: None) -> None:
    path = write_gguf(tmp_path / "g.gguf", llama_checkpoint,
                      dtypes={"blk.0.ffn_up.weight": np.float64})
    message = _load_error(path)
    assert message.startswith(
        "GGUF tensor 'blk.0.ffn_up.weight' has type F64, which cannot be dequantized; "
        "supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, ")
    assert ", BF16, " in message


def test_a_vocabulary_larger_than_the_embedding(tmp_path: Path, llama_checkpoint: Path) -> None:
    path = write_gguf(tmp_path / "g.gguf", llama_checkpoint,
                      reshape={"token_embd.weight": (300, 64)})
    assert _load_error(path) == (
        "GGUF vocabulary has 384 tokens but the model has 300 embedding rows; the file's "
        "tokenizer and weights disagree"
    )


def test_a_file_without_a_tokenizer(tmp_path: Path, llama_checkpoint: Path) -> None:
    path = write_gguf(tmp_path / "g.gguf", llama_checkpoint, tokenizer=None)
    with pytest.raises(TokenizerLoadError) as info:
        load_tokenizer(path)
    assert str(info.value) == f"GGUF file {str(path)!r} has no tokenizer (tokenizer.ggml.*)"


def test_a_gguf_path_resolves_to_itself(good: Path) -> None:
    assert resolve_model(str(good)) == good
    with pytest.raises(ModelLoadError) as info:
        load_model(good.with_name("absent.gguf"))
    assert str(info.value) == f"GGUF file {str(good.with_name('absent.gguf'))!r} does not exist"


def test_smollm2_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)
    with pytest.raises(ModelLoadError) as info:
        resolve_model("smollm2")
    assert str(info.value) == (
        f"model 'smollm2' is not installed; install it with: {SMOLLM2_INSTALL}"
    )


def test_the_cli_exits_1_with_one_line(good: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truncate(good, 5000)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args([str(good), "--port", "0"])) == 1
    err = capsys.readouterr().err
    assert err.startswith("pagedserve serve: cannot start the engine: ")
    assert "is not a readable GGUF file" in err
    assert err.count("\n") == 1


@pytest.fixture
def no_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails a test whose load gets as far as allocating the model's parameters."""
    def refuse(*args: object) -> None:
        raise AssertionError("parameters allocated before the file was refused")

    monkeypatch.setattr(loader, "materialize", refuse)


def _llama_cpp_copy(files: dict[str, Path], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copy(files[name], tmp_path / name))


def test_metadata_that_disagrees_with_the_tensors(llama_cpp_files, tmp_path: Path,
                                                  no_allocation: None) -> None:
    path = set_number(_llama_cpp_copy(llama_cpp_files, "llama3-Q4_K_M.gguf", tmp_path),
                      "llama.feed_forward_length", 512)
    assert _load_error(path) == (
        f"checkpoint {path} weight 'model.layers.0.mlp.down_proj.weight' has shape [256, 256], "
        f"LlamaForCausalLM expects [256, 512]")


def test_a_fused_tensor_that_disagrees_with_the_head_counts(llama_cpp_files, tmp_path: Path,
                                                            no_allocation: None) -> None:
    path = set_number(_llama_cpp_copy(llama_cpp_files, "phi3-F16.gguf", tmp_path),
                      "phi3.attention.head_count_kv", 1)
    assert _load_error(path) == (
        "checkpoint weight 'model.layers.0.self_attn.qkv_proj.weight' has 128 rows; "
        "Phi3ForCausalLM stacks q_proj 64 + k_proj 16 + v_proj 16 = 96 rows in it")


def test_a_missing_tensor_is_refused_before_allocation(
        tmp_path: Path, llama_checkpoint: Path, no_allocation: None) -> None:
    missing = write_gguf(tmp_path / "u.gguf", llama_checkpoint, skip=["output_norm.weight"])
    assert _load_error(missing) == (
        f"checkpoint {missing} is missing 1 weight of LlamaForCausalLM: 'model.norm.weight'")


def test_the_cli_prints_a_shape_error_in_one_line(llama_cpp_files, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = set_number(_llama_cpp_copy(llama_cpp_files, "llama3-F16.gguf", tmp_path),
                      "llama.attention.head_count", 8)
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    assert serve.run(parser.parse_args([str(path), "--port", "0"])) == 1
    err = capsys.readouterr().err
    assert err == (f"pagedserve serve: cannot start the engine: checkpoint {path} weight "
                   f"'model.layers.0.self_attn.o_proj.weight' has shape [256, 256], "
                   f"LlamaForCausalLM expects [256, 512]\n")


def test_a_partial_rotary_embedding_is_refused(llama_cpp_files, tmp_path: Path,
                                               no_allocation: None) -> None:
    path = set_number(_llama_cpp_copy(llama_cpp_files, "phi3-F16.gguf", tmp_path),
                      "phi3.rope.dimension_count", 12)
    assert _load_error(path) == (
        "partial rotary embeddings (partial_rotary_factor 0.75) are not supported; supported: "
        "rotary embeddings over the whole head")
