"""--quantization int8 / int4: a model whose projections are quantized at load computes what
the same model with the dequantized weights computes (bit for bit on the reference kernel,
closely on torch's int8/int4 CPU ops), tensor-parallel ranks quantize their own shards, and
a quantization that cannot apply is refused by name."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pagedserve.kernels import cpu_block_quant
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL, INT8_KERNEL
from pagedserve.kernels.dispatch import TORCH_OPS, cpu_quantized_kernels
from pagedserve.kernels.quantized_linear import REFERENCE, dequantize, quantize_int8
from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.model_load_error import ModelLoadError
from pagedserve.server.models.parallel_layers import PackableLinear
from pagedserve.server.models.quantized_linear import quantize_weight, weight_bytes
from tests.checkpoints import make_checkpoint
from tests.models.paged_harness import PagedHarness
from tests.models.test_model_families import _prompts

# The CPU ops with everything else on the reference: the quantized matmuls alone under test.
CPU_QUANT_OPS = replace(TORCH_OPS, quantized_kernels=cpu_quantized_kernels())
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
               "lm_head")


@pytest.fixture(scope="module")
def odd_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Hidden 48 and intermediate 72: no projection's input is a multiple of the group of 32
    or of 16, and no output of 16."""
    return make_checkpoint(tmp_path_factory.mktemp("quant-odd"), "llama", vocab_size=200,
                           hidden_size=48, intermediate_size=72, num_attention_heads=4,
                           num_key_value_heads=2, num_hidden_layers=2,
                           max_position_embeddings=256)


def _dequantized_copy(src: Path, dst: Path, scheme: str) -> Path:
    """``src`` with every projection replaced by its quantized-then-dequantized self: both
    formats group along the input dim, row by row, so quantizing q, k and v apart equals
    quantizing the merged QKV."""
    dst.mkdir(exist_ok=True)
    for item in src.iterdir():
        if item.suffix == ".safetensors":
            tensors = load_file(item)
            for name, tensor in tensors.items():
                if name.endswith(".weight") and name.split(".")[-2] in PROJECTIONS:
                    tensors[name] = dequantize(quantize_weight(tensor, scheme))
            save_file(tensors, dst / item.name, metadata={"format": "pt"})
        else:
            (dst / item.name).write_bytes(item.read_bytes())
    return dst


def _logits(model, config) -> list[torch.Tensor]:
    return PagedHarness(model, config).step(list(_prompts(config.vocab_size).items()))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_reference_kernel_is_bit_exact_with_the_dequantized_model(odd_checkpoint, tmp_path,
                                                                  scheme):
    float_dir = _dequantized_copy(odd_checkpoint, tmp_path / "dq", scheme)
    quant, config = load_model(odd_checkpoint, dtype="float32", kernel_ops=TORCH_OPS,
                               quantization=scheme)
    plain, _ = load_model(float_dir, dtype="float32", kernel_ops=TORCH_OPS)
    layers = [m for m in quant.modules() if isinstance(m, PackableLinear)]
    assert len(layers) == 4 * config.num_hidden_layers + 1
    assert all(m.weight is None and m.packing is REFERENCE for m in layers)
    for ours, theirs in zip(_logits(quant, config), _logits(plain, config), strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_greedy_tokens_equal_the_dequantized_models(odd_checkpoint, tmp_path, scheme):
    float_dir = _dequantized_copy(odd_checkpoint, tmp_path / "dq", scheme)
    prompts = [{"prompt_token_ids": p} for p in _prompts(200).values()]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)

    def tokens(path: Path, quantization: str | None) -> list[list[int]]:
        llm = LLM(str(path), dtype="float32", kernel_backend="torch", quantization=quantization,
                  skip_tokenizer_init=True, kv_cache_memory=1 << 20, max_model_len=64)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]

    assert tokens(odd_checkpoint, scheme) == tokens(float_dir, None)


# int4 in groups of 32 runs on the C kernel where it is built; per-channel int8 on torch's op.
INT4_GROUPED = BLOCK_QUANT_KERNEL if cpu_block_quant.available() else INT4_KERNEL


@pytest.mark.parametrize(("scheme", "kernel"), [("int8", INT8_KERNEL), ("int4", INT4_GROUPED)])
def test_cpu_ops_follow_the_reference(odd_checkpoint, scheme, kernel, caplog):
    with caplog.at_level(logging.INFO, logger="pagedserve.server.models.loader"):
        fast, config = load_model(odd_checkpoint, dtype="float32", kernel_ops=CPU_QUANT_OPS,
                                  quantization=scheme)
    reference, _ = load_model(odd_checkpoint, dtype="float32", kernel_ops=TORCH_OPS,
                              quantization=scheme)
    assert f"quantization {scheme}: {kernel.name}: 9 projections; weights" in caplog.text
    assert all(m.packing is kernel for m in fast.modules() if isinstance(m, PackableLinear))
    for ours, ref in zip(_logits(fast, config), _logits(reference, config), strict=True):
        assert float((ours - ref).norm() / ref.norm()) < 0.03


