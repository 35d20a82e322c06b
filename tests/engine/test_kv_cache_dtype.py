"""--kv-cache-dtype: a float32 model over a 16-bit KV cache holds twice the blocks in the
same memory, the CPU kernels and the torch reference read it alike, the CPU kernels keep
float16 by default, and a pairing a backend cannot read is refused with the reason."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pagedserve.kernels import native_build
from pagedserve.kernels.dispatch import TORCH_OPS
from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.engine.worker.kv_cache import resolve_kv_cache_dtype
from tests.checkpoints import make_checkpoint

VOCAB = 256
KV_MEMORY = 1 << 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64, GQA: the shapes the C decode kernel specialises.
    return make_checkpoint(tmp_path_factory.mktemp("kv-dtype-llama"), "llama", vocab_size=VOCAB,
                           hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                           num_hidden_layers=2, max_position_embeddings=256)


def _llm(model_dir: Path, backend: str, kv_cache_dtype: str) -> LLM:
    return LLM(str(model_dir), dtype="float32", kernel_backend=backend, skip_tokenizer_init=True,
               kv_cache_memory=KV_MEMORY, kv_cache_dtype=kv_cache_dtype, max_model_len=256)


def test_a_bfloat16_cache_under_a_float32_model_holds_twice_the_blocks(model_dir):
    full, half = _llm(model_dir, "torch", "auto"), _llm(model_dir, "torch", "bfloat16")
    assert full.engine.kv_cache.key_caches[0].dtype == torch.float32
    assert half.engine.kv_cache.key_caches[0].dtype == torch.bfloat16
    assert half.engine.kv_cache.value_caches[0].dtype == torch.bfloat16
    assert half.engine.kv_cache.num_device_blocks == 2 * full.engine.kv_cache.num_device_blocks
    assert half.engine.model.dtype == torch.float32


@pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")
@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float16"])
def test_the_c_kernels_and_the_reference_read_a_16_bit_cache_alike(model_dir, cache_dtype):
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (3, 21, 40)]
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=1)
    outputs = {}
    for backend in ("torch", "cpu"):
        llm = _llm(model_dir, backend, cache_dtype)
        assert llm.engine.model.kernel_ops.name == backend
        assert llm.engine.kv_cache.key_caches[0].dtype == getattr(torch, cache_dtype)
        outputs[backend] = [r.outputs[0] for r in llm.generate(requests, params)]
    for ours, reference in zip(outputs["cpu"], outputs["torch"], strict=True):
        assert ours.token_ids == reference.token_ids
        for mine, theirs, token in zip(ours.logprobs, reference.logprobs, ours.token_ids,
                                       strict=True):
            # The backends differ in their GEMMs and norms too, by float32 rounding.
            assert mine[token].logprob == pytest.approx(theirs[token].logprob, abs=1e-3)


def test_auto_keeps_float16_under_a_float32_model_on_the_c_kernels_only():
    cpu = replace(TORCH_OPS, name="cpu", float32_model_cache_dtype=torch.float16)
    assert resolve_kv_cache_dtype("auto", torch.float32, cpu) == torch.float16
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, cpu) == torch.bfloat16
    assert resolve_kv_cache_dtype("float32", torch.float32, cpu) == torch.float32
    assert resolve_kv_cache_dtype("auto", torch.float32, TORCH_OPS) == torch.float32


@pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")
def test_a_float32_model_on_the_cpu_backend_gets_a_float16_cache_by_default(model_dir):
    llm = _llm(model_dir, "cpu", "auto")
    assert llm.engine.kv_cache.key_caches[0].dtype == torch.float16
    assert llm.engine.model.dtype == torch.float32


def test_unknown_and_unreadable_cache_dtypes_are_refused():
    assert resolve_kv_cache_dtype("auto", torch.bfloat16, TORCH_OPS) == torch.bfloat16
    assert resolve_kv_cache_dtype("bfloat16", torch.float32, TORCH_OPS) == torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, "
                                         "bfloat16, float16, got 'fp8'"):
        resolve_kv_cache_dtype("fp8", torch.float32, TORCH_OPS)
    triton = replace(TORCH_OPS, name="triton", reads_other_cache_dtypes=False)
    assert resolve_kv_cache_dtype("float16", torch.float16, triton) == torch.float16
    with pytest.raises(ValueError, match="kv_cache_dtype bfloat16 differs from the model's "
                                         "float32, which the triton kernels do not read"):
        resolve_kv_cache_dtype("bfloat16", torch.float32, triton)


def test_the_flag_is_an_engine_argument():
    parser = __import__("argparse").ArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli_args(parser.parse_args(["--kv-cache-dtype", "bfloat16"]))
    assert args.kv_cache_dtype == "bfloat16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "fp8"])
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32, "
                                         "bfloat16, float16, got 'fp8'"):
        EngineArgs(kv_cache_dtype="fp8")


@pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")
@pytest.mark.parametrize("cache_dtype", ["float32", "float16"])
def test_a_decode_step_in_one_call_decodes_as_the_three_ops_do(model_dir, cache_dtype):
    from pagedserve.server.models.attention import PagedAttention

    generator = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (5, 30)]
    requests = [{"prompt_token_ids": p} for p in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    outputs = []
    for fused in (True, False):
        llm = _llm(model_dir, "cpu", cache_dtype)
        layers = [m for m in llm.engine.model.modules() if isinstance(m, PagedAttention)]
        assert layers and all(m.ops.rotary_cache_decode is not None for m in layers)
        if not fused:
            for module in layers:
                module.ops = replace(module.ops, rotary_cache_decode=None)
        outputs.append([r.outputs[0] for r in llm.generate(requests, params)])
    for one_call, three_ops in zip(*outputs, strict=True):
        assert one_call.token_ids == three_ops.token_ids
        assert [p[t].logprob for p, t in zip(one_call.logprobs, one_call.token_ids,
                                             strict=True)] == \
               [p[t].logprob for p, t in zip(three_ops.logprobs, three_ops.token_ids,
                                             strict=True)]
