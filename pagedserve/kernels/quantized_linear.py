"""Weight-only quantized linear layers: the stored formats, quantization of a float weight, and
the reference kernel (dequantize, then ``F.linear``) that every faster kernel must match.

Two formats, both along the input dim in groups (GGUF's blocks are groups of 32):

- ``int8``: symmetric, ``w = q * scale``; q int8 [out, in_padded], one scale per group
  (``group_size == in_features`` is one scale per output channel).
- ``int4``: asymmetric, ``w = q * scale + min`` with q in 0..15 (GGUF's Q4_1; Q4_0 is
  ``min = -8 * scale``); two q a byte, the even input index in the high nibble.

An input dim that is not a multiple of the group is padded with zero codes up to one: the
matmul pads the activation with zeros too, so the padding adds nothing (an int4 zero code
still dequantizes to ``min``, which a zero activation cancels).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

SCHEMES = ("int8", "int4")


class QuantizationError(ValueError):
    """A quantized tensor whose parts do not fit its format or its layer."""


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    """One linear weight [out_features, in_features] as stored (see the module doc)."""

    scheme: str
    out_features: int
    in_features: int
    group_size: int
    qweight: torch.Tensor
    scales: torch.Tensor  # float32 [out, groups]
    mins: torch.Tensor | None = None  # int4: float32 [out, groups]

    def __post_init__(self) -> None:
        check_quantized(self)

    @property
    def padded_in_features(self) -> int:
        return self.num_groups * self.group_size

    @property
    def num_groups(self) -> int:
        return -(-self.in_features // self.group_size)

    def nbytes(self) -> int:
        parts = [self.qweight, self.scales] + ([self.mins] if self.mins is not None else [])
        return sum(p.numel() * p.element_size() for p in parts)


def check_quantized(qw: QuantizedWeight) -> None:
    """Raises ``QuantizationError`` naming the first part whose dtype or shape is off."""
    if qw.scheme not in SCHEMES:
        raise QuantizationError(f"unknown quantization scheme {qw.scheme!r}; "
                                f"known: {', '.join(SCHEMES)}")
    if qw.out_features < 1 or qw.in_features < 1 or qw.group_size < 1:
        raise QuantizationError(f"{qw.scheme} weight has shape [{qw.out_features}, "
                                f"{qw.in_features}] and group size {qw.group_size}; "
                                "all must be positive")
    n, k = qw.out_features, qw.padded_in_features
    want = {"int8": (torch.int8, (n, k)), "int4": (torch.uint8, (n, k // 2))}[qw.scheme]
    if qw.scheme == "int4" and k % 2:
        raise QuantizationError(f"int4 group size {qw.group_size} must be even")
    _expect(qw, "qweight", qw.qweight, *want)
    _expect(qw, "scales", qw.scales, torch.float32, (n, qw.num_groups))
    if qw.scheme == "int4":
        if qw.mins is None:
            raise QuantizationError("int4 weight has no mins")
        _expect(qw, "mins", qw.mins, torch.float32, (n, qw.num_groups))
    elif qw.mins is not None:
        raise QuantizationError("int8 weight is symmetric and takes no mins")


def _expect(qw: QuantizedWeight, name: str, tensor: torch.Tensor, dtype: torch.dtype,
            shape: tuple[int, ...]) -> None:
    if tensor.dtype != dtype or tuple(tensor.shape) != shape:
        raise QuantizationError(
            f"{qw.scheme} weight [{qw.out_features}, {qw.in_features}] (group {qw.group_size}) "
            f"needs {name} {dtype} {list(shape)}, got {tensor.dtype} {list(tensor.shape)}")


def _grouped(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """[out, in] float32 → [out, groups, group_size], zero-padded along in."""
    n, k = weight.shape
    pad = -k % group_size
    w = F.pad(weight.detach().float(), (0, pad))
    return w.reshape(n, -1, group_size)


def quantize_int8(weight: torch.Tensor, group_size: int | None = None) -> QuantizedWeight:
    """Symmetric int8 of a float [out, in] weight: one scale per ``group_size`` inputs, or per
    output channel when ``group_size`` is None (round to nearest, codes -127..127). Group scales
    are then rounded to float16, as GGUF's Q8_0 stores them."""
    n, k = weight.shape
    g = group_size or k
    w = _grouped(weight, g)
    scales = w.abs().amax(-1) / 127
    q = torch.round(w / scales.clamp_min(torch.finfo(torch.float32).tiny)[..., None])
    if group_size is not None:
        scales = _float16_rounded(scales)
    return QuantizedWeight("int8", n, k, g, q.clamp_(-127, 127).to(torch.int8).reshape(n, -1),
                           scales.contiguous())


