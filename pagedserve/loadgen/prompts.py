"""Prompts of exact token lengths, measured with the tokenizer the run counts with.

A prompt is a run of pieces that each cost one token (``pieces.py``: common English words,
or the tokenizer's own tokens where it splits those words), so a prompt of k pieces is about
k tokens plus whatever the tokenizer adds (a BOS token). The last adjustment is made by
counting whole prompts and adding or dropping pieces at the tail until the count is exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pagedserve.loadgen.bench_errors import DatasetError
from pagedserve.loadgen.pieces import select_pieces
from pagedserve.loadgen.tokenizers import TokenCounter

# Pieces that merge with their neighbours (sub-word tokens) can take a few more rounds.
MAX_ROUNDS = 32


class PromptBuilder:
    """Builds prompts whose token counts equal the requested targets exactly."""

    def __init__(self, counter: TokenCounter, rng: np.random.Generator) -> None:
        self._counter = counter
        self._rng = rng
        self._vocab: tuple[str, ...] = ()

    async def _ensure_vocab(self) -> None:
        if not self._vocab:
            self._vocab = await select_pieces(self._counter)

    async def build(self, targets: Sequence[int], prefixes: Sequence[str] | None = None,
                    prefix_tokens: Sequence[int] | None = None) -> list[str]:
        """One prompt per target: its prefix (kept intact) then words adjusted to fit.

        ``prefix_tokens`` is the prefix's own count, the first guess of how many tokens it
        contributes; the counts of the full prompts settle the rest.
        """
        for target in targets:
            if target < 1:
                raise DatasetError(f"prompt length must be at least 1 token, got {target}")
        await self._ensure_vocab()
        prefixes = list(prefixes) if prefixes is not None else [""] * len(targets)
        guesses = list(prefix_tokens) if prefix_tokens is not None else [0] * len(targets)
        tails = [self._words(max(t - g, 0)) for t, g in zip(targets, guesses, strict=True)]
        pending = list(range(len(targets)))
        for _ in range(MAX_ROUNDS):
            if not pending:
                break
            counts = await self._counter.count([prefixes[i] + "".join(tails[i]) for i in pending])
            pending = [i for i, got in zip(pending, counts, strict=True)
                       if self._adjust(tails[i], targets[i], got, prefixes[i])]
        if pending:
            i = pending[0]
            raise DatasetError(f"could not build a prompt of exactly {targets[i]} tokens with "
                               f"tokenizer {self._counter.name!r} in {MAX_ROUNDS} rounds")
        return [prefix + "".join(tail) for prefix, tail in zip(prefixes, tails, strict=True)]

    def _words(self, num_words: int) -> list[str]:
        picks = self._rng.integers(0, len(self._vocab), size=num_words)
        return [self._vocab[i] for i in picks]

    def _adjust(self, tail: list[str], target: int, got: int, prefix: str) -> bool:
        """Grows or trims ``tail`` toward ``target``; True when another count is needed."""
        if got == target:
            return False
        if got < target:
            tail.extend(self._words(target - got))
            return True
        if not tail:
            raise DatasetError(
                f"cannot fit a prompt into {target} tokens with tokenizer "
                f"{self._counter.name!r}: the fixed part alone ({prefix[:40]!r}…) counts "
                f"{got} tokens")
        # A piece costs at least one token, more where it merges badly with its neighbours.
        del tail[max(len(tail) - (got - target), 0):]
        return True
