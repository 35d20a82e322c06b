"""``--dtype auto`` on the CPU follows the processor's native bfloat16 instructions."""

from __future__ import annotations

import logging

import torch

from pagedserve.server.models import cpu_dtype
from pagedserve.server.models.loader import resolve_dtype
from pagedserve.server.models.model_config import ModelConfig

AVX512_ONLY = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw avx512_vnni\n"
ZEN4 = "processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n\nflags : ignored\n"
SAPPHIRE_RAPIDS = "flags\t\t: avx512f avx512_bf16 amx_bf16 amx_tile\n"
CONFIG = ModelConfig(architecture="LlamaForCausalLM", model_type="llama", vocab_size=8,
                     hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                     max_position_embeddings=8, torch_dtype="bfloat16")


def test_flags_come_from_the_first_processor():
    assert cpu_dtype.cpu_flags(ZEN4) == {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
    assert cpu_dtype.cpu_flags("model name : Apple M2\n") == frozenset()


def test_avx512_without_bf16_instructions_runs_float32():
    choice = cpu_dtype.choose_cpu_dtype(cpu_dtype.cpu_flags(AVX512_ONLY))
    assert choice.dtype == torch.float32
    assert "has no native bfloat16 matmul instructions (amx_bf16 / avx512_bf16)" in choice.reason


def test_native_bf16_instructions_run_bfloat16():
    amx = cpu_dtype.choose_cpu_dtype(cpu_dtype.cpu_flags(SAPPHIRE_RAPIDS))
    assert (amx.dtype, amx.reason) == (torch.bfloat16,
                                       "the CPU runs bfloat16 natively (amx_bf16)")
    zen4 = cpu_dtype.choose_cpu_dtype(cpu_dtype.cpu_flags(ZEN4))
    assert (zen4.dtype, zen4.reason) == (torch.bfloat16,
                                         "the CPU runs bfloat16 natively (avx512_bf16)")
    assert cpu_dtype.choose_cpu_dtype(frozenset()).dtype == torch.float32


def test_auto_logs_its_choice(monkeypatch, caplog):
    flags = cpu_dtype.cpu_flags(AVX512_ONLY)
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: flags)
    config = CONFIG
    with caplog.at_level(logging.INFO, logger="pagedserve.server.models.loader"):
        assert resolve_dtype("auto", config, torch.device("cpu")) == torch.float32
    assert "--dtype auto: torch.float32, because the CPU (" in caplog.text
    assert resolve_dtype("bfloat16", config, torch.device("cpu")) == torch.bfloat16


def test_quantized_weights_run_float32_even_where_bfloat16_is_native(monkeypatch, caplog):
    quantized = cpu_dtype.choose_cpu_dtype(cpu_dtype.cpu_flags(SAPPHIRE_RAPIDS), quantized=True)
    assert (quantized.dtype, quantized.reason) == (torch.float32, cpu_dtype.QUANTIZED_REASON)
    flags = cpu_dtype.cpu_flags(ZEN4)
    monkeypatch.setattr(cpu_dtype, "cpu_flags", lambda: flags)
    config = CONFIG
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", config, cpu) == torch.bfloat16
    assert resolve_dtype("auto", config, cpu, "none") == torch.bfloat16
    with caplog.at_level(logging.INFO, logger="pagedserve.server.models.loader"):
        for quantization in ("gguf", "int8", "int4"):
            assert resolve_dtype("auto", config, cpu, quantization) == torch.float32
    assert "--dtype auto: torch.float32, because the weights are quantized" in caplog.text
    assert resolve_dtype("bfloat16", config, cpu, "gguf") == torch.bfloat16
