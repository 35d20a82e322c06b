"""The random-sampling stage: temperature, top-k, top-p, min-p, in that order.

Each is the transformers warper of the same name, vectorised over rows that each carry their
own value; the metadata gives greedy rows and rows that did not ask the neutral value, so one
pass serves the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from pagedserve.server.sampling.metadata import SamplingMetadata

_MASKED = float("-inf")

# (logits [N, V], top_k long [N] | None, top_p float32 [N] | None) -> truncated logits, or None
# where the torch path must run: a kernel backend's top-k / top-p without a sort.
TopKTopP = Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None],
                    torch.Tensor | None]


def apply_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """Keep each row's ``top_k`` largest logits (ties at the k-th value kept), then the
    smallest set of the largest whose probability reaches ``top_p``; mask the rest to -inf."""
    # Ascending, as transformers sorts for top-p, so that the cumulative sums match its own.
    # The order among equal logits is by token id, where transformers' unstable sort leaves
    # it to torch.
    order = _ascending_order(logits)
    sorted_logits = logits.gather(1, order)
    if top_k is not None:
        kth_largest = sorted_logits.gather(1, (logits.size(1) - top_k).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, _MASKED)
    if top_p is not None:
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= (1 - top_p).unsqueeze(1)
        # A row at top_p = 1 must stay untouched; the comparison alone would still drop
        # tokens whose probability underflows to zero.
        drop &= (top_p < 1).unsqueeze(1)
        drop[:, -1] = False
        sorted_logits = sorted_logits.masked_fill(drop, _MASKED)
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)


def _ascending_order(logits: torch.Tensor) -> torch.Tensor:
    """Column order that sorts each row ascending, ties by token id (a stable sort)."""
    if logits.device.type != "cpu" or logits.dtype != torch.float32:
        return logits.argsort(dim=-1, stable=True)
    # torch's stable CPU sort is slow at vocabulary width; numpy's SIMD sort of one int64 key
    # per token (the logit's order-preserving bits above the token id) is several times faster.
    # +0.0 turns -0.0 into 0.0; NaN, made positive, goes after +inf; both as torch orders them.
    values = torch.where(logits.isnan(), math.nan, logits) + 0.0  # one positive NaN
    bits = values.numpy().view(np.int32).astype(np.int64)
    keys = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # negative floats order reversed
    id_bits = max(1, (logits.size(1) - 1).bit_length())
    keys = (keys << id_bits) | np.arange(logits.size(1), dtype=np.int64)
    keys.sort(axis=-1)
    return torch.from_numpy(keys & ((1 << id_bits) - 1))


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Mask tokens whose probability is below ``min_p`` times the row's top probability."""
    probs = logits.softmax(dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p.unsqueeze(1)
    # The top token always survives (min_p <= 1), so no row is left empty.
    return logits.masked_fill(probs < threshold, _MASKED)


def apply_warpers(logits: torch.Tensor, metadata: SamplingMetadata,
                  top_k_top_p: TopKTopP | None = None) -> torch.Tensor:
    """Temperature, then top-k and top-p, then min-p; returns a new tensor or ``logits``.
    ``top_k_top_p`` (a kernel backend's, when it has one) truncates where it can, the sort
    here everywhere else."""
    if metadata.temperature is not None:
        logits = logits / metadata.temperature.unsqueeze(1)
    if metadata.top_k is not None or metadata.top_p is not None:
        truncated = (top_k_top_p(logits, metadata.top_k, metadata.top_p)
                     if top_k_top_p is not None else None)
        logits = (truncated if truncated is not None
                  else apply_top_k_top_p(logits, metadata.top_k, metadata.top_p))
    if metadata.min_p is not None:
        logits = apply_min_p(logits, metadata.min_p)
    return logits
