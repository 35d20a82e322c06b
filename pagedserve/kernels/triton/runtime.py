"""How the Triton kernels are being run (compiled for CUDA or interpreted on the CPU) and what
that implies for dtypes, device checks and launch sizes."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}
SUPPORTED_DTYPES = tuple(_TL_DTYPES)


def is_interpreted(kernel: object) -> bool:
    """True when ``kernel`` was decorated while TRITON_INTERPRET=1 (runs as Python on the CPU).

    Triton reads the variable when a kernel is decorated, so the kernel object tells for
    certain how it will run, whatever the environment says now.
    """
    return not isinstance(kernel, triton.runtime.JITFunction)


def require_launchable(kernel: object, *tensors: torch.Tensor) -> None:
    """A compiled kernel reads device memory only; say how to run on the CPU instead."""
    if is_interpreted(kernel):
        return
    for tensor in tensors:
        if tensor.device.type != "cuda":
            raise ValueError(
                f"Triton kernels need CUDA tensors, got a tensor on {tensor.device}; to run them "
                "on the CPU set TRITON_INTERPRET=1 before pagedserve.kernels.triton is imported"
            )


def dot_dtype(kernel: object, dtype: torch.dtype) -> tuple[tl.dtype, str]:
    """The operand dtype and precision of ``tl.dot`` for caches of ``dtype``.

    On the GPU, 16-bit caches feed the tensor cores directly (fp32 accumulation, probabilities
    rounded to the cache dtype as FlashAttention does); fp32 caches use IEEE products since TF32
    would cut them to 10 mantissa bits. The interpreter rounds fp32→bf16 by truncation, so there
    every operand stays in fp32.
    """
    if is_interpreted(kernel) or dtype == torch.float32:
        return tl.float32, "ieee"
    return _TL_DTYPES[dtype], "tf32"


def kernel_output_dtype(kernel: object, dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel should write for a result of ``dtype``.

    The interpreter converts fp32→bf16 by truncation (up to one ulp off), so interpreted bf16
    results are written in fp32 and rounded by torch afterwards.
    """
    if is_interpreted(kernel) and dtype == torch.bfloat16:
        return torch.float32
    return dtype


@functools.lru_cache(maxsize=16)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def multiprocessor_count(device: torch.device) -> int:
    """Streaming multiprocessors on ``device``; the interpreter runs programs one at a time."""
    if device.type != "cuda":
        return 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_sm_count(index)


def next_power_of_2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def cdiv(numerator: int, denominator: int) -> int:
    return -(-numerator // denominator)
