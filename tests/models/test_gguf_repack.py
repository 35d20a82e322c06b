"""GGUF blocks repacked to int8/int4 dequantize to exactly what ``gguf.quants.dequantize``
gives, bytes that do not fit their shape are refused by name, and a GGUF file loaded with
``--quantization gguf`` runs its quantized projections on the int4/int8 kernels, within
rounding of the same file dequantized, in less memory than the file."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pagedserve.kernels import cpu_block_quant
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL, INT8_KERNEL
from pagedserve.kernels.dispatch import TORCH_OPS, cpu_quantized_kernels
from pagedserve.kernels.quantized_linear import REFERENCE, QuantizationError, dequantize
from pagedserve.server.models.gguf_repack import repack
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.parallel_group import TensorParallelGroup
from pagedserve.server.models.parallel_layers import PackableLinear
from pagedserve.server.models.quantized_linear import weight_bytes
from tests.checkpoints import make_checkpoint
from tests.gguf_files import write_gguf
from tests.models.paged_harness import PagedHarness
from tests.models.test_model_families import _prompts

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
CPU_QUANT_OPS = replace(TORCH_OPS, quantized_kernels=cpu_quantized_kernels())
# Blocks of 32 run on the C kernel where it is built, else on torch's ops (Q8_0 rescaled).
BUILT = cpu_block_quant.available()
Q4_1_KERNEL = BLOCK_QUANT_KERNEL if BUILT else INT4_KERNEL
Q8_0_KERNEL = BLOCK_QUANT_KERNEL if BUILT else INT8_KERNEL


def _random_k_blocks(rows: int, inp: int, seed: int) -> np.ndarray:
    """Q4_K rows of random bytes with small float16 d and dmin (gguf cannot quantize to Q4_K)."""
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, inp // 256 * 144), dtype=np.uint8)
    blocks = raw.reshape(-1, 144)
    blocks[:, :4] = rng.uniform(0.001, 0.01, (blocks.shape[0], 2)).astype(np.float16).view(
        np.uint8)
    return raw


@pytest.mark.parametrize(("qtype", "inp"), [(T.Q8_0, 96), (T.Q4_0, 64), (T.Q4_1, 160),
                                            (T.Q4_K, 512)])
def test_repack_dequantizes_as_gguf_does(qtype, inp) -> None:
    rows = 7
    if qtype == T.Q4_K:
        raw = _random_k_blocks(rows, inp, 0)
    else:
        w = np.random.default_rng(0).standard_normal((rows, inp)).astype(np.float32)
        raw = gguf.quants.quantize(w, qtype)
    weight = repack(int(qtype), raw, (rows, inp))
    assert weight.scheme == ("int8" if qtype == T.Q8_0 else "int4")
    assert torch.equal(dequantize(weight), torch.tensor(gguf.quants.dequantize(raw, qtype)))


def test_repacked_int4_runs_on_the_cpu_op() -> None:
    w = np.random.default_rng(1).standard_normal((40, 96)).astype(np.float32)
    weight = repack(int(T.Q4_1), gguf.quants.quantize(w, T.Q4_1), (40, 96))
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(0))
    ref = x @ dequantize(weight).T
    y = INT4_KERNEL.linear(x, INT4_KERNEL.prepare(weight), None)
    assert float((y - ref).norm() / ref.norm()) < 0.02


def test_bytes_that_do_not_fit_the_shape_are_refused() -> None:
    raw = gguf.quants.quantize(np.ones((4, 64), dtype=np.float32), T.Q4_1)
    with pytest.raises(QuantizationError, match=r"Q4_1 tensor of shape \[4, 96\] needs 240 "
                                                r"bytes, got 160"):
        repack(int(T.Q4_1), raw, (4, 96))
    with pytest.raises(QuantizationError, match=r"Q8_0 tensor of shape \[4, 40\]: 40 inputs "
                                                r"are not a whole number of its blocks of 32"):
        repack(int(T.Q8_0), raw, (4, 40))


@pytest.fixture(scope="module")
def tied_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tied llama (as SmolLM2 is) with every 2-D weight in Q4_1, and in Q8_0."""
    root = tmp_path_factory.mktemp("gguf-quant")
    checkpoint = make_checkpoint(root / "ckpt", "llama", tie_word_embeddings=True)
    return {q: write_gguf(root / f"{q}.gguf", checkpoint, qtype=q) for q in ("Q4_1", "Q8_0")}


def _logits(model, config) -> list[torch.Tensor]:
    return PagedHarness(model, config).step(list(_prompts(config.vocab_size).items()))


@pytest.mark.parametrize(("qtype", "kernel"), [("Q4_1", Q4_1_KERNEL), ("Q8_0", Q8_0_KERNEL)])
def test_gguf_projections_run_as_stored(tied_files, qtype, kernel, caplog) -> None:
    path = tied_files[qtype]
    with caplog.at_level(logging.INFO, logger="pagedserve.server.models.loader"):
        quant, config = load_model(path, dtype="float32", kernel_ops=CPU_QUANT_OPS)
    assert "quantization gguf: " in caplog.text  # the default for a GGUF file
    plain, _ = load_model(path, dtype="float32", kernel_ops=CPU_QUANT_OPS, quantization="none")
    layers = [m for m in quant.modules() if isinstance(m, PackableLinear)]
    assert len(layers) == 4 * config.num_hidden_layers + 1
    assert all(m.weight is None and m.packing is kernel for m in layers)
    embedding = quant.model.embed_tokens
    assert embedding.weight is None and embedding.quantized is not None
    for ours, ref in zip(_logits(quant, config), _logits(plain, config), strict=True):
        assert float((ours - ref).norm() / ref.norm()) < 0.03
    # Within the bound of 1.3x the file (scales are held in float32 and bfloat16).
    assert weight_bytes(quant) <= 1.3 * path.stat().st_size < weight_bytes(plain)


def test_without_a_kernel_every_weight_is_dequantized(tied_files) -> None:
    path = tied_files["Q4_1"]
    quant, config = load_model(path, dtype="float32", kernel_ops=TORCH_OPS, quantization="gguf")
    plain, _ = load_model(path, dtype="float32", kernel_ops=TORCH_OPS, quantization="none")
    assert all(m.weight is not None for m in quant.modules() if isinstance(m, PackableLinear))
    for ours, ref in zip(_logits(quant, config), _logits(plain, config), strict=True):
        assert torch.equal(ours, ref)


def test_each_rank_keeps_the_blocks_of_its_shard(tied_files) -> None:
    # A kernel that takes every format and keeps the weight as given: the shard is readable.
    keep = replace(REFERENCE, name="keep", supports=lambda weight, device: True)
    ops = replace(TORCH_OPS, quantized_kernels=(keep,))
    path = tied_files["Q4_1"]
    for rank in range(2):
        group = TensorParallelGroup(rank=rank, world_size=2)
        quant, _ = load_model(path, dtype="float32", kernel_ops=ops, group=group)
        plain, _ = load_model(path, dtype="float32", kernel_ops=ops, group=group,
                              quantization="none")
        quantized = dict(quant.named_modules())
        for name, layer in plain.named_modules():
            if isinstance(layer, PackableLinear):
                assert torch.equal(dequantize(quantized[name].packed), layer.weight), name


def test_int8_and_int4_apply_to_a_gguf_file_too(tied_files) -> None:
    model, _ = load_model(tied_files["Q8_0"], dtype="float32", kernel_ops=CPU_QUANT_OPS,
                          quantization="int4")
    assert all(m.packing is Q4_1_KERNEL for m in model.modules()
               if isinstance(m, PackableLinear))
