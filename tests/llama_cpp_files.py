"""GGUF files made by llama.cpp's own tools from tiny seeded checkpoints, committed as
``tests/fixtures/llama_cpp_gguf.tar.xz`` so that no test waits for a llama.cpp build.
``tests/fixtures/make_gguf_fixtures.py`` makes them from the recipes below.

API:
- ``RECIPES``: name → ``Recipe`` (family, seed, the 16- or 32-bit type the converter wrote,
  config overrides). ``QUANTIZED`` is the recipe quantized to every preset of
  ``benchmarks.llama_cpp_tools.PRESETS``.
- ``float_file(name)`` / ``preset_file(preset)``: the archive member names.
- ``make_reference(name, directory) -> Path`` rebuilds a recipe's Hugging Face checkpoint (the
  float reference: its weights are values of the converted type, so the float file holds them
  exactly) with ``tests/checkpoints.py``.
- ``unpack(directory) -> dict[str, Path]``: member name → unpacked path.
- ``llama_cpp_files_fixture()`` returns a session-scoped fixture of ``unpack`` into a
  temporary directory: ``llama_cpp_files = llama_cpp_files_fixture()`` in a test module.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.checkpoints import LLAMA3_ROPE, LONGROPE, make_checkpoint

ARCHIVE = Path(__file__).parent / "fixtures" / "llama_cpp_gguf.tar.xz"
MANIFEST = "manifest.json"
_ROUNDING = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": None}


@dataclass(frozen=True)
class Recipe:
    family: str
    seed: int
    outtype: str  # the converter's --outtype, upper case: F16, BF16 or F32
    overrides: dict[str, Any] = field(default_factory=dict)
    # The converter reads a Phi-3 vocabulary as GPT-2's only under this tokenizer class.
    tokenizer_class: str | None = None


RECIPES = {
    # Llama 3.2's shape at its smallest: GQA, llama3 rope scaling, tied embeddings; inputs of
    # 256 so that every K-quant block fits.
    "llama3": Recipe("llama", 11, "F16", dict(
        vocab_size=288, hidden_size=256, intermediate_size=256, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=512,
        rope_scaling=LLAMA3_ROPE, tie_word_embeddings=True)),
    # Heads wider than the hidden size, per-head q/k norms, a bfloat16 file.
    "qwen3": Recipe("qwen3", 12, "BF16"),
    # Fused qkv and gate/up, LongRoPE (the converter writes both factor tensors).
    "phi3": Recipe("phi3", 13, "F16", dict(rope_parameters=LONGROPE,
                                           original_max_position_embeddings=64),
                   tokenizer_class="GPT2Tokenizer"),
}
QUANTIZED = "llama3"


def float_file(name: str) -> str:
    return f"{name}-{RECIPES[name].outtype}.gguf"


def preset_file(preset: str) -> str:
    return f"{QUANTIZED}-{preset}.gguf"


def make_reference(name: str, directory: str | Path) -> Path:
    recipe = RECIPES[name]
    return make_checkpoint(directory, recipe.family, seed=recipe.seed,
                           round_to=_ROUNDING[recipe.outtype], **recipe.overrides)


def unpack(directory: str | Path) -> dict[str, Path]:
    directory = Path(directory)
    with tarfile.open(ARCHIVE) as archive:
        archive.extractall(directory, filter="data")
    names = json.loads((directory / MANIFEST).read_text())["files"]
    return {name: directory / name for name in names}


def llama_cpp_files_fixture() -> Callable[..., dict[str, Path]]:
    @pytest.fixture(scope="session")
    def _files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
        return unpack(tmp_path_factory.mktemp("llama-cpp-gguf"))

    return _files
