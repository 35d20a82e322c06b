"""Writing new K/V rows into the paged KV cache on the CPU, in C (``csrc/cache_write.c``).

The torch reference (``cache_ops.reshape_and_cache``) runs ``index_copy_`` from the strided
K and V views of the fused QKV output, after a padding check that reads the slots back to
Python: about 110 us a layer for a 64-token decode step on 2 threads, about a fortieth of the
step. Here each token's two rows are one ``memcpy`` each (or one rounding pass into a 16-bit
cache), and the padding and bounds checks run in C. float32 and bfloat16, and a float32 model
over a bfloat16 or float16 cache, run here; other dtypes and devices take the reference.
"""

from __future__ import annotations

import ctypes
import functools
import time

import torch

from pagedserve.kernels import cache_ops, cpu_parallel
from pagedserve.kernels.native_build import load_library

# (K/V dtype, cache dtype) -> function in csrc/cache_write.c
_FUNCTIONS = {(torch.float32, torch.float32): "cache_write_f32",
              (torch.bfloat16, torch.bfloat16): "cache_write_bf16",
              (torch.float32, torch.bfloat16): "cache_write_f32_bf16kv",
              (torch.float32, torch.float16): "cache_write_f32_f16kv"}
_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 4


@functools.cache
def _kernel(dtypes: tuple[torch.dtype, torch.dtype]):
    function = getattr(load_library("cache_write"), _FUNCTIONS[dtypes])
    function.argtypes, function.restype = _ARGTYPES, ctypes.c_int64
    return function


def _rows_contiguous(x: torch.Tensor) -> bool:
    """[T, Hkv, D] whose every token's Hkv x D elements are one contiguous run."""
    return x.dim() == 3 and x.stride(2) == 1 and (x.shape[1] == 1 or x.stride(1) == x.shape[2])


def _runs_here(key, value, key_cache, value_cache, slot_mapping) -> bool:
    # Attributes of the tensors' Python objects only (a device object costs more to build than
    # the copy of a one-token step): this runs once a layer.
    return ((key.dtype, key_cache.dtype) in _FUNCTIONS and value.dtype is key.dtype
            and value_cache.dtype is key_cache.dtype and key.is_cpu and value.is_cpu
            and key_cache.is_cpu and value_cache.is_cpu and slot_mapping.is_cpu
            and key_cache.is_contiguous() and value_cache.is_contiguous()
            and _rows_contiguous(key) and _rows_contiguous(value)
            and slot_mapping.dtype is torch.int64)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Same contract as :func:`pagedserve.kernels.cache_ops.reshape_and_cache`."""
    if not _runs_here(key, value, key_cache, value_cache, slot_mapping):
        cache_ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    cache_ops.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    slot_mapping = slot_mapping.contiguous()
    tokens, heads, head_dim = key.shape
    width = heads * head_dim
    num_slots = key_cache.shape[0] * key_cache.shape[1]
    bad = _kernel((key.dtype, key_cache.dtype))(
        key.data_ptr(), key.stride(0), value.data_ptr(), value.stride(0),
        key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr(),
        tokens, width, num_slots, cpu_parallel.threads_for(2 * tokens * width))
    if bad >= 0:
        raise IndexError(f"slot_mapping[{bad}] = {int(slot_mapping[bad])} is out of range for "
                         f"a cache of {num_slots} slots")


def warm_up() -> float:
    """Builds the C library for this machine now (once); returns the seconds spent."""
    start = time.perf_counter()
    for dtypes in _FUNCTIONS:
        _kernel(dtypes)
    return time.perf_counter() - start
