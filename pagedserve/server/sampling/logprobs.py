"""Logprobs reported to users: log-softmax of the model's raw logits.

As OpenAI and vLLM report them, they describe the model's distribution, before penalties,
biases, temperature or truncation, so a client can compare runs with different sampling
settings. Both helpers subtract one ``logsumexp`` per row instead of materialising the full
``[N, V]`` log-softmax.
"""

from __future__ import annotations

import torch


def sampled_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """float32 [N]: logprob of ``token_ids[i]`` under the softmax of ``logits[i]``."""
    chosen = logits.gather(1, token_ids.unsqueeze(1)).squeeze(1)
    return chosen - torch.logsumexp(logits, dim=-1)


def top_logprobs(
    logits: torch.Tensor, num_logprobs: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The ``num_logprobs`` most likely tokens per row, best first: ``(ids long [N, k],
    logprobs float32 [N, k])`` with ``k = min(num_logprobs, V)``; ``None`` for 0."""
    if num_logprobs == 0:
        return None
    values, ids = logits.topk(min(num_logprobs, logits.size(1)), dim=-1)
    return ids, values - torch.logsumexp(logits, dim=-1, keepdim=True)


def sampled_ranks(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """long [N]: 1-based rank of ``token_ids[i]`` in row i (1 = the most likely token)."""
    chosen = logits.gather(1, token_ids.unsqueeze(1))
    return (logits > chosen).sum(dim=-1) + 1
