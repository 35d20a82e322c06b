"""The C block-quantized kernel (``cpu_block_quant.py``) against two references, for each GGUF
block type, on output counts that are not multiples of its 16-output groups and row counts
that are not multiples of its 8-row tiles, through the AVX-512 VNNI loop and the portable one:

- exactly (to float32 rounding) the activation quantized as the kernel quantizes it (int8 per
  block of 32, float16-rounded scale, round half to even; for a weight with mins, the block's
  sum rounded to float16) times the dequantized weight: the integer dot products and the
  block scales are right;
- within 1.5% the float activation times ``gguf.quants.dequantize`` of the file's blocks: what
  the int8 activations cost.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_block_quant, native_build
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import CPU_KERNELS, INT4_KERNEL, INT8_KERNEL
from pagedserve.kernels.quantized_linear import (
    choose_kernel,
    dequantize,
    quantize_int4,
    quantize_int8,
)
from pagedserve.server.models.gguf_repack import repack

gguf = pytest.importorskip("gguf")
T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(native_build.c_compiler() is None, reason="needs a C compiler")
PATHS = ["simd", "portable"]


@pytest.fixture(params=PATHS)
def path(request, monkeypatch) -> str:
    if request.param == "portable":
        monkeypatch.setenv(cpu_block_quant.ENV, "portable")
    elif not cpu_block_quant.uses_simd():
        pytest.skip("this machine's build has no AVX-512 VNNI loop")
    return request.param


@pytest.fixture(params=["int8", "int16"])
def activations(request) -> int:
    return cpu_block_quant.ACTIVATION_BITS[request.param]


def _kernel(bits: int):
    """The block-quant kernel quantizing activations to ``bits`` (--quantized-activations)."""
    (kernel,) = cpu_block_quant.with_activations([BLOCK_QUANT_KERNEL], f"int{bits}")
    return kernel


def _blocks(qtype, out: int, inp: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if qtype == T.Q4_K:  # gguf cannot quantize to Q4_K: random blocks with small d, dmin
        raw = rng.integers(0, 256, (out, inp // 256 * 144), dtype=np.uint8)
        blocks = raw.reshape(-1, 144)
        blocks[:, :4] = rng.uniform(0.001, 0.01, (blocks.shape[0], 2)).astype(
            np.float16).view(np.uint8)
        return raw
    return gguf.quants.quantize(rng.standard_normal((out, inp)).astype(np.float32), qtype)


def _as_quantized(x: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x with each block of 32 quantized as the kernel does (int8: float16-rounded scale;
    int16: float32 scale; round half to even), and back to float; and each block's sum as the
    kernel keeps it for a weight with mins (int8: rounded to float16, as GGUF's runtime)."""
    rows, k = x.shape
    top = 127 if bits == 8 else 32767
    blocks = F.pad(x, (0, -k % 32)).view(rows, -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    q = torch.round(blocks * torch.where(amax > 0, top / amax, 0))
    d = amax / top
    sums = q.sum(-1) * d[..., 0]
    if bits == 8:
        d, sums = d.half().float(), sums.half().float()
    return (q * d).view(rows, -1)[:, :k], sums


def _check(weight, reference: torch.Tensor, rows: int, seed: int, bits: int) -> None:
    x = torch.randn(rows, weight.in_features, generator=torch.Generator().manual_seed(seed))
    kernel = _kernel(bits)
    assert kernel.supports(weight, CPU)
    state = kernel.prepare(weight)
    assert state.activation_bits == bits
    y = kernel.linear(x, state, None)
    assert y.shape == (rows, weight.out_features) and y.dtype == torch.float32
    quantized, sums = _as_quantized(x, bits)
    if state.mins is None:
        exact = quantized.double() @ reference.double().T
    else:  # the codes' part from the quantized x, the mins' from the rounded block sums
        mins = weight.mins.repeat_interleave(32, dim=1)[:, : weight.in_features]
        exact = (quantized.double() @ (reference - mins).double().T
                 + sums.double() @ weight.mins.double().T)
    scale = exact.abs().amax(1, keepdim=True)
    # int16 sums pass 2^24 and cancel against the offsets' terms: float32 keeps 1e-5 of them.
    atol = 2e-6 if bits == 8 else 3e-5
    torch.testing.assert_close(y.double() / scale, exact / scale, rtol=0, atol=atol)
    plain = x.double() @ reference.double().T
    assert float((y.double() - plain).norm() / plain.norm()) < (0.015 if bits == 8 else 1e-4)


@pytest.mark.parametrize("rows", [1, 7, 33])
@pytest.mark.parametrize(("qtype", "out", "inp"), [(T.Q4_0, 33, 96), (T.Q4_1, 50, 160),
                                                   (T.Q8_0, 7, 64), (T.Q4_K, 17, 256)])
def test_gguf_blocks_match_their_dequantization(path, activations, qtype, out, inp,
                                                rows) -> None:
    raw = _blocks(qtype, out, inp, rows)
    weight = repack(int(qtype), raw, (out, inp))
    reference = torch.from_numpy(gguf.quants.dequantize(raw, qtype).copy())
    _check(weight, reference, rows, out, activations)


@pytest.mark.parametrize("rows", [1, 70])  # 70: two chunks of rows, a partial tile in each
@pytest.mark.parametrize(("scheme", "inp"), [("int4", 31), ("int8", 40)])
def test_float_weights_quantized_in_groups_of_32(path, activations, scheme, inp, rows) -> None:
    w = torch.randn(21, inp, generator=torch.Generator().manual_seed(inp))
    weight = quantize_int4(w, 32) if scheme == "int4" else quantize_int8(w, 32)
    _check(weight, dequantize(weight), rows, rows, activations)


def test_simd_and_portable_loops_agree(activations, monkeypatch) -> None:
    weight = repack(int(T.Q4_1), _blocks(T.Q4_1, 40, 128, 3), (40, 128))
    state = _kernel(activations).prepare(weight)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(1))
    simd = BLOCK_QUANT_KERNEL.linear(x, state, None)
    monkeypatch.setenv(cpu_block_quant.ENV, "portable")
    portable = BLOCK_QUANT_KERNEL.linear(x, state, None)
    assert simd.shape == (2, 3, 40)
    torch.testing.assert_close(simd, portable, rtol=1e-5, atol=1e-5)


