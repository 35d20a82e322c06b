"""benchmarks.gguf_presets scores pagedserve as llama-perplexity scores llama.cpp: the same
chunks of llama.cpp's token ids, BOS first where the file's vocabulary adds one."""

from __future__ import annotations

from pathlib import Path

from benchmarks.gguf_presets import bos_to_prepend, chunk_prompts
from tests.llama_cpp_files import llama_cpp_files_fixture

llama_cpp_files = llama_cpp_files_fixture()


def test_chunks_are_whole_windows_with_bos_first() -> None:
    ids = list(range(10, 21))  # 11 ids: two windows of 4, the rest dropped
    assert chunk_prompts(ids, 4, 8, bos=1) == [[1, 11, 12, 13], [1, 15, 16, 17]]
    assert chunk_prompts(ids, 4, 1, bos=None) == [[10, 11, 12, 13]]


def test_bos_follows_the_files_flag(llama_cpp_files: dict[str, Path]) -> None:
    # The test checkpoints' tokenizer adds <s> (id 1); llama.cpp's converter keeps the flag.
    assert bos_to_prepend(llama_cpp_files["qwen3-BF16.gguf"]) == 1
