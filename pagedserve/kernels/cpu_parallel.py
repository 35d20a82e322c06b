"""How the C kernels in ``csrc`` share out their rows among threads.

The kernels run their rows (sequences, tokens) on the OpenMP pool, built with ``-fopenmp``
against the libgomp that torch has already loaded, so they use torch's own intra-op threads:
threads of a separate pool would compete for the cores with torch's, which keep spinning for
a while after each GEMM (measured: a second pool made decode attention 2x slower inside the
model than alone). This module picks how many threads a call gets and, for attention, where
to cut the sequences.
"""

from __future__ import annotations

import torch

# Below this many elements a second thread costs more to wake than it saves.
MIN_PARALLEL_ELEMENTS = 1 << 16


def threads_for(elements: int) -> int:
    """torch's intra-op thread count for a big enough input, else 1."""
    return torch.get_num_threads() if elements >= MIN_PARALLEL_ELEMENTS else 1


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
