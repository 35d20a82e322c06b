"""Sampling on the CPU in C: the exponential race of random rows (``csrc/race.c``), the
argmax of greedy ones (``csrc/argmax.c``) and top-k / top-p truncation
(``csrc/top_k_top_p.c``).

The torch path draws a ``[N, V]`` tensor of Exp(1) noise from a generator stream
(``uniform_`` alone, one element at a time, was 1.8 ms of every step for 64 rows of an 8k
vocabulary on one core), then divides and takes the argmax: four passes over the batch. Here
each row's noise comes from a counter-based generator, SplitMix64 of (the row's seed,
token id), so the draw, the division and the argmax are one pass, split across torch's
OpenMP threads. ``seed`` (one 64-bit word per call) makes the draws reproducible.

``torch.argmax`` over a row of logits runs one element at a time (about 0.3 ms for 64 rows of
an 8k vocabulary, a fifth of the lm_head's product); the C argmax reduces in vector lanes,
rows split across the same threads, with torch's rules: the first index of the largest, or
of the first NaN.
"""

from __future__ import annotations

import ctypes
import functools
import time

import torch

from pagedserve.kernels import cpu_parallel
from pagedserve.kernels.native_build import load_library


@functools.cache
def _argmax_kernel():
    function = load_library("argmax").argmax_f32
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                         ctypes.c_void_p, ctypes.c_int64]
    function.restype = None
    return function


@functools.cache
def _kernel():
    function = load_library("race").exponential_race_f32
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64,
                         ctypes.c_void_p, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


@functools.cache
def _top_k_top_p_kernel():
    function = load_library("top_k_top_p").top_k_top_p_f32
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


def exponential_race(probs: torch.Tensor, seed: int) -> torch.Tensor:
    """One token per row of ``probs`` [N, V] (float32, CPU), each row ``argmax_i p_i / E_i``
    with ``E_i ~ Exp(1)`` drawn from ``seed`` and the row's index; returns long [N]."""
    if probs.dtype != torch.float32 or probs.device.type != "cpu" or probs.dim() != 2:
        raise ValueError(f"expected float32 CPU probabilities [N, V], got {probs.dtype} "
                         f"{list(probs.shape)} on {probs.device}")
    probs = probs.contiguous()
    rows, vocab = probs.shape
    out = torch.empty(rows, dtype=torch.int64)
    if rows and _kernel()(probs.data_ptr(), rows, vocab, seed & ((1 << 64) - 1), out.data_ptr(),
                          cpu_parallel.threads_for(rows * vocab)):
        raise MemoryError("the exponential race could not allocate its score buffer")
    return out


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """``logits.argmax(dim=-1)`` of a 2-D tensor; long [N]. float32 CPU rows with unit
    stride run in C, anything else in torch."""
    if (logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.dim() != 2
            or logits.stride(-1) != 1 or logits.shape[1] == 0):
        return logits.argmax(dim=-1)
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64)
    if rows:
        _argmax_kernel()(logits.data_ptr(), rows, vocab, logits.stride(0), out.data_ptr(),
                         cpu_parallel.threads_for(rows * vocab))
    return out


def top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                top_p: torch.Tensor | None) -> torch.Tensor | None:
    """``logits`` [N, V] with each row's tokens outside its top-k (long [N], V for none) and
    then outside its top-p (float32 [N], 1 for none) at -inf, transformers' rules, without a
    sort; a new tensor. ``None`` where the torch path must run instead: not float32 on the
    CPU, or a NaN or +inf logit (whose softmax is NaN, a case the sort handles its own way).

    torch's stable sort of an 8k vocabulary is the whole cost of top-k and top-p there (14 ms
    for 64 rows on 2 cores); a histogram over value buckets finds each cut, and only the
    bucket a cut falls in is sorted.
    """
    if (logits.dtype != torch.float32 or logits.device.type != "cpu" or logits.dim() != 2
            or logits.shape[1] == 0 or bool((logits.isnan() | (logits == float("inf"))).any())):
        return None
    rows, vocab = logits.shape
    logits = logits.contiguous()
    k = (torch.full((rows,), vocab, dtype=torch.int64) if top_k is None
         else top_k.to(torch.int64).contiguous())
    p = (torch.ones(rows, dtype=torch.float32) if top_p is None
         else top_p.to(torch.float32).contiguous())
    out = torch.empty_like(logits)
    if rows and _top_k_top_p_kernel()(logits.data_ptr(), rows, vocab, k.data_ptr(),
                                      p.data_ptr(), out.data_ptr(),
                                      cpu_parallel.threads_for(rows * vocab)):
        raise MemoryError("top-k / top-p could not allocate its scratch buffers")
    return out


def warm_up() -> float:
    """Builds the C library for this machine now (once; later processes load it); returns the
    seconds spent."""
    start = time.perf_counter()
    _kernel()
    _argmax_kernel()
    _top_k_top_p_kernel()
    return time.perf_counter() - start
