"""``SamplingRow``: one sequence that samples a token this step, as the sampler's inputs see
it (the engine builds one per sampling sequence; ``SamplingMetadata`` packs them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.common.sampling_params import SamplingParams

if TYPE_CHECKING:
    from pagedserve.server.sampling.grammar import GrammarState


@dataclass(slots=True)
class SamplingRow:
    """One sequence that samples a token this step.

    ``seed`` is the effective seed of this sample (the engine passes ``params.seed + i`` for
    sample ``i``), ``None`` for unseeded sampling. ``bad_words_token_ids`` holds
    ``params.bad_words`` already tokenized, one id sequence per word. ``grammar`` is the
    sequence's place in its structured-output grammar, ``None`` for free text.
    """

    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    seed: int | None = None
    eos_token_id: int | None = None
    bad_words_token_ids: Sequence[Sequence[int]] = ()
    grammar: GrammarState | None = None
