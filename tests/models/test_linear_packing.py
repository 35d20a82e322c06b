"""Linear layers prepacked for oneDNN (the CPU backend's ``linear_packing``): same logits as
transformers, the dense weights released, and nothing packed where the backend cannot."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_linear
from pagedserve.kernels.dispatch import TORCH_OPS, LinearPacking, get_kernel_ops
from pagedserve.server.models.loader import load_model
from pagedserve.server.models.parallel_layers import PackableLinear, pack_linear_layers
from tests.models.paged_harness import PagedHarness, hf_logits
from tests.models.test_model_families import ATOL, _prompts

PACKING = LinearPacking(cpu_linear.supports, cpu_linear.pack_weight, cpu_linear.linear)
# The reference attention with packed projections: the packing alone under test.
PACKED_OPS = dataclasses.replace(TORCH_OPS, linear_packing=PACKING)

pytestmark = pytest.mark.skipif(not cpu_linear.supports(torch.float32),
                                reason="this torch build has no oneDNN linear")


def _projections(model: torch.nn.Module) -> list[PackableLinear]:
    return [m for m in model.modules() if isinstance(m, PackableLinear)]


def test_packed_model_matches_transformers(family_checkpoint):
    from tests.checkpoints import load_hf_model

    model, config = load_model(family_checkpoint, dtype="float32", kernel_ops=PACKED_OPS)
    prompts = _prompts(config.vocab_size)
    logits = PagedHarness(model, config).step(list(prompts.items()))
    hf = load_hf_model(family_checkpoint)
    for (seq, prompt), ours in zip(prompts.items(), logits, strict=True):
        torch.testing.assert_close(ours, hf_logits(hf, prompt), atol=ATOL, rtol=0, msg=str(seq))


def test_every_projection_is_packed_and_its_dense_weight_released(llama_checkpoint):
    model, config = load_model(llama_checkpoint, dtype="float32", kernel_ops=PACKED_OPS)
    layers = _projections(model)
    # qkv, o, gate_up, down per layer, and the head.
    assert len(layers) == 4 * config.num_hidden_layers + 1
    assert all(layer.weight is None and layer.packed.is_mkldnn for layer in layers)
    assert model.model.embed_tokens.weight.shape == (config.vocab_size, config.hidden_size)
    assert (model.dtype, model.device.type) == (torch.float32, "cpu")


def test_tied_head_keeps_the_embedding_dense(opt_checkpoint):
    model, config = load_model(opt_checkpoint, dtype="float32", kernel_ops=PACKED_OPS)
    assert config.tie_word_embeddings
    assert model.lm_head.weight is None and model.lm_head.packed is not None
    embedding = model.model.decoder.embed_tokens.weight
    hidden = torch.randn(3, embedding.shape[1])
    torch.testing.assert_close(model.compute_logits(hidden), hidden @ embedding.T,
                               atol=1e-5, rtol=1e-5)


def test_nothing_is_packed_for_a_dtype_the_backend_refuses(llama_checkpoint):
    refusing = dataclasses.replace(PACKING, supports=lambda dtype: False)
    model, _ = load_model(llama_checkpoint, dtype="float32", kernel_ops=TORCH_OPS)
    assert pack_linear_layers(model, refusing) == 0
    assert pack_linear_layers(model, None) == 0
    assert all(layer.weight is not None and layer.packed is None
               for layer in _projections(model))


def test_weights_below_the_threshold_stay_dense_and_the_logits_still_match(llama_checkpoint):
    from tests.checkpoints import load_hf_model

    model, config = load_model(llama_checkpoint, dtype="float32", kernel_ops=TORCH_OPS)
    layers = _projections(model)
    sizes = {id(layer): layer.weight.numel() for layer in layers}
    threshold = sorted(set(sizes.values()))[-2]  # the two largest sizes pack, the rest not
    expected = [layer for layer in layers if sizes[id(layer)] >= threshold]
    assert 0 < len(expected) < len(layers)
    packing = dataclasses.replace(PACKING, worth_packing=lambda w: w.numel() >= threshold)
    assert pack_linear_layers(model, packing) == len(expected)
    for layer in layers:
        if sizes[id(layer)] >= threshold:
            assert layer.weight is None and layer.packed.is_mkldnn
        else:
            assert layer.packed is None and layer.weight.numel() == sizes[id(layer)]
    prompts = _prompts(config.vocab_size)
    logits = PagedHarness(model, config).step(list(prompts.items()))
    hf = load_hf_model(llama_checkpoint)
    for (seq, prompt), ours in zip(prompts.items(), logits, strict=True):
        torch.testing.assert_close(ours, hf_logits(hf, prompt), atol=ATOL, rtol=0, msg=str(seq))


@pytest.mark.parametrize(("dtype", "shape", "packed"), [
    (torch.float32, (256, 255), False),
    (torch.float32, (256, 256), True),
    (torch.bfloat16, (8, 8), True),
])
def test_the_cpu_backend_packs_small_weights_only_in_bfloat16(dtype, shape, packed):
    worth = get_kernel_ops("cpu", "cpu").linear_packing.worth_packing
    assert worth(torch.zeros(shape, dtype=dtype)) is packed


def test_only_the_cpu_backend_packs():
    assert get_kernel_ops("cpu", "torch").linear_packing is None
    assert get_kernel_ops("cpu", "inductor").linear_packing is not None


@pytest.mark.parametrize("rows", [0, 1, 7, 64])
@pytest.mark.parametrize("with_bias", [False, True])
def test_packed_linear_equals_f_linear(rows, with_bias):
    gen = torch.Generator().manual_seed(rows)
    weight = torch.randn(96, 40, generator=gen)
    bias = torch.randn(96, generator=gen) if with_bias else None
    x = torch.randn(rows, 40, generator=gen)
    out = cpu_linear.linear(x, cpu_linear.pack_weight(weight), bias)
    torch.testing.assert_close(out, F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)


def test_packed_linear_takes_views_and_leading_dims():
    gen = torch.Generator().manual_seed(1)
    weight, x = torch.randn(24, 16, generator=gen), torch.randn(2, 5, 32, generator=gen)
    view = x[..., ::2]  # strided last dim
    out = cpu_linear.linear(view, cpu_linear.pack_weight(weight), None)
    torch.testing.assert_close(out, F.linear(view, weight), atol=1e-5, rtol=1e-5)


def test_supports_refuses_dtypes_onednn_has_no_linear_for():
    assert cpu_linear.supports(torch.float32)
    assert not cpu_linear.supports(torch.float64)
    assert not cpu_linear.supports(torch.int8)
