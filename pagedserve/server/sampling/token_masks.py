"""Dense ``[N, V]`` tensors for the per-token parameters: ``logit_bias`` and the blocked mask,
with the ids each row may not sample yet (``min_tokens``) or that would complete a bad word.

Both tensors are filled on the device by one indexed write each from flat (row, token) lists, so the
host never materialises an ``[N, V]`` array and nothing loops over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling.sampling_row import SamplingRow


def build_logit_bias(
    params: Sequence[SamplingParams], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """float32 ``[N, V]`` of additive biases, ``None`` when no row has a ``logit_bias``."""
    rows: list[int] = []
    tokens: list[int] = []
    values: list[float] = []
    for i, row_params in enumerate(params):
        rows.extend([i] * len(row_params.logit_bias))
        tokens.extend(row_params.logit_bias.keys())
        values.extend(row_params.logit_bias.values())
    if not rows:
        return None
    bias = torch.zeros(len(params), vocab_size, dtype=torch.float32, device=device)
    bias[_index(rows, device), _index(tokens, device)] = torch.tensor(values).to(device)
    return bias


def build_blocked_mask(
    rows: Sequence[SamplingRow], vocab_size: int, device: torch.device
) -> torch.Tensor | None:
    """bool ``[N, V]``, True where a token may not be sampled this step; ``None`` if none is.

    A token is blocked when it is outside a row's ``allowed_token_ids``, when ``min_tokens``
    holds back EOS and the stop tokens, or when it would complete a bad word.
    """
    restricted: list[int] = []
    allowed_rows: list[int] = []
    allowed_tokens: list[int] = []
    banned_rows: list[int] = []
    banned_tokens: list[int] = []
    for i, row in enumerate(rows):
        allowed = row.params.allowed_token_ids
        if allowed is not None:
            restricted.append(i)
            allowed_rows.extend([i] * len(allowed))
            allowed_tokens.extend(allowed)
        banned = row_banned_ids(row, vocab_size)
        banned_rows.extend([i] * len(banned))
        banned_tokens.extend(banned)
    if not restricted and not banned_rows:
        return None
    mask = torch.zeros(len(rows), vocab_size, dtype=torch.bool, device=device)
    if restricted:
        mask[_index(restricted, device)] = True
        mask[_index(allowed_rows, device), _index(allowed_tokens, device)] = False
    if banned_rows:
        mask[_index(banned_rows, device), _index(banned_tokens, device)] = True
    return mask


def row_banned_ids(row: SamplingRow, vocab_size: int) -> list[int]:
    """The ids ``min_tokens`` and ``bad_words`` ban for this row at this step."""
    output = row.output_token_ids
    banned = min_tokens_banned_ids(row.params, len(output), row.eos_token_id)
    always, this_step = bad_words_banned_ids(row.bad_words_token_ids, output)
    banned.extend(always)
    # Validation guarantees the fixed bans leave a token to sample; a word-completion ban
    # that would leave none yields, because the step must produce some token.
    if this_step and _leaves_nothing(row.params.allowed_token_ids, banned + this_step,
                                     vocab_size):
        return banned
    return banned + this_step


def _leaves_nothing(allowed: Sequence[int] | None, banned: list[int], vocab_size: int) -> bool:
    if allowed is None:
        return len(set(banned)) >= vocab_size
    return set(allowed) <= set(banned)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


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
