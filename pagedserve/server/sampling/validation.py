"""Range checks for the token ids a request names, against the model's vocabulary.

The engine calls ``validate_token_ids`` once when a request arrives, on the request's final
parameters and its bad words' ids, so that a bad id is rejected with a 400 before it is
scheduled. ``SamplingMetadata.build`` calls it for every row unless its caller made
those checks (the engine's sampler does not repeat them each step), so that a bad id can
never reach an index operation on the device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import SamplingParams
from pagedserve.server.sampling.token_masks import min_tokens_banned_ids


def check_ids_in_vocab(param: str, token_ids: Iterable[int], vocab_size: int) -> None:
    """Raise ``InvalidRequestError`` naming ``param`` if an id is outside ``[0, vocab_size)``."""
    ids = list(token_ids)
    if not ids:
        return
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise InvalidRequestError(
            f"{param} must hold token ids in [0, {vocab_size}), got {bad}", param=param
        )


def validate_token_ids(
    params: SamplingParams,
    vocab_size: int,
    eos_token_id: int | None = None,
    bad_words_token_ids: Sequence[Sequence[int]] = (),
) -> None:
    """Check every token id a request names against the vocabulary, and that the bans it asks
    for leave at least one token that can be sampled."""
    if eos_token_id is not None:
        check_ids_in_vocab("eos_token_id", (eos_token_id,), vocab_size)
    check_ids_in_vocab("logit_bias", params.logit_bias.keys(), vocab_size)
    check_ids_in_vocab("allowed_token_ids", params.allowed_token_ids or (), vocab_size)
    check_ids_in_vocab("stop_token_ids", params.stop_token_ids, vocab_size)
    for word in bad_words_token_ids:
        if not word:
            raise InvalidRequestError("bad_words must not tokenize to an empty sequence",
                                      param="bad_words")
        check_ids_in_vocab("bad_words", word, vocab_size)
    _check_something_samplable(params, vocab_size, eos_token_id, bad_words_token_ids)


def _check_something_samplable(
    params: SamplingParams,
    vocab_size: int,
    eos_token_id: int | None,
    bad_words_token_ids: Sequence[Sequence[int]],
) -> None:
    # Only bans known up front are checked; a multi-token bad word that would empty the set
    # at some step is dropped for that step by the metadata builder instead.
    banned = {word[0] for word in bad_words_token_ids if len(word) == 1}
    if params.min_tokens > 0:
        banned.update(min_tokens_banned_ids(params, 0, eos_token_id))
    if params.allowed_token_ids is not None:
        if set(params.allowed_token_ids) <= banned:
            raise InvalidRequestError(
                "allowed_token_ids leaves no token to sample: every allowed id is banned by "
                "bad_words, or by EOS/stop_token_ids while min_tokens is unmet",
                param="allowed_token_ids",
            )
    elif len(banned) >= vocab_size:
        raise InvalidRequestError(
            f"bad_words and stop_token_ids ban all {vocab_size} tokens of the vocabulary",
            param="bad_words",
        )
