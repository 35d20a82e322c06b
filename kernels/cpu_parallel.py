"""Running a C kernel over row ranges on several threads.

The C kernels in ``csrc`` take a range [begin, end) of independent rows (sequences, tokens);
this module cuts the rows into one range per torch intra-op thread and runs the ranges at
once. ctypes releases the GIL for the call, so the ranges really run in parallel; the first
range runs on the calling thread.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}
# Below this many elements a second thread costs more to wake than it saves.
MIN_PARALLEL_ELEMENTS = 1 << 16


def _pool(workers: int) -> ThreadPoolExecutor:
    with _pool_lock:
        if workers not in _pools:
            _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="cpu-kernel")
        return _pools[workers]


def balanced_bounds(weights: torch.Tensor, parts: int) -> list[int]:
    """Boundaries [0, ..., R] cutting R rows into ``parts`` runs of about equal total weight
    (for attention, a sequence's work is proportional to its context length)."""
    rows = weights.shape[0]
    parts = max(1, min(parts, rows))
    if parts == 1:
        return [0, rows]
    cumulative = torch.cumsum(weights, 0, dtype=torch.int64)
    targets = cumulative[-1] * torch.arange(1, parts, dtype=torch.int64) // parts
    cuts = torch.searchsorted(cumulative, targets, right=True).tolist()
    return [0, *cuts, rows]


def even_bounds(rows: int, row_elements: int) -> list[int]:
    """Boundaries cutting ``rows`` equal rows into one run per thread, or a single run when
    the whole is too small to be worth a second thread."""
    parts = torch.get_num_threads() if rows * row_elements >= MIN_PARALLEL_ELEMENTS else 1
    parts = max(1, min(parts, rows))
    return [rows * i // parts for i in range(parts + 1)]


def run_ranges(kernel: Callable[..., int | None], args: Sequence[object],
               bounds: list[int]) -> list[int | None]:
    """``kernel(*args, begin, end)`` for each run of ``bounds``, at once; the return values."""
    ranges = list(itertools.pairwise(bounds))
    if len(ranges) == 1:
        return [kernel(*args, *ranges[0])]
    futures = [_pool(len(ranges) - 1).submit(kernel, *args, lo, hi) for lo, hi in ranges[1:]]
    first = kernel(*args, *ranges[0])
    return [first, *(future.result() for future in futures)]
