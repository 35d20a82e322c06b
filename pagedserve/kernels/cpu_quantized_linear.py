"""Quantized matmuls on the CPU through torch's own weight-only ops, which read the weight as
stored (1 or 1/2 byte a weight) and widen it in registers:

- ``aten._weight_int8pack_mm``: int8 weight, one scale per output channel; its bfloat16 path
  reads past the end of a row whose length is not a multiple of 16 (wrong sums, or a crash),
  so the input dim is padded with zero columns to one.
- ``aten._weight_int4pack_mm_for_cpu``: int4 weight repacked once by
  ``aten._convert_weight_to_int4pack_for_cpu``, one (scale, zero) pair per group of 32, 64,
  128 or 256 inputs, ``w = (q - 8) * scale + zero``; the output dim padded to a multiple of 64
  (for such a dim the packed layout is [out / 64, in, 32] bytes, the low nibbles holding
  outputs 0-31 of each block of 64 and the high nibbles 32-63).

The int4 op re-widens the weight for every few rows, so its cost grows with the rows: from
``INT4_DENSE_ROWS`` rows on (a prefill chunk) the weight is widened once into a transient
bfloat16 copy for oneDNN's GEMM instead (measured 1.7x faster at 512 rows for 576 x 1536,
about even at 384 for 3072 x 576; the op wins below).

Both run their vectorised paths for bfloat16 activations only (float32 and float16 activations
take a scalar loop, ten times slower or worse at every shape measured by
``benchmarks/quantized_linear.py``), so a call casts the activation to bfloat16 and the result
back to the caller's dtype. bfloat16 keeps 8 significant bits: results match the reference to
about 1% of each output's magnitude, not bit for bit.

Weights in groups of 32 (GGUF's Q8_0, Q4_0, Q4_1, Q4_K, and ``--quantization int4``) run first
on the C kernel of ``cpu_block_quant.py`` where it is built (measured 2-4x faster than the int4
op at every row count of ``benchmarks/quantized_linear.py``, and closer to float32); these ops
take the rest, and everything when no C compiler is present.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pagedserve.kernels.quantized_linear import QuantizedWeight, QuantKernel, unpack_nibbles

COMPUTE_DTYPE = torch.bfloat16
INT4_GROUP_SIZES = (32, 64, 128, 256)
INT4_OUT_MULTIPLE = 64
INT4_DENSE_ROWS = 384
INT4_INNER_K_TILES = 2
INT8_IN_MULTIPLE = 16


def _has_op(name: str) -> bool:
    return hasattr(torch.ops.aten, name)


@dataclass(frozen=True, slots=True)
class _Int8State:
    qweight: torch.Tensor  # int8 [out, padded_in]
    scales: torch.Tensor  # bfloat16 [out]
    in_features: int
    padded_in: int


def _int8_supports(qw: QuantizedWeight, device: torch.device) -> bool:
    return (device.type == "cpu" and isinstance(qw, QuantizedWeight) and qw.scheme == "int8"
            and qw.num_groups == 1 and _has_op("_weight_int8pack_mm"))


def _int8_prepare(qw: QuantizedWeight) -> _Int8State:
    k = qw.in_features
    pad = -k % INT8_IN_MULTIPLE
    # Without padding the codes are used in place (a tied embedding may share them).
    padded = F.pad(qw.qweight[:, :k], (0, pad)).contiguous() if pad else qw.qweight
    return _Int8State(padded, qw.scales[:, 0].to(COMPUTE_DTYPE).contiguous(), k,
                      padded.shape[1])


def _pad_rows(x: torch.Tensor, in_features: int, padded_in: int) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1]).to(COMPUTE_DTYPE)
    return rows if padded_in == in_features else F.pad(rows, (0, padded_in - in_features))


def _int8_linear(x: torch.Tensor, state: _Int8State, bias: torch.Tensor | None) -> torch.Tensor:
    rows = _pad_rows(x, state.in_features, state.padded_in)
    y = torch.ops.aten._weight_int8pack_mm(rows, state.qweight, state.scales)
    y = y.to(x.dtype).reshape(*x.shape[:-1], -1)
    return y if bias is None else y + bias


def _int8_nbytes(state: _Int8State) -> int:
    return _bytes(state.qweight) + _bytes(state.scales)


@dataclass(frozen=True, slots=True)
class _Int4State:
    packed: torch.Tensor  # the op's own layout
    scale_zeros: torch.Tensor  # bfloat16 [groups, out_padded, 2]
    group_size: int
    in_features: int
    padded_in: int
    out_features: int


def _int4_supports(qw: QuantizedWeight, device: torch.device) -> bool:
    return (device.type == "cpu" and isinstance(qw, QuantizedWeight) and qw.scheme == "int4"
            and qw.group_size in INT4_GROUP_SIZES and _has_op("_weight_int4pack_mm_for_cpu"))


def _int4_prepare(qw: QuantizedWeight) -> _Int4State:
    pad_out = -qw.out_features % INT4_OUT_MULTIPLE
    codes = F.pad(unpack_nibbles(qw.qweight).to(torch.int32), (0, 0, 0, pad_out))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INT4_INNER_K_TILES)
    # The op's zero is the value of code 8: min + 8 * scale.
    zeros = qw.mins + 8 * qw.scales
    pairs = torch.stack([qw.scales, zeros], dim=-1)  # [out, groups, 2]
    pairs = F.pad(pairs, (0, 0, 0, 0, 0, pad_out)).transpose(0, 1)
    return _Int4State(packed, pairs.to(COMPUTE_DTYPE).contiguous(), qw.group_size,
                      qw.in_features, qw.padded_in_features, qw.out_features)


def _int4_linear(x: torch.Tensor, state: _Int4State, bias: torch.Tensor | None) -> torch.Tensor:
    rows = _pad_rows(x, state.in_features, state.padded_in)
    if rows.shape[0] >= INT4_DENSE_ROWS:
        y = F.linear(rows, int4_dense_weight(state))
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, state.packed, state.group_size,
                                                       state.scale_zeros)
    if y.shape[-1] != state.out_features:
        y = y[:, : state.out_features]
    y = y.to(x.dtype).reshape(*x.shape[:-1], state.out_features)
    return y if bias is None else y + bias


def int4_dense_weight(state: _Int4State) -> torch.Tensor:
    """The bfloat16 weight [out_padded, in_padded] that the op's packed layout holds."""
    out, k = state.scale_zeros.shape[1], state.padded_in
    blocks = state.packed.view(out // 64, k, 32)
    codes = torch.cat([blocks & 15, blocks >> 4], dim=2).transpose(1, 2).reshape(out, -1)
    scales = state.scale_zeros[..., 0].t()[:, :, None]
    zeros = state.scale_zeros[..., 1].t()[:, :, None]
    grouped = codes.view(out, -1, state.group_size).to(COMPUTE_DTYPE)
    return ((grouped - 8) * scales + zeros).view(out, k)


def _int4_nbytes(state: _Int4State) -> int:
    return _bytes(state.packed) + _bytes(state.scale_zeros)


def _bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


INT8_KERNEL = QuantKernel("aten._weight_int8pack_mm", _int8_supports, _int8_prepare,
                          _int8_linear, _int8_nbytes)
INT4_KERNEL = QuantKernel("aten._weight_int4pack_mm_for_cpu", _int4_supports, _int4_prepare,
                          _int4_linear, _int4_nbytes)
