"""Prompts of exact token lengths, measured with the tokenizer the run counts with.

A prompt is a run of common English words, each a single ``cl100k_base`` token with its
leading space. Before building, a fixed sample of those words is counted with the run's
tokenizer, once and repeated, and only the words that cost one token are kept: for
cl100k_base all of them, for another tokenizer the ones it also keeps whole. A prompt of k
kept words is then k tokens plus whatever the tokenizer adds (a BOS token), and the last
adjustment is made by counting whole prompts and adding or dropping words at the tail until
the count is exact.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from pagedserve.common.encoding import load_encoding
from pagedserve.loadgen.errors import DatasetError
from pagedserve.loadgen.tokenizers import TokenCounter

_WORD = re.compile(r"^ [a-z]{3,9}$")
MAX_ROUNDS = 16
PROBE_WORDS = 1024
MIN_KEPT_WORDS = 64


@lru_cache(maxsize=1)
def word_vocabulary() -> tuple[str, ...]:
    """Every ``cl100k_base`` token that is a space and 3–9 lowercase letters, in id order."""
    encoding = load_encoding("cl100k_base")
    words = []
    for token_id in range(encoding.n_vocab):
        try:
            piece = encoding.decode_single_token_bytes(token_id)
        except KeyError:  # ids with no token (gaps before the special tokens)
            continue
        if piece.isascii() and _WORD.match(piece.decode("ascii")):
            words.append(piece.decode("ascii"))
    return tuple(words)


class PromptBuilder:
    """Builds prompts whose token counts equal the requested targets exactly."""

    def __init__(self, counter: TokenCounter, rng: np.random.Generator) -> None:
        self._counter = counter
        self._rng = rng
        self._vocab: tuple[str, ...] = ()

    async def _ensure_vocab(self) -> None:
        """Keeps the probe words the tokenizer reads as one token each: a word is kept when
        repeating it adds exactly one token (whatever the tokenizer adds to every prompt, a
        BOS say, cancels out). Refuses a tokenizer that splits nearly all of them, since
        whole-word prompts could then not hit every length exactly."""
        if self._vocab:
            return
        words = word_vocabulary()
        # A fixed probe sample, so the vocabulary does not depend on the dataset's seed.
        picks = np.random.default_rng(0).choice(len(words), size=PROBE_WORDS, replace=False)
        probe = [words[i] for i in sorted(picks)]
        counts = await self._counter.count(probe + [w + w for w in probe])
        costs = [twice - once for once, twice in zip(counts[:len(probe)], counts[len(probe):])]
        kept = tuple(w for w, cost in zip(probe, costs, strict=True) if cost == 1)
        if len(kept) < MIN_KEPT_WORDS:
            raise DatasetError(
                f"tokenizer {self._counter.name!r} splits common English words: only "
                f"{len(kept)} of {len(probe)} probe words are single tokens (most cost "
                f"{Counter(costs).most_common(1)[0][0]}), too few to build prompts of exact "
                f"lengths; count with a tiktoken encoding instead (--tokenizer cl100k_base)")
        self._vocab = kept

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
        excess = got - target
        if excess > len(tail):
            raise DatasetError(
                f"cannot fit a prompt into {target} tokens with tokenizer "
                f"{self._counter.name!r}: the fixed part alone ({prefix[:40]!r}…) counts "
                f"{got - len(tail)} or more tokens")
        del tail[len(tail) - excess:]
        return True
