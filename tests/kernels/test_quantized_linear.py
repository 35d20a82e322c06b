"""Quantized linear kernels against the dequantize-then-matmul reference, on shapes that are
not multiples of the group or of the int4 op's output tile, and the formats' own checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_block_quant
from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
from pagedserve.kernels.cpu_quantized_linear import (
    INT4_DENSE_ROWS,
    INT4_KERNEL,
    INT8_KERNEL,
    int4_dense_weight,
)
from pagedserve.kernels.dispatch import get_kernel_ops
from pagedserve.kernels.quantized_linear import (
    REFERENCE,
    QuantizationError,
    QuantizedWeight,
    choose_kernel,
    dequantize,
    pack_nibbles,
    quantize_int4,
    quantize_int8,
    reference_linear,
    unpack_nibbles,
)

CPU = torch.device("cpu")
SHAPES = [(16, 64), (33, 40), (50, 96), (7, 31)]  # [out, in]


def _weight(out: int, inp: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, inp, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize(("out", "inp"), SHAPES)
def test_int8_per_channel_round_trip_is_within_half_a_step(out: int, inp: int) -> None:
    w = _weight(out, inp)
    qw = quantize_int8(w)
    step = w.abs().amax(1, keepdim=True) / 127
    assert qw.num_groups == 1 and qw.qweight.dtype == torch.int8
    assert ((dequantize(qw) - w).abs() <= step / 2 + 1e-6).all()


@pytest.mark.parametrize(("out", "inp"), SHAPES)
def test_int4_round_trip_is_within_half_a_step_of_its_group(out: int, inp: int) -> None:
    w = _weight(out, inp)
    qw = quantize_int4(w, 32)
    assert qw.qweight.shape == (out, qw.padded_in_features // 2)
    steps = qw.scales.repeat_interleave(32, dim=1)[:, :inp]
    mins = qw.mins.repeat_interleave(32, dim=1)[:, :inp]
    assert torch.equal(qw.scales.half().float(), qw.scales)  # float16, as GGUF's Q4_1 stores
    assert torch.equal(qw.mins.half().float(), qw.mins)
    # codes chosen before scale and min are rounded to float16 (2^-11 of each, 15 steps)
    rounding = (mins.abs() + 15 * steps) * 2**-11
    assert ((dequantize(qw) - w).abs() <= steps / 2 + rounding + 1e-6).all()


def test_nibbles_pack_the_even_index_high() -> None:
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)
    assert pack_nibbles(codes).tolist() == [[0x12, 0xF0]]
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)


@pytest.mark.parametrize("rows", [1, 5])
@pytest.mark.parametrize(("out", "inp"), SHAPES)
def test_reference_is_f_linear_of_the_dequantized_weight(rows: int, out: int, inp: int) -> None:
    w, x, bias = _weight(out, inp), _weight(rows, inp, 1), _weight(1, out, 2)[0]
    qw = quantize_int4(w)
    assert torch.equal(reference_linear(x, qw, bias), F.linear(x, dequantize(qw), bias))


def _relative_error(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).norm() / ref.norm())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 9])
@pytest.mark.parametrize(("out", "inp"), SHAPES)
def test_int8_op_matches_reference(rows: int, out: int, inp: int, dtype: torch.dtype) -> None:
    qw = quantize_int8(_weight(out, inp))
    x, bias = _weight(rows, inp, 1).to(dtype), _weight(1, out, 2)[0].to(dtype)
    assert INT8_KERNEL.supports(qw, CPU)
    y = INT8_KERNEL.linear(x, INT8_KERNEL.prepare(qw), bias)
    ref = reference_linear(x.float(), qw, bias.float())
    assert y.dtype == dtype and y.shape == (rows, out)
    assert _relative_error(y.float(), ref) < 0.02


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 9])
@pytest.mark.parametrize(("out", "inp"), SHAPES)
@pytest.mark.parametrize("group", [32, 64])
def test_int4_op_matches_reference(rows: int, out: int, inp: int, group: int,
                                   dtype: torch.dtype) -> None:
    qw = quantize_int4(_weight(out, inp), group)
    x, bias = _weight(rows, inp, 1).to(dtype), _weight(1, out, 2)[0].to(dtype)
    assert INT4_KERNEL.supports(qw, CPU)
    y = INT4_KERNEL.linear(x, INT4_KERNEL.prepare(qw), bias)
    ref = reference_linear(x.float(), qw, bias.float())
    assert y.dtype == dtype and y.shape == (rows, out)
    assert _relative_error(y.float(), ref) < 0.02


@pytest.mark.parametrize(("out", "inp"), SHAPES)
def test_int4_many_rows_take_the_dense_path_and_match_reference(out: int, inp: int) -> None:
    qw = quantize_int4(_weight(out, inp))
    state = INT4_KERNEL.prepare(qw)
    dense = int4_dense_weight(state)[:out, :inp].float()
    torch.testing.assert_close(dense, dequantize(qw), atol=0.02, rtol=0.01)  # bf16 scales
    x = _weight(INT4_DENSE_ROWS + 5, inp, 1)
    y = INT4_KERNEL.linear(x, state, None)
    assert _relative_error(y, reference_linear(x, qw, None)) < 0.02


def test_int4_op_keeps_leading_dims() -> None:
    qw = quantize_int4(_weight(20, 40))
    x = _weight(6, 40, 1).reshape(2, 3, 40)
    y = INT4_KERNEL.linear(x, INT4_KERNEL.prepare(qw), None)
    assert y.shape == (2, 3, 20)
    assert _relative_error(y, reference_linear(x, qw, None)) < 0.02


def test_choice_follows_the_backend_and_the_format() -> None:
    int8_grouped = quantize_int8(_weight(16, 64), group_size=32)
    cpu_kernels = get_kernel_ops("cpu", "inductor").quantized_kernels
    built = cpu_block_quant.available()
    assert choose_kernel(cpu_kernels, quantize_int8(_weight(16, 64)), CPU) is INT8_KERNEL
    assert choose_kernel(cpu_kernels, quantize_int4(_weight(16, 64)), CPU) is (
        BLOCK_QUANT_KERNEL if built else INT4_KERNEL)
    assert choose_kernel(cpu_kernels, quantize_int4(_weight(16, 64), 64), CPU) is INT4_KERNEL
    # Per-group int8 runs only on the C kernel.
    assert choose_kernel(cpu_kernels, int8_grouped, CPU) is (
        BLOCK_QUANT_KERNEL if built else REFERENCE)
    assert choose_kernel(cpu_kernels, quantize_int4(_weight(16, 64), 16), CPU) is REFERENCE
    torch_kernels = get_kernel_ops("cpu", "torch").quantized_kernels
    assert choose_kernel(torch_kernels, quantize_int4(_weight(16, 64)), CPU) is REFERENCE


def test_kernel_state_is_smaller_than_float32() -> None:
    w = _weight(64, 128)
    int8, int4 = quantize_int8(w), quantize_int4(w)
    float_bytes = w.numel() * 4
    assert INT8_KERNEL.state_nbytes(INT8_KERNEL.prepare(int8)) < float_bytes / 3.5
    assert INT4_KERNEL.state_nbytes(INT4_KERNEL.prepare(int4)) < float_bytes / 5


def test_misshapen_parts_are_refused_by_name() -> None:
    qw = quantize_int4(_weight(8, 64))
    with pytest.raises(QuantizationError, match=r"needs qweight torch.uint8 \[8, 32\], got "
                                                r"torch.uint8 \[8, 16\]"):
        QuantizedWeight("int4", 8, 64, 32, qw.qweight[:, :16], qw.scales, qw.mins)
    with pytest.raises(QuantizationError, match="int4 weight has no mins"):
        QuantizedWeight("int4", 8, 64, 32, qw.qweight, qw.scales)
    with pytest.raises(QuantizationError, match=r"needs scales torch.float32 \[8, 2\]"):
        QuantizedWeight("int4", 8, 64, 32, qw.qweight, qw.scales.half(), qw.mins)
    with pytest.raises(QuantizationError, match="unknown quantization scheme 'int3'"):
        QuantizedWeight("int3", 8, 64, 32, qw.qweight, qw.scales)
