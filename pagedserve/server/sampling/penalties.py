"""Penalties, biases and bans: the first stage of logits processing, applied to every row.

Order: repetition penalty (on the model's logits, as transformers defines it), presence and
frequency penalties, ``logit_bias``, then the blocked-token mask (``allowed_token_ids``,
``min_tokens``, ``bad_words``). Biases come after the penalties so that a bias keeps its
literal meaning of "add this to the logit that is sampled from", and the mask comes last so
that no bias can revive a banned token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from pagedserve.common.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedserve.server.sampling.metadata import SamplingMetadata


def min_tokens_banned_ids(
    params: SamplingParams, output_len: int, eos_token_id: int | None
) -> list[int]:
    """Ids that may not be sampled yet because fewer than ``min_tokens`` tokens exist.

    EOS is banned even under ``ignore_eos``, as in vLLM: ``min_tokens`` promises that many
    tokens of real text before an end-of-text token shows up in the output at all.
    """
    if output_len >= params.min_tokens:
        return []
    banned = list(params.stop_token_ids)
    if eos_token_id is not None:
        banned.append(eos_token_id)
    return banned


def bad_words_banned_ids(
    bad_words_token_ids: Sequence[Sequence[int]], output_token_ids: Sequence[int]
) -> tuple[list[int], list[int]]:
    """Ids that would complete a bad word: ``(always, this_step)``.

    A one-token word is always banned. A longer word bans its last token only when the
    output already ends with the rest of the word; the prompt does not count, as in vLLM.
    """
    always: list[int] = []
    this_step: list[int] = []
    for word in bad_words_token_ids:
        prefix_len = len(word) - 1
        if prefix_len == 0:
            always.append(word[0])
        elif prefix_len <= len(output_token_ids) and _ends_with(output_token_ids, word[:-1]):
            this_step.append(word[-1])
    return always, this_step


def _ends_with(tokens: Sequence[int], suffix: Sequence[int]) -> bool:
    return list(tokens[len(tokens) - len(suffix):]) == list(suffix)


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
