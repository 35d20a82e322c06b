"""Quantized matmuls on the CPU in C (``csrc/block_quant_matmul.c``) for weights in groups of 32
inputs: GGUF's Q8_0 (int8), Q4_0, Q4_1 and Q4_K (int4, one scale and min per 32), and a float
checkpoint quantized to int4 at load.

Computed as GGUF's own CPU runtime computes them, with one choice: each activation row is
quantized per block of 32 to integers, one integer dot product per (weight block, activation
block), the file's scales (float16, held exactly in float32) applied in float32.

- int8 activations (the default), rounded as that runtime rounds them (a float16 scale,
  float16 block sums for weights with mins): about 0.5% of each output. A layer's output
  matches an emulation of llama.cpp's own q8_1 x Q4_1 dot product to 1e-7. Greedy tokens
  agree with llama.cpp's on SmolLM2's Q4_1 file (``benchmarks/quantized_agreement.py``, 518
  prompts, 32 tokens, float32) for a median of 13 leading tokens (95% interval 11-16);
  float32 dequantization 15 (12-19), and llama.cpp's own Q4_1 run against llama.cpp on the
  same weights in F32 16 (13-19): two engines that round differently part ways after a
  dozen tokens on this model, while the float engines agree (median 32, 486 of 518 equal).
- int16 activations (``--quantized-activations int16``, :func:`with_activations`): 2e-5 of
  each output from the float32 product of the dequantized weight; greedy agreement as float32
  dequantization's, about twice the compute of int8 (VNNI's 16-bit dot products take 2 inputs
  a lane).

Both are closer than torch's int4 op, which rounds activations, scales and mins to bfloat16.

The weight is repacked once at load into the kernel's layout (groups of 16 output rows,
chunks of 4 inputs): 4-bit codes take 0.75 bytes an input with their scale and min (Q4_1's
file takes 0.625), 8-bit 1.125 (Q8_0: 1.0625); a Q4_0 weight, whose min is always -8 times its
scale, stores no mins.

Without a C compiler (or with ``PAGEDSERVE_BLOCK_QUANT=off``) the kernel declines every weight
and the dispatch falls back to torch's ops (``cpu_quantized_linear.py``).
``PAGEDSERVE_BLOCK_QUANT=portable`` runs the portable C loop instead of the AVX-512 VNNI one.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.kernels import cpu_parallel
from pagedserve.kernels.native_build import NativeBuildError, load_library
from pagedserve.kernels.quantized_linear import QuantizedWeight, QuantKernel, unpack_nibbles

logger = logging.getLogger(__name__)

GROUP_SIZE = 32
GROUP_OUT = 16  # outputs a vector register holds
ENV = "PAGEDSERVE_BLOCK_QUANT"
# --quantized-activations: the integer width each activation block is quantized to.
ACTIVATION_BITS = {"int8": 8, "int16": 16}
# min factor of a weight stored without mins: int8 codes are offset by 128, Q4_0's min is -8d.
INT8_FACTOR, Q4_0_FACTOR = -128.0, -8.0
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_ARGTYPES = [_P, _I, _I, _I, _P, _P, _P, _F, _I, _I, _I, _P, _I, _I, _I, _I]


@functools.cache
def _library() -> ctypes.CDLL | None:
    if os.environ.get(ENV, "").lower() == "off":
        return None
    try:
        library = load_library("block_quant_matmul")
    except (NativeBuildError, OSError) as exc:
        logger.warning("block-quantized C kernel unavailable, using torch's ops: %s", exc)
        return None
    library.block_quant_linear.argtypes = _ARGTYPES
    library.block_quant_linear.restype = None
    library.block_quant_has_simd.restype = ctypes.c_int
    return library


def available() -> bool:
    return _library() is not None


def uses_simd() -> bool:
    """Whether calls run the AVX-512 VNNI loop (built for this machine, not turned off)."""
    library = _library()
    return (library is not None and bool(library.block_quant_has_simd())
            and os.environ.get(ENV, "").lower() != "portable")


@dataclass(frozen=True, slots=True)
class BlockQuantState:
    codes: torch.Tensor  # uint8, the kernel's tiled layout
    scales: torch.Tensor  # float32 [out_padded / 16, blocks, 16]
    mins: torch.Tensor | None  # float32 like scales; None: scales * factor
    factor: float  # of the mins, or of the scales where there are none
    bits: int
    in_features: int
    out_features: int
    activation_bits: int = 8


def _supports(qw: QuantizedWeight, device: torch.device) -> bool:
    return (device.type == "cpu" and qw.group_size == GROUP_SIZE
            and qw.scheme in ("int8", "int4") and available())


def _padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return F.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


def _tiled(codes: torch.Tensor) -> torch.Tensor:
    """[out_padded, in_padded] codes -> [groups, blocks, chunks of 4 inputs, 16 outputs, 4]."""
    n_pad, k_pad = codes.shape
    return codes.view(n_pad // GROUP_OUT, GROUP_OUT, k_pad // GROUP_SIZE, 8, 4).permute(
        0, 2, 3, 1, 4)


def _prepare(qw: QuantizedWeight, activation_bits: int = 8) -> BlockQuantState:
    n_pad = -(-qw.out_features // GROUP_OUT) * GROUP_OUT
    k_pad = qw.padded_in_features
    blocks = k_pad // GROUP_SIZE
    scales = _grouped_scales(qw.scales, n_pad)
    if qw.scheme == "int8":
        codes = _tiled(_padded(qw.qweight, n_pad, k_pad).view(torch.uint8) ^ 0x80)
        mins, factor, bits = None, INT8_FACTOR, 8
    else:
        tiled = _tiled(_padded(unpack_nibbles(qw.qweight), n_pad, k_pad))
        codes = tiled[:, :, 0::2] | (tiled[:, :, 1::2] << 4)
        assert qw.mins is not None
        if torch.equal(qw.mins, Q4_0_FACTOR * qw.scales):
            mins, factor = None, Q4_0_FACTOR
        else:
            mins, factor = _grouped_scales(qw.mins, n_pad), 1.0
        bits = 4
    assert blocks * GROUP_SIZE == k_pad
    return BlockQuantState(codes.contiguous().view(-1), scales, mins, factor, bits,
                           qw.in_features, qw.out_features, activation_bits)


def _grouped_scales(t: torch.Tensor, n_pad: int) -> torch.Tensor:
    """[out, blocks] -> [groups, blocks, 16] float32."""
    t = _padded(t, n_pad, t.shape[1])
    return t.view(n_pad // GROUP_OUT, GROUP_OUT, -1).transpose(1, 2).contiguous()


def _linear(x: torch.Tensor, state: BlockQuantState, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).to(torch.float32)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    m, n = rows.shape[0], state.out_features
    y = torch.empty(m, n, dtype=torch.float32)
    k_pad = state.scales.shape[1] * GROUP_SIZE
    threads = cpu_parallel.threads_for(m * n * state.in_features // 16)
    _library().block_quant_linear(
        rows.data_ptr(), rows.stride(0), m, state.in_features, state.codes.data_ptr(),
        state.scales.data_ptr(), None if state.mins is None else state.mins.data_ptr(),
        state.factor, state.bits, n, k_pad, y.data_ptr(), n, threads, int(uses_simd()),
        state.activation_bits)
    y = y.to(x.dtype).reshape(*x.shape[:-1], n)
    return y if bias is None else y + bias


def _nbytes(state: BlockQuantState) -> int:
    parts = [state.codes, state.scales] + ([state.mins] if state.mins is not None else [])
    return sum(p.numel() * p.element_size() for p in parts)


def _lookup(state: BlockQuantState, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Output rows ``ids`` of the weight, dequantized: w = u d + factor M."""
    groups, blocks, _ = state.scales.shape
    group, lane = ids // GROUP_OUT, ids % GROUP_OUT
    if state.bits == 8:
        packed = state.codes.view(groups, blocks, 8, GROUP_OUT, 4)[group, :, :, lane]
        codes = packed.reshape(len(ids), blocks, GROUP_SIZE)
    else:
        packed = state.codes.view(groups, blocks, 4, GROUP_OUT, 4)[group, :, :, lane]
        codes = torch.stack([packed & 15, packed >> 4], dim=3).reshape(len(ids), blocks,
                                                                         GROUP_SIZE)
    scales = state.scales[group, :, lane]
    offsets = (state.scales if state.mins is None else state.mins)[group, :, lane]
    w = codes.float() * scales[..., None] + state.factor * offsets[..., None]
    return w.reshape(len(ids), -1)[:, : state.in_features].to(dtype)


BLOCK_QUANT_KERNEL = QuantKernel("block-quant-dot (C)", _supports, _prepare, _linear, _nbytes,
                                 _lookup)


def with_activations(kernels: Iterable[QuantKernel], activations: str) -> tuple[QuantKernel, ...]:
    """``kernels`` with the block-quant kernel quantizing activations to ``activations``
    (``int8``, its default, or ``int16``); the other kernels as they are."""
    if activations not in ACTIVATION_BITS:
        raise ValueError(f"quantized activations must be one of {', '.join(ACTIVATION_BITS)}, "
                         f"got {activations!r}")
    if activations == "int8":
        return tuple(kernels)
    variant = dataclasses.replace(
        BLOCK_QUANT_KERNEL, name=f"block-quant-dot (C, {activations} activations)",
        prepare=functools.partial(_prepare, activation_bits=ACTIVATION_BITS[activations]))
    return tuple(variant if kernel is BLOCK_QUANT_KERNEL else kernel for kernel in kernels)