def quantize_int4(weight: torch.Tensor, group_size: int = 32) -> QuantizedWeight:
    """Asymmetric int4 of a float [out, in] weight (GGUF Q4_1's rule: each group's min and
    its range over 15 steps pick the codes, then scale and min are rounded to float16)."""
    n, k = weight.shape
    w = _grouped(weight, group_size)
    real = torch.arange(w.shape[1] * group_size).reshape(w.shape[1], group_size) < k
    lo = torch.where(real, w, torch.inf).amin(-1)
    hi = torch.where(real, w, -torch.inf).amax(-1)
    scales = (hi - lo) / 15
    safe = torch.where(scales > 0, scales, 1.0)
    q = torch.round((w - lo[..., None]) / safe[..., None]).clamp_(0, 15)
    q = torch.where(real, q, 0).to(torch.uint8).reshape(n, -1)
    return QuantizedWeight("int4", n, k, group_size, pack_nibbles(q),
                           _float16_rounded(scales).contiguous(), _float16_rounded(lo).contiguous())


def _float16_rounded(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values rounded to float16 where float16 holds them (finite)."""
    rounded = t.half().float()
    return torch.where(torch.isfinite(rounded), rounded, t)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[N, K] codes 0..15 (K even) → [N, K/2] uint8, the even index in the high nibble."""
    codes = codes.to(torch.uint8)
    return (codes[:, ::2] << 4) | codes[:, 1::2]


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of ``pack_nibbles``: [N, K/2] uint8 → [N, K] uint8."""
    return torch.stack([packed >> 4, packed & 15], dim=-1).reshape(packed.shape[0], -1)


def dequantize(qw: Any, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The float weight [out, in] that ``qw`` stands for (a ``QuantizedWeight``, or any weight
    with a ``dequantize(dtype)`` method: a ``BlockQuantWeight``)."""
    if not isinstance(qw, QuantizedWeight):
        return qw.dequantize(dtype)
    n, g = qw.out_features, qw.group_size
    if qw.scheme == "int8":
        codes = qw.qweight.float().reshape(n, -1, g)
        w = codes * qw.scales[..., None]
    else:
        codes = unpack_nibbles(qw.qweight).float().reshape(n, -1, g)
        w = codes * qw.scales[..., None] + qw.mins[..., None]
    return w.reshape(n, -1)[:, : qw.in_features].to(dtype).contiguous()


@dataclass(frozen=True, slots=True)
class QuantKernel:
    """One way to run a quantized matmul: ``supports(qw, device)``, ``prepare(qw) -> state``
    once at load (the layout this kernel reads; ``state_nbytes(state)`` counts it) and
    ``linear(x, state, bias | None) -> y`` per call. ``lookup(state, ids, dtype)``, where a
    kernel has one, dequantizes the output rows ``ids`` of its state: a tied embedding then
    reads the LM head's state rather than keeping a copy of the table."""

    name: str
    supports: Callable[[QuantizedWeight, torch.device], bool]
    prepare: Callable[[QuantizedWeight], Any]
    linear: Callable[[torch.Tensor, Any, torch.Tensor | None], torch.Tensor]
    state_nbytes: Callable[[Any], int]
    lookup: Callable[[Any, torch.Tensor, torch.dtype], torch.Tensor] | None = None


@dataclass(frozen=True, slots=True)
class QuantizedTable:
    """A kernel's state read as a table of rows (``QuantKernel.lookup``)."""

    state: Any
    lookup: Callable[[Any, torch.Tensor, torch.dtype], torch.Tensor]
    out_features: int
    in_features: int

    def rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return self.lookup(self.state, ids, dtype)


def reference_linear(x: torch.Tensor, qw: QuantizedWeight,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ dequantize(qw).T + bias``, in x's dtype."""
    return F.linear(x, dequantize(qw, x.dtype).to(x.device), bias)


REFERENCE = QuantKernel(
    name="dequantize+F.linear",
    supports=lambda qw, device: True,
    prepare=lambda qw: qw,
    linear=reference_linear,
    state_nbytes=lambda qw: qw.nbytes(),
)


def choose_kernel(kernels: tuple[QuantKernel, ...], qw: QuantizedWeight,
                  device: torch.device) -> QuantKernel:
    """The first of ``kernels`` that runs ``qw`` on ``device``; the reference otherwise."""
    return next((k for k in kernels if k.supports(qw, device)), REFERENCE)


def _rebuild(qw: QuantizedWeight, qweight: torch.Tensor, scales: torch.Tensor,
             mins: torch.Tensor | None, in_features: int | None = None) -> QuantizedWeight:
    return QuantizedWeight(qw.scheme, qweight.shape[0], in_features or qw.in_features,
                           qw.group_size, qweight.contiguous(), scales.contiguous(),
                           None if mins is None else mins.contiguous())


def take_rows(qw: QuantizedWeight, rows: torch.Tensor | slice) -> QuantizedWeight:
    """The output rows ``rows`` of ``qw`` (each row's groups are its own), copied: a shard
    must not keep the whole tensor alive."""
    mins = None if qw.mins is None else qw.mins[rows].clone()
    return _rebuild(qw, qw.qweight[rows].clone(), qw.scales[rows].clone(), mins)


def take_inputs(qw: QuantizedWeight, start: int, size: int) -> QuantizedWeight:
    """Inputs ``[start, start + size)`` of ``qw``, both whole groups or, with one scale per
    output row, any range (QuantizationError otherwise): a row-parallel rank's shard."""
    if qw.num_groups == 1 and qw.scheme == "int8" and start + size <= qw.in_features:
        return QuantizedWeight("int8", qw.out_features, size, size,
                               qw.qweight[:, start : start + size].contiguous(), qw.scales)
    g = qw.group_size
    if start % g or size % g or start + size > qw.in_features:
        raise QuantizationError(f"inputs [{start}, {start + size}) of a weight with "
                                f"{qw.in_features} inputs are not whole groups of {g}")
    per_byte = 2 if qw.scheme == "int4" else 1
    groups = slice(start // g, (start + size) // g)
    mins = None if qw.mins is None else qw.mins[:, groups]
    return _rebuild(qw, qw.qweight[:, start // per_byte : (start + size) // per_byte],
                    qw.scales[:, groups], mins, size)


def pad_rows(qw: QuantizedWeight, rows: int) -> QuantizedWeight:
    """``qw`` with zero rows (zero codes, scales and mins) up to ``rows`` rows."""
    extra = rows - qw.out_features
    if extra <= 0:
        return qw
    mins = None if qw.mins is None else F.pad(qw.mins, (0, 0, 0, extra))
    return _rebuild(qw, F.pad(qw.qweight, (0, 0, 0, extra)), F.pad(qw.scales, (0, 0, 0, extra)),
                    mins)


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Weights of one format and input size stacked along the output dim (a packed QKV)."""
    first = parts[0]
    for part in parts[1:]:
        if (part.scheme, part.group_size, part.in_features) != (
                first.scheme, first.group_size, first.in_features):
            raise QuantizationError(
                f"cannot stack a {part.scheme} weight (group {part.group_size}, "
                f"{part.in_features} inputs) under a {first.scheme} one (group "
                f"{first.group_size}, {first.in_features} inputs)")
    if len(parts) == 1:
        return first
    mins = None if first.mins is None else torch.cat([p.mins for p in parts])
    return _rebuild(first, torch.cat([p.qweight for p in parts]),
                    torch.cat([p.scales for p in parts]), mins)
