"""A GGUF file split over two ranks: each rank dequantizes its shard of every tensor (Q/K rows
restored before the split; a llama.cpp Phi-3 file's stacked q/k/v and gate/up split into their
parts first), and the ranks decode the tokens of one rank, through the thread ranks and
through the engine's worker processes (``-tp 2``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.server import LLM, SamplingParams
from tests.checkpoints import make_checkpoint
from tests.distributed.thread_ranks import greedy_on_ranks
from tests.gguf_files import write_gguf
from tests.llama_cpp_files import llama_cpp_files_fixture

NEW_TOKENS = 16
# name → (family, overrides): GQA with one KV head per rank; one KV head replicated, biases.
FILES = {"llama": ("llama", {}), "qwen2": ("qwen2", {})}
llama_cpp_files = llama_cpp_files_fixture()


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tp-gguf")
    return {
        name: write_gguf(root / f"{name}.gguf", make_checkpoint(root / name, family, **overrides),
                         qtype="Q8_0")
        for name, (family, overrides) in FILES.items()
    }


def _prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(3, vocab, (n,), generator=gen).tolist() for n in (3, 9, 17)]


@pytest.mark.parametrize("name", sorted(FILES))
def test_two_thread_ranks_match_one(gguf_files: dict[str, Path], name: str) -> None:
    prompts = _prompts(320)
    one = greedy_on_ranks(gguf_files[name], prompts, NEW_TOKENS, world_size=1)
    assert greedy_on_ranks(gguf_files[name], prompts, NEW_TOKENS, world_size=2) == one


def test_a_llama_cpp_phi3_file_on_two_thread_ranks(llama_cpp_files: dict[str, Path]) -> None:
    path, prompts = llama_cpp_files["phi3-F16.gguf"], _prompts(288)
    one = greedy_on_ranks(path, prompts, NEW_TOKENS, world_size=1)
    assert greedy_on_ranks(path, prompts, NEW_TOKENS, world_size=2) == one


def test_two_worker_processes_match_one_rank(gguf_files: dict[str, Path]) -> None:
    path = str(gguf_files["llama"])
    engine = dict(dtype="float32", num_kv_blocks=64, block_size=8)
    requests = [{"prompt_token_ids": p} for p in _prompts(320)]
    greedy = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(path, **engine).generate(requests, greedy)]
    tp2 = LLM(path, tensor_parallel_size=2, **engine)
    try:
        assert [o.outputs[0].token_ids for o in tp2.generate(requests, greedy)] == expected
    finally:
        tp2.engine.shutdown()
