"""The CPU decode plan (``cpu_decode_plan.py``) runs a decode step's kernels as the modules
do: the same hidden states, bit for bit, at every step of a ragged batch whose sequences
finish one after another, and the same tokens; models it does not run keep the modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.kernels import native_build
from pagedserve.server.llm import LLM
from pagedserve.server.models.cpu_decode_plan import CpuDecodePlan
from tests.checkpoints import make_checkpoint
from tests.llama_cpp_files import float_file, llama_cpp_files_fixture, preset_file

pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")

llama_cpp_files = llama_cpp_files_fixture()

# Prompt lengths and output lengths: the batch shrinks from 5 sequences to 1 as they finish.
PROMPT_LENS, MAX_TOKENS = (3, 9, 5, 12, 7), (14, 5, 9, 3, 11)


@pytest.fixture(scope="module")
def three_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three layers (the plan's residual add between them), GQA, and a hidden size of 48:
    inputs that are no multiple of the kernel's blocks of 32."""
    return make_checkpoint(tmp_path_factory.mktemp("plan-llama"), "llama", vocab_size=200,
                           hidden_size=48, intermediate_size=72, num_attention_heads=4,
                           num_key_value_heads=2, num_hidden_layers=3,
                           max_position_embeddings=256)


def _run(path: Path, plan: bool, monkeypatch: pytest.MonkeyPatch,
         **kwargs) -> tuple[list[torch.Tensor], list[list[int]], int, object]:
    """(each step's final hidden states, each request's tokens, the steps the plan ran, the
    model's plan) of one engine, with the plan or with the modules alone."""
    kwargs.setdefault("kernel_backend", "cpu")  # the suite's default is the torch reference
    llm = LLM(str(path), dtype="float32", num_kv_blocks=64, cpu_threads=2,
              skip_tokenizer_init=True, **kwargs)
    stack = llm.engine.runner.model.model
    if not plan:
        stack.decode_plan = False
    hidden: list[torch.Tensor] = []
    stack.register_forward_hook(lambda module, args, out: hidden.append(out.clone()))
    runs = []
    real_run = CpuDecodePlan.run

    def counted(self, *args):
        out = real_run(self, *args)
        runs.append(out is not None)
        return out

    monkeypatch.setattr(CpuDecodePlan, "run", counted)
    gen = torch.Generator().manual_seed(3)
    prompts = [{"prompt_token_ids": torch.randint(3, 150, (n,), generator=gen).tolist()}
               for n in PROMPT_LENS]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(prompts, params)
    monkeypatch.setattr(CpuDecodePlan, "run", real_run)
    return hidden, [list(o.outputs[0].token_ids) for o in outputs], sum(runs), stack.decode_plan


def _assert_same_steps(path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs) -> None:
    hidden, tokens, runs, plan = _run(path, True, monkeypatch, **kwargs)
    expected_hidden, expected_tokens, module_runs, _ = _run(path, False, monkeypatch, **kwargs)
    assert isinstance(plan, CpuDecodePlan)
    # Every decode-only step (the longest request's 14 tokens, less its first from the
    # prefill) ran the plan; none did with the plan switched off.
    assert runs >= max(MAX_TOKENS) - 1
    assert module_runs == 0
    assert len(hidden) == len(expected_hidden)
    for step, (got, expected) in enumerate(zip(hidden, expected_hidden, strict=True)):
        assert torch.equal(got, expected), f"step {step}"
    assert tokens == expected_tokens


def test_three_quantized_layers_step_as_the_modules_do(three_layers, monkeypatch):
    _assert_same_steps(three_layers, monkeypatch, quantization="int4")


@pytest.mark.parametrize("file", [preset_file("Q4_K_M"), preset_file("Q8_0"),
                                  preset_file("IQ4_XS"), float_file("llama3")])
def test_llama_cpp_files_step_as_the_modules_do(llama_cpp_files, monkeypatch, file):
    _assert_same_steps(llama_cpp_files[file], monkeypatch)


def test_the_bfloat16_kv_cache_steps_as_the_modules_do(llama_cpp_files, monkeypatch):
    _assert_same_steps(llama_cpp_files[preset_file("Q4_K_M")], monkeypatch,
                       kv_cache_dtype="bfloat16")


def test_per_head_norms_keep_the_modules(llama_cpp_files, monkeypatch):
    """Qwen3 normalises each query and key head before RoPE: a step the plan does not have."""
    _, _, runs, plan = _run(llama_cpp_files[float_file("qwen3")], True, monkeypatch)
    assert plan is False
    assert runs == 0


@pytest.mark.parametrize("settings", [
    # the torch reference's ops throughout
    {"kernel_backend": "torch", "quantization": "int4"},
    # the C ops, but the projections on torch's int8 matmul
    {"quantization": "int8"},
])
def test_a_model_off_the_c_kernels_keeps_the_modules(three_layers, monkeypatch, settings):
    _, _, runs, plan = _run(three_layers, True, monkeypatch, **settings)
    assert plan is False
    assert runs == 0
