"""A GGUF file mixing block types as llama.cpp's K-quant presets do (Q4_K with Q6_K for some
V and down projections and the LM head, and every other type the block-quant kernel runs in
the second layer) loads with every projection and the embedding on the block-quant kernel:
none dequantized to float, within rounding of the same file dequantized, in little more
memory than the file's tensors. A type no kernel runs falls back to float with a warning
naming it and the types that do run."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from pagedserve.kernels import cpu_block_quant
from pagedserve.kernels.dispatch import TORCH_OPS, cpu_quantized_kernels
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.parallel_layers import PackableLinear
from pagedserve.server.models.quantized_linear import weight_bytes
from tests.checkpoints import make_checkpoint
from tests.gguf_files import write_gguf
from tests.models.paged_harness import PagedHarness
from tests.models.test_model_families import _prompts

gguf = pytest.importorskip("gguf")
pytestmark = pytest.mark.skipif(not cpu_block_quant.available(),
                                reason="needs the C block-quant kernel")
CPU_QUANT_OPS = replace(TORCH_OPS, quantized_kernels=cpu_quantized_kernels())
MIX = {
    "token_embd.weight": "Q4_K", "output.weight": "Q6_K",
    "blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q4_K", "blk.0.attn_v.weight": "Q6_K",
    "blk.0.attn_output.weight": "Q4_K", "blk.0.ffn_gate.weight": "Q4_K",
    "blk.0.ffn_up.weight": "Q4_K", "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.attn_q.weight": "Q5_K", "blk.1.attn_k.weight": "Q5_0", "blk.1.attn_v.weight": "Q8_0",
    "blk.1.attn_output.weight": "Q3_K", "blk.1.ffn_gate.weight": "Q2_K",
    "blk.1.ffn_up.weight": "IQ4_XS", "blk.1.ffn_down.weight": "Q5_1",
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Inputs of 256 and 512: whole K-type blocks.
    return make_checkpoint(tmp_path_factory.mktemp("k-mix"), "llama", hidden_size=256,
                           intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def _tensor_bytes(path: Path) -> int:
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors)


def _logits(model, config) -> list[torch.Tensor]:
    return PagedHarness(model, config).step(list(_prompts(config.vocab_size).items()))


def test_a_k_quant_mix_runs_with_no_float_projection(checkpoint, tmp_path, caplog) -> None:
    path = write_gguf(tmp_path / "mix.gguf", checkpoint, qtype="Q4_K", qtypes=MIX)
    with caplog.at_level(logging.INFO):
        # int16 activations: within 1e-4 of the dequantized weights' product per layer, so
        # that a wrong code or scale anywhere shows (the int8 rounding is tested per type).
        quant, config = load_model(path, dtype="float32", kernel_ops=CPU_QUANT_OPS,
                                   quantized_activations="int16")
    plain, _ = load_model(path, dtype="float32", kernel_ops=CPU_QUANT_OPS, quantization="none")
    layers = [m for m in quant.modules() if isinstance(m, PackableLinear)]
    assert len(layers) == 4 * config.num_hidden_layers + 1
    assert all(m.weight is None and m.packed.activation_bits == 16 for m in layers)
    assert [m.packed.types for m in layers] == [
        ("Q4_K", "Q6_K"), ("Q4_K",), ("Q4_K",), ("Q6_K",),
        ("Q5_K", "Q5_0", "Q8_0"), ("Q3_K",), ("Q2_K", "IQ4_XS"), ("Q5_1",), ("Q6_K",)]
    assert "float (" not in caplog.text
    kernel = "block-quant-dot (C, int16 activations)"
    assert (f"quantization gguf: {kernel} Q2_K+IQ4_XS: 1 projection, {kernel} Q3_K: 1 "
            f"projection, {kernel} Q4_K: 2 projections, {kernel} Q4_K+Q6_K: 1 projection, "
            f"{kernel} Q5_1: 1 projection, {kernel} Q5_K+Q5_0+Q8_0: 1 projection, {kernel} "
            f"Q6_K: 2 projections, embedding looked up in Q4_K blocks; weights") in caplog.text
    assert quant.model.embed_tokens.weight is None
    for ours, ref in zip(_logits(quant, config), _logits(plain, config), strict=True):
        assert float((ours - ref).norm() / ref.norm()) < 1e-3
    assert weight_bytes(quant) <= 1.15 * _tensor_bytes(path)


def test_a_type_no_kernel_runs_stays_float_and_is_named(checkpoint, tmp_path, caplog) -> None:
    path = write_gguf(tmp_path / "iq2.gguf", checkpoint, qtype="Q4_K", random_blocks=True,
                      qtypes={"blk.0.attn_output.weight": "IQ2_XXS"})
    with caplog.at_level(logging.WARNING):
        model, _ = load_model(path, dtype="float32", kernel_ops=CPU_QUANT_OPS)
    assert model.model.layers[0].self_attn.o_proj.weight is not None
    assert ("GGUF projections dequantized to float: 1 float (IQ2_XXS); the quantized kernels "
            "here run Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, "
            "IQ4_XS") in caplog.text