def test_bias_and_the_callers_dtype() -> None:
    weight = repack(int(T.Q8_0), _blocks(T.Q8_0, 24, 64, 4), (24, 64))
    state = BLOCK_QUANT_KERNEL.prepare(weight)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(2))
    bias = torch.randn(24, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(BLOCK_QUANT_KERNEL.linear(x, state, bias),
                               BLOCK_QUANT_KERNEL.linear(x, state, None) + bias)
    y = BLOCK_QUANT_KERNEL.linear(x.bfloat16(), state, bias.bfloat16())
    assert y.dtype == torch.bfloat16


def test_memory_stays_near_the_files() -> None:
    out, inp = 64, 576
    for qtype, bound in ((T.Q4_1, 1.2), (T.Q8_0, 1.06), (T.Q4_0, 1.12)):
        raw = _blocks(qtype, out, inp, 5)
        state = BLOCK_QUANT_KERNEL.prepare(repack(int(qtype), raw, (out, inp)))
        assert BLOCK_QUANT_KERNEL.state_nbytes(state) <= bound * raw.nbytes, qtype.name
        assert (state.mins is None) == (qtype != T.Q4_1)


def test_dispatch_prefers_it_for_groups_of_32_only() -> None:
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
    assert choose_kernel(CPU_KERNELS, quantize_int4(w, 32), CPU) is BLOCK_QUANT_KERNEL
    assert choose_kernel(CPU_KERNELS, quantize_int8(w, 32), CPU) is BLOCK_QUANT_KERNEL
    assert choose_kernel(CPU_KERNELS, quantize_int8(w), CPU) is INT8_KERNEL  # per channel
    assert choose_kernel(CPU_KERNELS, quantize_int4(w, 64), CPU) is INT4_KERNEL


def test_without_the_c_build_torch_ops_take_over(monkeypatch) -> None:
    monkeypatch.setenv(cpu_block_quant.ENV, "off")
    cpu_block_quant._library.cache_clear()
    try:
        w = torch.randn(16, 64, generator=torch.Generator().manual_seed(0))
        assert choose_kernel(CPU_KERNELS, quantize_int4(w, 32), CPU) is INT4_KERNEL
    finally:
        monkeypatch.delenv(cpu_block_quant.ENV)
        cpu_block_quant._library.cache_clear()


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1, T.Q8_0])
def test_rows_are_looked_up_as_stored(qtype) -> None:
    weight = repack(int(qtype), _blocks(qtype, 37, 96, 6), (37, 96))
    state = BLOCK_QUANT_KERNEL.prepare(weight)
    ids = torch.tensor([0, 36, 17, 17, 5])
    rows = BLOCK_QUANT_KERNEL.lookup(state, ids, torch.float32)
    assert torch.equal(rows, dequantize(weight)[ids])


def test_activation_widths_are_checked_and_named() -> None:
    kernels = (BLOCK_QUANT_KERNEL, INT4_KERNEL)
    assert cpu_block_quant.with_activations(kernels, "int8") == kernels
    wide, torch_op = cpu_block_quant.with_activations(kernels, "int16")
    assert (wide.name, torch_op) == ("block-quant-dot (C, int16 activations)", INT4_KERNEL)
    with pytest.raises(ValueError, match="quantized activations must be one of int8, int16, "
                                         "got 'int4'"):
        cpu_block_quant.with_activations(kernels, "int4")
