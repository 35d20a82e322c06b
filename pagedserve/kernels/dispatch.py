"""Choosing the kernel backend: one ``KernelOps`` bundle, passed to the model explicitly.

Backends: ``"torch"`` (the reference in this package, any device), ``"triton"``
(``pagedserve.kernels.triton``, imported only when chosen) and ``"inductor"`` (CPU: decode
attention compiled by torch.compile, reading KV blocks in place, ``compiled_attention.py``;
linear weights prepacked for oneDNN, ``cpu_linear.py``; quantized weights on torch's int8/int4
weight-only ops, ``cpu_quantized_linear.py``).
``"cpu"`` is the inductor bundle with decode attention, the KV cache writes, the element-wise
layer ops and the sampling race in C instead (``cpu_attention.py``, ``cpu_cache_ops.py``,
``cpu_layer_ops.py``, ``cpu_sampling.py``, built for the host on first use).
``"auto"`` takes Triton for a CUDA device, ``"cpu"`` for the CPU when a C compiler and a C++
compiler are on the PATH (the C kernels build with the first; inductor, which compiles the
attention of dtypes the C kernels do not take, with the second), and the torch reference
otherwise.

Environment: ``PAGEDSERVE_KERNEL_BACKEND`` (one of ``BACKENDS``) is read only when
the caller passes ``backend=None``; an explicit ``backend`` always wins over it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from pagedserve.kernels import attention, cache_ops, layer_ops, native_build
from pagedserve.kernels.quantized_linear import QuantKernel

BACKENDS = ("auto", "torch", "triton", "inductor", "cpu")
BACKEND_ENV = "PAGEDSERVE_KERNEL_BACKEND"


@dataclass(frozen=True, slots=True)
class KernelOps:
    """The five paged-KV ops of one backend (signatures in docs/internals.md), the
    element-wise ops between a layer's GEMMs (``layer_ops.py``; the torch reference unless a
    backend has its own), and for a compiling backend ``warm_up(num_heads, num_kv_heads,
    head_dim, block_size, dtype) -> seconds``, which compiles before the first request. A
    backend with ``linear_packing`` has the model's linear layers reorder their weights once
    after loading."""

    name: str
    reshape_and_cache: Callable[..., None]
    paged_attention_decode: Callable[..., torch.Tensor]
    paged_attention_prefill: Callable[..., torch.Tensor]
    copy_blocks: Callable[..., None]
    swap_blocks: Callable[..., None]
    warm_up: Callable[..., float] | None = None
    linear_packing: LinearPacking | None = None
    rms_norm: Callable[..., torch.Tensor] = layer_ops.rms_norm
    add_rms_norm_: Callable[..., torch.Tensor] = layer_ops.add_rms_norm_
    silu_and_mul: Callable[..., torch.Tensor] = layer_ops.silu_and_mul
    rotary_: Callable[..., None] = layer_ops.rotary_
    # (probs [N, V], seed) -> token ids [N]: a random draw by the exponential race in one pass,
    # for a backend that has one; the sampler draws torch noise otherwise.
    exponential_race: Callable[[torch.Tensor, int], torch.Tensor] | None = None
    # logits [N, V] -> token ids [N]: the greedy rows' argmax, for a backend that has one.
    argmax: Callable[[torch.Tensor], torch.Tensor] | None = None
    # (logits [N, V], top_k [N] | None, top_p [N] | None) -> truncated logits, or None where
    # the sampler's own sort must run: top-k / top-p without a sort, for a backend that has it.
    top_k_top_p: Callable[..., torch.Tensor | None] | None = None
    # (qkv [S, (H + 2 Hkv) D], num_heads, num_kv_heads, cos, sin, key_cache, value_cache,
    # slot_mapping, block_tables, seq_lens, scale) -> out [S, H, D]: a decode-only step's
    # rotary_, reshape_and_cache and paged_attention_decode in one call, for a backend that
    # has it; the model runs the three otherwise.
    rotary_cache_decode: Callable[..., torch.Tensor] | None = None
    # Whether attention reads a KV cache kept in another dtype than the query's
    # (--kv-cache-dtype bfloat16 under a float32 model).
    reads_other_cache_dtypes: bool = False
    # The KV cache's dtype under a float32 model when none is asked for (--kv-cache-dtype
    # auto); None: the model's. The C kernels keep float16, chosen by measurement
    # (docs/benchmarks.md, "The KV cache's element type").
    float32_model_cache_dtype: torch.dtype | None = None
    # Quantized matmuls in order of preference (``quantized_linear.choose_kernel``); a weight
    # none of them takes runs on the reference, dequantize then ``F.linear``.
    quantized_kernels: tuple[QuantKernel, ...] = ()


@dataclass(frozen=True, slots=True)
class LinearPacking:
    """Prepacked linear layers: ``supports(dtype)``, ``pack(weight [out, in]) -> packed`` and
    ``linear(x, packed, bias | None) -> y``. A weight that ``worth_packing(weight)`` turns
    down stays dense (``F.linear``); without it every weight is packed."""

    supports: Callable[[torch.dtype], bool]
    pack: Callable[[torch.Tensor], torch.Tensor]
    linear: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
    worth_packing: Callable[[torch.Tensor], bool] | None = None


TORCH_OPS = KernelOps(
    name="torch",
    reshape_and_cache=cache_ops.reshape_and_cache,
    paged_attention_decode=attention.paged_attention_decode,
    paged_attention_prefill=attention.paged_attention_prefill,
    copy_blocks=cache_ops.copy_blocks,
    swap_blocks=cache_ops.swap_blocks,
    reads_other_cache_dtypes=True,
)


def _triton_ops() -> KernelOps:
    try:
        from pagedserve.kernels.triton import (
            copy_blocks,
            paged_attention_decode,
            paged_attention_prefill,
            reshape_and_cache,
            swap_blocks,
        )
    except ImportError as exc:
        raise ImportError(
            f"kernel backend 'triton' is unavailable ({exc}); install triton "
            "(pip install 'pagedserve[gpu]') or choose backend 'torch'"
        ) from exc
    return KernelOps(
        name="triton",
        reshape_and_cache=reshape_and_cache,
        paged_attention_decode=paged_attention_decode,
        paged_attention_prefill=paged_attention_prefill,
        copy_blocks=copy_blocks,
        swap_blocks=swap_blocks,
    )


def _inductor_ops() -> KernelOps:
    from pagedserve.kernels import compiled_attention, cpu_linear

    return KernelOps(
        name="inductor",
        reshape_and_cache=cache_ops.reshape_and_cache,
        paged_attention_decode=compiled_attention.paged_attention_decode,
        paged_attention_prefill=compiled_attention.paged_attention_prefill,
        copy_blocks=cache_ops.copy_blocks,
        swap_blocks=cache_ops.swap_blocks,
        warm_up=compiled_attention.warm_up,
        linear_packing=LinearPacking(cpu_linear.supports, cpu_linear.pack_weight,
                                     cpu_linear.linear, cpu_linear.worth_packing),
        reads_other_cache_dtypes=True,
        quantized_kernels=cpu_quantized_kernels(),
    )


def cpu_quantized_kernels() -> tuple[QuantKernel, ...]:
    """The CPU's quantized-matmul kernels in order of preference: the block-quant C kernel,
    then torch's int8 and int4 weight-only ops."""
    from pagedserve.kernels.cpu_block_quant import BLOCK_QUANT_KERNEL
    from pagedserve.kernels.cpu_quantized_linear import INT4_KERNEL, INT8_KERNEL

    return (BLOCK_QUANT_KERNEL, INT8_KERNEL, INT4_KERNEL)


