"""Files made by llama.cpp's own converter and quantizer (``tests/llama_cpp_files.py``): each
architecture's float file holds its checkpoint's weights and gives transformers' greedy ids;
every preset loads with each weight as transformers' own GGUF reading dequantizes it, reports
the kernel of each projection and generates."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from benchmarks.llama_cpp_tools import PRESETS
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.llm import LLM
from pagedserve.server.models.gguf_repack import can_repack
from pagedserve.server.models.loader import load_model
from tests.llama_cpp_files import (
    QUANTIZED,
    RECIPES,
    float_file,
    llama_cpp_files_fixture,
    make_reference,
    preset_file,
)

llama_cpp_files = llama_cpp_files_fixture()

PROMPTS, PROMPT_LEN, NEW_TOKENS = 6, 8, 24
# A layer's projections as the model runs them: qkv, o, gate/up, down; plus the LM head.
PROJECTIONS = 4 * RECIPES[QUANTIZED].overrides["num_hidden_layers"] + 1
# transformers' separate projections, as our layers stack them.
_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llama-cpp-references")
    return {name: make_reference(name, root / name) for name in RECIPES}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    yield 1
    torch.set_num_threads(threads)


def _prompts(vocab_size: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return torch.randint(3, vocab_size, (PROMPTS, PROMPT_LEN), generator=gen).tolist()


def _generate(path: Path, prompts: list[list[int]], threads: int, **kwargs) -> list[list[int]]:
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, cpu_threads=threads, **kwargs)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outputs]


def _transformers_greedy(checkpoint: Path, prompts: list[list[int]]) -> list[list[int]]:
    from tests.checkpoints import load_hf_model

    model = load_hf_model(checkpoint)
    ids = torch.tensor(prompts)
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[:, PROMPT_LEN:].tolist()


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_float_file_holds_the_checkpoints_weights(llama_cpp_files, references,
                                                      name: str) -> None:
    from_gguf, config = load_model(llama_cpp_files[float_file(name)], dtype="float32",
                                   quantization="none")
    from_checkpoint, reference_config = load_model(references[name], dtype="float32")
    # llama3's frequencies come from the file's divisors, not the formula: within a rounding.
    torch.testing.assert_close(from_gguf.model.rotary_emb.inv_freq,
                               from_checkpoint.model.rotary_emb.inv_freq, atol=0, rtol=1e-6)
    assert from_gguf.model.rotary_emb.attention_scaling == pytest.approx(
        from_checkpoint.model.rotary_emb.attention_scaling, rel=1e-7)
    assert config.max_model_len == reference_config.max_model_len
    reference = from_checkpoint.state_dict()
    for key, value in from_gguf.state_dict().items():
        assert torch.equal(value, reference[key]), key


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_greedy_ids_equal_transformers(llama_cpp_files, references, name: str,
                                       one_thread: int) -> None:
    prompts = _prompts(RECIPES[name].overrides.get("vocab_size", 288))
    ours = _generate(llama_cpp_files[float_file(name)], prompts, one_thread)
    assert ours == _transformers_greedy(references[name], prompts)


def _transformers_weights(path: Path) -> dict[str, torch.Tensor]:
    """transformers' own GGUF reading (it dequantizes every tensor), stacked as our layers
    stack projections."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32)
    weights = dict(model.state_dict())
    for name in list(weights):
        module, _, kind = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        for fused, parts in _FUSED.items():
            if leaf == parts[0]:
                weights[f"{parent}.{fused}.{kind}"] = torch.cat(
                    [weights[f"{parent}.{part}.{kind}"] for part in parts])
    return weights


@pytest.mark.parametrize("file", [float_file("phi3"), *map(preset_file, PRESETS)])
def test_each_weight_dequantizes_as_transformers_reads_it(llama_cpp_files, file: str) -> None:
    ours, _ = load_model(llama_cpp_files[file], dtype="float32", quantization="none")
    reference = _transformers_weights(llama_cpp_files[file])
    for key, value in ours.state_dict().items():
        assert torch.equal(value, reference[key]), key


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_names_each_projections_kernel_and_generates(
        llama_cpp_files, preset: str, one_thread: int,
        caplog: pytest.LogCaptureFixture) -> None:
    prompts = _prompts(RECIPES[QUANTIZED].overrides["vocab_size"])[:2]
    with caplog.at_level(logging.INFO, logger="pagedserve.server.models.loader"):
        # The C backend: the one whose block-quant kernels run the stored blocks.
        outputs = _generate(llama_cpp_files[preset_file(preset)], prompts, one_thread,
                            kernel_backend="cpu")
    [report] = [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("quantization gguf: ")]
    named = re.findall(r"(\d+) projections?", report)
    assert sum(map(int, named)) == PROJECTIONS, report
    # A projection stays float only for a tensor type that no repack reads yet.
    for reason in re.findall(r"float \(([^)]*)\)", report):
        assert not can_repack(GGMLQuantizationType[reason]), report
    assert [len(o) for o in outputs] == [NEW_TOKENS] * len(prompts)
    assert all(0 <= t < 288 for o in outputs for t in o)
