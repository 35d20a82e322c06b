"""Paged decode attention on the CPU in C (``csrc/paged_decode.c``), reading KV blocks in place.

Decode attention on a CPU is bound by memory: every step reads each running sequence's whole
K and V. The C kernel reads each row once, in cache order, for all the query heads that share
it, and requests blocks ahead of the one it reads. Measured inside the peer model (64
sequences of about 195 tokens, 8 layers whose K and V come from memory every step, 2 threads,
float32): 13.4 ms a step, about 15 GB/s of the machine's 26 GB/s read bandwidth; the same
kernel on a second thread pool beside torch's took 23.4 ms.

Sequences are cut into parts of about equal context, one per torch intra-op thread, and the
parts run on torch's OpenMP threads (``cpu_parallel.py``); ctypes releases the GIL for the
call. float32 and bfloat16 run here; other dtypes take the compiled kernel. Prefill rows keep
the reference path; decode rows of a mixed step come here.
"""

from __future__ import annotations

import ctypes
import functools
import time

import torch

from pagedserve.kernels import attention, compiled_attention, cpu_parallel
from pagedserve.kernels.native_build import load_library

_FUNCTIONS = {torch.float32: "paged_decode_f32", torch.bfloat16: "paged_decode_bf16"}
_ARGTYPES = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 5
             + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64])
# Parts per thread, taken as threads come free (csrc/paged_decode.c). Four parts measured no
# faster than one on an idle machine (57.8 against 59.5 ms a step, interleaved).
PARTS_PER_THREAD = 1


@functools.cache
def _kernel(dtype: torch.dtype):
    function = getattr(load_library("paged_decode"), _FUNCTIONS[dtype])
    function.argtypes, function.restype = _ARGTYPES, ctypes.c_int
    return function


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.attention.paged_attention_decode`."""
    if query.dtype not in _FUNCTIONS or query.device.type != "cpu":
        return compiled_attention.paged_attention_decode(query, key_cache, value_cache,
                                                         block_tables, seq_lens, scale)
    attention.check_decode(query, key_cache, value_cache, block_tables, seq_lens)
    attention.max_seq_len(seq_lens, block_tables, key_cache.shape[1])
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous [N, B, Hkv, D] tensors")
    query = query.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    lens = seq_lens.to(torch.int32).contiguous()
    out = torch.empty_like(query)
    _, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    args = (query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(), tables.data_ptr(),
            lens.data_ptr(), out.data_ptr(), num_heads, num_kv_heads, head_dim, block_size,
            tables.shape[1], scale)
    threads = torch.get_num_threads()
    bounds = torch.tensor(cpu_parallel.balanced_bounds(lens, PARTS_PER_THREAD * threads),
                          dtype=torch.int64)
    if _kernel(query.dtype)(*args, bounds.data_ptr(), bounds.shape[0] - 1, threads):
        raise MemoryError("paged decode attention could not allocate its score buffer")
    return out


def paged_attention_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Same contract as :func:`pagedserve.kernels.attention.paged_attention_prefill`; its
    decode rows run the C kernel."""
    return attention.paged_attention_prefill(
        query, key_cache, value_cache, block_tables, query_start_loc, seq_lens, scale,
        decode=paged_attention_decode,
    )


def warm_up(
    num_heads: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> float:
    """Builds the C kernel for this machine now (once; later processes load it), or compiles
    the inductor kernel for a dtype the C kernel does not take; returns the seconds spent."""
    if dtype not in _FUNCTIONS:
        return compiled_attention.warm_up(num_heads, num_kv_heads, head_dim, block_size, dtype)
    start = time.perf_counter()
    try:
        _kernel(dtype)
    except Exception as exc:
        raise RuntimeError(
            f"building the CPU attention kernel failed ({exc}); run with --kernel-backend "
            "inductor or torch (or PAGEDSERVE_KERNEL_BACKEND=torch)"
        ) from exc
    return time.perf_counter() - start