def _cpu_ops() -> KernelOps:
    from pagedserve.kernels import cpu_attention, cpu_cache_ops, cpu_layer_ops, cpu_sampling

    return replace(_inductor_ops(), name="cpu",
                   reshape_and_cache=cpu_cache_ops.reshape_and_cache,
                   paged_attention_decode=cpu_attention.paged_attention_decode,
                   paged_attention_prefill=cpu_attention.paged_attention_prefill,
                   warm_up=_cpu_warm_up,
                   rms_norm=cpu_layer_ops.rms_norm, add_rms_norm_=cpu_layer_ops.add_rms_norm_,
                   silu_and_mul=cpu_layer_ops.silu_and_mul,
                   rotary_=cpu_layer_ops.rotary_,
                   rotary_cache_decode=cpu_attention.rotary_cache_decode,
                   exponential_race=cpu_sampling.exponential_race,
                   argmax=cpu_sampling.argmax, top_k_top_p=cpu_sampling.top_k_top_p,
                   float32_model_cache_dtype=torch.float16)


def _cpu_warm_up(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> float:
    from pagedserve.kernels import cpu_attention, cpu_cache_ops, cpu_layer_ops, cpu_sampling

    seconds = cpu_attention.warm_up(num_heads, num_kv_heads, head_dim, block_size, dtype)
    seconds += cpu_cache_ops.warm_up()
    return seconds + cpu_layer_ops.warm_up(dtype) + cpu_sampling.warm_up()


def has_cpp_compiler() -> bool:
    """Whether inductor can build CPU kernels here ($CXX, else g++ / c++ / clang++)."""
    names = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "c++", "clang++"]
    return any(shutil.which(name) for name in names)


def get_kernel_ops(device: torch.device | str, backend: str | None = "auto") -> KernelOps:
    """The kernel ops for ``device``; ``backend=None`` defers to $PAGEDSERVE_KERNEL_BACKEND
    (default ``auto``)."""
    source = "backend"
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or "auto"
        source = BACKEND_ENV
    if backend not in BACKENDS:
        raise ValueError(
            f"unknown kernel backend {backend!r} (from {source}); choose one of "
            f"{', '.join(BACKENDS)}"
        )
    kind = torch.device(device).type
    if backend == "auto":
        if kind == "cuda":
            backend = "triton"
        else:
            compilers = has_cpp_compiler() and native_build.c_compiler() is not None
            backend = "cpu" if kind == "cpu" and compilers else "torch"
    if backend in ("inductor", "cpu") and kind != "cpu":
        raise ValueError(f"kernel backend {backend!r} runs on the CPU only, not on {kind!r}")
    if backend == "triton":
        return _triton_ops()
    return {"inductor": _inductor_ops, "cpu": _cpu_ops}.get(backend, lambda: TORCH_OPS)()
