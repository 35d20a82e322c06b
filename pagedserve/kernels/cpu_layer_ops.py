"""RMSNorm (alone or after the residual add), SiLU-and-mul and the rotary embedding on the CPU
in C (``csrc/layer_ops.c``).

Between a decoder layer's GEMMs the torch reference runs about twenty small ops (RMSNorm alone
is seven: widen, square, mean, add, rsqrt, multiply, multiply), each a dispatch and a pass over
the activation. Each function here is one pass and one call. float32 and bfloat16 run in C;
other dtypes, and tensors on other devices, take the torch reference (``layer_ops.py``).
"""

from __future__ import annotations

import ctypes
import functools
import time

import torch

from pagedserve.kernels import cpu_parallel, layer_ops
from pagedserve.kernels.native_build import load_library

_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}
_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_ARGTYPES = {
    "rms_norm": [_P, _I, _P, _P, _I, _I, _F, _I, _I],  # ..., rows, threads
    "add_rms_norm": [_P, _I, _P, _P, _P, _I, _F, _I, _I],  # x, stride, residual, w, out, ...
    "silu_and_mul": [_P, _P, _I, _I, _I],
    "rotary": [_P, _I, _I, _I, _P, _P, _I, _I],
}


@functools.cache
def _kernel(op: str, dtype: torch.dtype):
    function = getattr(load_library("layer_ops"), f"{op}_{_SUFFIX[dtype]}")
    function.argtypes, function.restype = _ARGTYPES[op], None
    return function


# A one-token step calls these a few times a layer, so the checks read only what a tensor
# holds in its Python object (is_cpu, dtype, dim, strides) and outputs come from
# torch.empty_like where the input is dense: the wrapper costs about as much as the C loop.


def _runs_here(x: torch.Tensor) -> bool:
    return x.is_cpu and x.dtype in _SUFFIX and x.dim() == 2 and x.stride(1) == 1


def _output(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x) if x.is_contiguous() else torch.empty(x.shape, dtype=x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.layer_ops.rms_norm`."""
    if not (_runs_here(x) and weight.dtype is x.dtype and weight.is_contiguous()):
        return layer_ops.rms_norm(x, weight, eps)
    out = _output(x)
    rms_norm_into(x, weight, eps, out)
    return out


def rms_norm_into(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor) -> None:
    """:func:`rms_norm` into a contiguous ``out``, unchecked (the caller has checked)."""
    rows, hidden = x.shape
    _kernel("rms_norm", x.dtype)(x.data_ptr(), x.stride(0), weight.data_ptr(), out.data_ptr(),
                                 hidden, hidden, eps, rows,
                                 cpu_parallel.threads_for(rows * hidden))


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                  eps: float) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.layer_ops.add_rms_norm_`."""
    if not (_runs_here(x) and residual.dtype is x.dtype and weight.dtype is x.dtype
            and residual.is_cpu and x.shape == residual.shape and residual.is_contiguous()
            and weight.is_contiguous()):
        return layer_ops.add_rms_norm_(x, residual, weight, eps)
    out = torch.empty_like(residual)
    add_rms_norm_into(x, residual, weight, eps, out)
    return out


def add_rms_norm_into(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      out: torch.Tensor) -> None:
    """:func:`add_rms_norm_` into a contiguous ``out``, unchecked (the caller has checked)."""
    rows, hidden = x.shape
    _kernel("add_rms_norm", x.dtype)(x.data_ptr(), x.stride(0), residual.data_ptr(),
                                     weight.data_ptr(), out.data_ptr(), hidden, eps, rows,
                                     cpu_parallel.threads_for(rows * hidden))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.layer_ops.silu_and_mul`."""
    if not (x.is_cpu and x.dtype in _SUFFIX and x.dim() == 2):
        return layer_ops.silu_and_mul(x)
    x = x.contiguous()
    rows, width = x.shape
    out = torch.empty(rows, width // 2, dtype=x.dtype)
    silu_and_mul_into(x, out)
    return out


def silu_and_mul_into(x: torch.Tensor, out: torch.Tensor) -> None:
    """:func:`silu_and_mul` of a contiguous ``x`` into a contiguous ``out``, unchecked."""
    rows, width = x.shape
    _kernel("silu_and_mul", x.dtype)(x.data_ptr(), out.data_ptr(), width // 2, rows,
                                     cpu_parallel.threads_for(rows * width))


def rotary_(x: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Same contract as :func:`pagedserve.kernels.layer_ops.rotary_`."""
    if not (_runs_here(x) and cos.dtype is torch.float32 and cos.is_contiguous()
            and sin.is_contiguous()):
        layer_ops.rotary_(x, heads, cos, sin)
        return
    rows, half = cos.shape
    _kernel("rotary", x.dtype)(x.data_ptr(), x.stride(0), heads, half, cos.data_ptr(),
                               sin.data_ptr(), rows,
                               cpu_parallel.threads_for(rows * heads * 2 * half))


def warm_up(dtype: torch.dtype) -> float:
    """Builds the C library for this machine now (once; later processes load it); returns the
    seconds spent."""
    start = time.perf_counter()
    if dtype in _SUFFIX:
        for op in _ARGTYPES:
            _kernel(op, dtype)
    return time.perf_counter() - start
