"""Linear layers on the CPU with weights prepacked for oneDNN.

``F.linear`` hands each call to a GEMM that reorders the weight into its blocked layout on
the fly; at the batch sizes of a decode step (tens of rows) that reordering costs as much as
the multiply. oneDNN can reorder a weight once, at load time, into the layout its kernels
read (what inductor's freezing pass and vLLM's CPU backend do): measured here 1.2-1.4x
faster at 64 rows and about 3x at 7 rows for float32, 1.1-2x for bfloat16.

A packed call has a fixed cost of about 15 µs on top of the product (measured on a 2-core
AMD EPYC VM). In float32, ``F.linear`` on a small weight takes 3-6 µs at a few rows: below
``MIN_PACKED_F32_ELEMENTS`` (a 256 × 256 weight) packing loses at up to 32 rows and at best
ties at 64-256 (128 × 256 at one row: 18 µs packed, 4.5 µs dense), so such weights stay dense
(``worth_packing``). In bfloat16 ``F.linear`` costs more than the packed call at every size
measured (128 × 256 at one row: 24 µs dense, 16 µs packed), so every bfloat16 weight is packed.

``pack_weight`` returns an opaque ``torch._mkldnn`` tensor that only ``linear`` reads; the
dense weight can be dropped after packing. Results differ from ``F.linear`` by float rounding
(another summation order), so the torch reference backend never packs.
"""

from __future__ import annotations

import functools

import torch

MIN_PACKED_F32_ELEMENTS = 1 << 16

_DTYPE_CHECKS = {
    torch.float32: lambda: True,
    torch.bfloat16: lambda: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    torch.float16: lambda: torch.ops.mkldnn._is_mkldnn_fp16_supported(),
}


@functools.cache
def supports(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU run oneDNN linear layers in ``dtype``."""
    if not torch.backends.mkldnn.is_available() or dtype not in _DTYPE_CHECKS:
        return False
    if not _DTYPE_CHECKS[dtype]():
        return False
    try:  # a build can list the ops and still fail to run them
        weight = torch.ones(4, 8, dtype=dtype)
        out = linear(torch.ones(2, 8, dtype=dtype), pack_weight(weight), None)
    except RuntimeError:
        return False
    return bool((out == 8).all())


def worth_packing(weight: torch.Tensor) -> bool:
    """Whether ``weight`` runs faster packed (see the module doc)."""
    return weight.dtype != torch.float32 or weight.numel() >= MIN_PACKED_F32_ELEMENTS


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] (dense, CPU) reordered for ``linear``."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W.T + bias`` for a weight packed by ``pack_weight``; x is [..., in]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