@pytest.mark.skipif(not cpu_block_quant.available(), reason="needs the C block-quant kernel")
def test_int16_activations_follow_the_reference_closer(odd_checkpoint, caplog):
    reference, config = load_model(odd_checkpoint, dtype="float32", kernel_ops=TORCH_OPS,
                                   quantization="int4")
    errors = {}
    for activations in ("int8", "int16"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pagedserve.server.models.loader"):
            model, _ = load_model(odd_checkpoint, dtype="float32", kernel_ops=CPU_QUANT_OPS,
                                  quantization="int4", quantized_activations=activations)
        name = "block-quant-dot (C)" if activations == "int8" else (
            "block-quant-dot (C, int16 activations)")
        assert f"quantization int4: {name}: 9 projections; weights" in caplog.text
        errors[activations] = max(
            float((ours - ref).norm() / ref.norm())
            for ours, ref in zip(_logits(model, config), _logits(reference, config), strict=True))
    assert errors["int16"] < 1e-3 < errors["int8"]


def test_weights_in_memory_shrink(llama_checkpoint):
    sizes = {}
    for scheme in ("none", "int8", "int4"):
        model, _ = load_model(llama_checkpoint, dtype="float32", kernel_ops=CPU_QUANT_OPS,
                              quantization=scheme)
        sizes[scheme] = weight_bytes(model)
    dense = sum(p.numel() * 4 for p in load_model(llama_checkpoint, dtype="float32",
                                                  kernel_ops=TORCH_OPS)[0].parameters())
    assert sizes["none"] == dense
    assert sizes["int4"] < sizes["int8"] < sizes["none"]


def test_a_shard_is_quantized_by_its_rank(llama_checkpoint):
    from pagedserve.server.models.parallel_group import TensorParallelGroup

    full, _ = load_model(llama_checkpoint, dtype="float32", kernel_ops=TORCH_OPS)
    down = full.model.layers[0].mlp.down_proj.weight.detach()
    for rank in range(2):
        group = TensorParallelGroup(rank=rank, world_size=2)
        model, _ = load_model(llama_checkpoint, dtype="float32", kernel_ops=TORCH_OPS,
                              group=group, quantization="int8")
        layer = model.model.layers[0].mlp.down_proj
        shard = down.chunk(2, dim=1)[rank]  # row-parallel: this rank's input columns
        assert torch.equal(dequantize(layer.packed), dequantize(quantize_int8(shard)))


def test_tensor_parallel_ranks_decode_as_one_rank(tmp_path_factory):
    from tests.distributed.thread_ranks import greedy_on_ranks

    # intermediate 128: each rank's down_proj input (64) is whole groups of 32.
    path = make_checkpoint(tmp_path_factory.mktemp("quant-tp"), "llama",
                           max_position_embeddings=512)
    prompts = list(_prompts(384).values())[:3]
    one = greedy_on_ranks(path, prompts, 8, world_size=1, quantization="int4")
    assert greedy_on_ranks(path, prompts, 8, world_size=2, quantization="int4") == one


def test_unknown_or_inapplicable_quantization_is_refused(llama_checkpoint):
    with pytest.raises(ModelLoadError, match="quantization must be one of none, gguf, int8, "
                                             "int4, got 'int3'"):
        load_model(llama_checkpoint, quantization="int3")
    with pytest.raises(ModelLoadError, match="quantization 'gguf' keeps the tensor types of a "
                                             "GGUF file"):
        load_model(llama_checkpoint, quantization="gguf")
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineArgs(quantization="fp4")
    with pytest.raises(ModelLoadError, match="quantized activations must be one of int8, "
                                             "int16, got 'int4'"):
        load_model(llama_checkpoint, quantization="int4", quantized_activations="int4")
    with pytest.raises(ValueError, match="quantized_activations must be one of int8, int16, "
                                         "got 'fp8'"):
        EngineArgs(quantized_activations="fp8")


def test_a_quantized_weight_of_another_shape_is_refused():
    layer = PackableLinear()
    layer.weight = torch.nn.Parameter(torch.zeros(8, 64))
    with pytest.raises(ModelLoadError, match=r"a quantized weight of shape \[8, 32\] does not "
                                             r"fit a projection of shape \[8, 64\]"):
        layer.quantize(quantize_int8(torch.ones(8, 32)), REFERENCE)


def test_the_flag_reaches_the_engine_args():
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    assert EngineArgs.from_cli_args(parser.parse_args([])).quantization is None
    args = EngineArgs.from_cli_args(parser.parse_args(["--quantization", "int4"]))
    assert args.quantization == "int4"
    assert args.quantized_activations == "int8"
    wide = parser.parse_args(["--quantization", "gguf", "--quantized-activations", "int16"])
    assert EngineArgs.from_cli_args(wide).quantized_activations == "int16"
    with pytest.raises(SystemExit):
        parser.parse_args(["--quantization", "fp8"])
