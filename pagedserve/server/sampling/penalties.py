"""Penalties, biases and bans: the first stage of logits processing, applied to every row.

Order: repetition penalty (on the model's logits, as transformers defines it), presence and
frequency penalties, ``logit_bias``, then the blocked-token mask (``allowed_token_ids``,
``min_tokens``, ``bad_words``). Biases come after the penalties so that a bias keeps its
literal meaning of "add this to the logit that is sampled from", and the mask comes last so
that no bias can revive a banned token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from pagedserve.server.sampling.metadata import SamplingMetadata


def apply_repetition_penalty(
    logits: torch.Tensor, seen_mask: torch.Tensor, penalty: torch.Tensor
) -> torch.Tensor:
    """Divide positive and multiply negative logits of seen tokens by the row's ``penalty``."""
    penalty = penalty.unsqueeze(1)
    penalized = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen_mask, penalized, logits)


def apply_presence_frequency_penalties(
    logits: torch.Tensor,
    output_counts: torch.Tensor,
    presence_penalty: torch.Tensor | None,
    frequency_penalty: torch.Tensor | None,
) -> torch.Tensor:
    """OpenAI's definition: ``logit - count * frequency - (count > 0) * presence``."""
    if frequency_penalty is not None:
        logits = logits - output_counts * frequency_penalty.unsqueeze(1)
    if presence_penalty is not None:
        logits = logits - (output_counts > 0) * presence_penalty.unsqueeze(1)
    return logits


def apply_penalties_and_biases(
    logits: torch.Tensor, metadata: SamplingMetadata
) -> torch.Tensor:
    """Run the whole stage; returns ``logits`` itself when no row asked for any of it."""
    if metadata.repetition_penalty is not None:
        seen_mask = metadata.prompt_mask | (metadata.output_counts > 0)
        logits = apply_repetition_penalty(logits, seen_mask, metadata.repetition_penalty)
    if metadata.presence_penalty is not None or metadata.frequency_penalty is not None:
        logits = apply_presence_frequency_penalties(
            logits, metadata.output_counts, metadata.presence_penalty, metadata.frequency_penalty
        )
    if metadata.logit_bias is not None:
        logits = logits + metadata.logit_bias
    if metadata.blocked_mask is not None:
        logits = logits.masked_fill(metadata.blocked_mask, float("-inf"))
    return logits
