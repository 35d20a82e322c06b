"""The token-level stop rule: EOS, ``stop_token_ids`` and ``max_tokens``.

Stop strings need detokenized text and live with the detokenizer; this is the part that only
needs the token id, kept pure so the engine and its tests can share one definition.
"""

from __future__ import annotations

from typing import Literal

from pagedserve.server.sampling_params import SamplingParams

FinishReason = Literal["stop", "length"]


def check_stop_token(
    params: SamplingParams,
    output_len: int,
    token_id: int,
    eos_token_id: int | None,
) -> tuple[FinishReason | None, int | None]:
    """Decide whether the token just appended ends the sequence.

    ``output_len`` counts the generated tokens including ``token_id``. Returns
    ``(finish_reason, stop_reason)``: ``("stop", None)`` for EOS, ``("stop", token_id)`` for a
    member of ``stop_token_ids``, ``("length", None)`` at ``max_tokens``, ``(None, None)`` to
    continue. Nothing stops before ``min_tokens`` tokens exist.
    """
    if output_len < params.min_tokens:
        return None, None
    # A stop token in the last allowed position reports "stop", as OpenAI and vLLM do: the
    # model chose to end there, the cap did not cut it off.
    if not params.ignore_eos and eos_token_id is not None and token_id == eos_token_id:
        return "stop", None
    if token_id in params.stop_token_ids:
        return "stop", token_id
    if params.max_tokens is not None and output_len >= params.max_tokens:
        return "length", None
    return None, None
