"""The pieces prompts of exact lengths are built from: short texts that cost one token each.

The first choice is common English words, each a single ``cl100k_base`` token with its
leading space: a fixed sample of them is counted with the run's tokenizer, once and doubled,
and a word is kept when doubling it adds exactly one token (whatever the tokenizer adds to
every text, a BOS say, cancels out). Large vocabularies keep most of them.

A small or byte-level vocabulary splits nearly every word, so the pieces then come from the
tokenizer's own vocabulary, as vLLM's client samples token ids: the shipped sonnets are split
into tokens, each distinct token is decoded after a fixed first token (whose text is cut off
again, since SentencePiece decoders drop the space of a text's first token), and the texts
are probed the same way. Pieces that start with a space are preferred when there are enough
of them: a pre-tokenizer cuts before a space, so such pieces do not merge with their
neighbours. The prompt builder counts whole prompts and repairs the tail, so a merge across
pieces costs a round, never the exact length.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from pagedserve.common.encoding import load_encoding
from pagedserve.loadgen.bench_errors import DatasetError
from pagedserve.loadgen.sonnet import read_poem_lines
from pagedserve.loadgen.tokenizers import TokenCounter, TokenSplitter

_WORD = re.compile(r"^ [a-z]{3,9}$")
PROBE_WORDS = 1024
MIN_KEPT_WORDS = 64
MIN_KEPT_PIECES = 16
_UNDECODABLE = "\ufffd"  # a token that is only part of a character decodes to this


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


def probe_words() -> list[str]:
    """A fixed sample of the words, so the pieces do not depend on the dataset's seed."""
    words = word_vocabulary()
    picks = np.random.default_rng(0).choice(len(words), size=PROBE_WORDS, replace=False)
    return [words[i] for i in sorted(picks)]


async def unit_costs(counter: TokenCounter, texts: Sequence[str]) -> list[int]:
    """What one more copy of each text adds to its count: 1 for a text read as one token."""
    counts = await counter.count([*texts, *(t + t for t in texts)])
    return [twice - once for once, twice in zip(counts[:len(texts)], counts[len(texts):])]


async def select_pieces(counter: TokenCounter) -> tuple[str, ...]:
    """The pieces to build prompts from: the words the tokenizer keeps whole, else its own
    tokens. Raises ``DatasetError`` when neither gives enough."""
    words = probe_words()
    costs = await unit_costs(counter, words)
    kept = [w for w, cost in zip(words, costs, strict=True) if cost == 1]
    if len(kept) >= MIN_KEPT_WORDS:
        return tuple(kept)
    if not isinstance(counter, TokenSplitter):
        raise DatasetError(
            f"tokenizer {counter.name!r} splits common English words: only {len(kept)} of "
            f"{len(words)} probe words are single tokens (most cost "
            f"{Counter(costs).most_common(1)[0][0]}), and it cannot split a text into its "
            f"tokens to use those instead; count with a tiktoken encoding "
            f"(--tokenizer cl100k_base) or the server's tokenizer (--tokenizer server)")
    return await _token_pieces(counter)


async def token_texts(counter: TokenSplitter, text: str) -> list[str]:
    """The text of each distinct token of ``text``, as it reads after another token."""
    ids = list(dict.fromkeys(await counter.tokens(text)))
    if not ids:
        return []
    anchor = ids[0]
    head, *texts = await counter.decode([[anchor], *([anchor, t] for t in ids)])
    return [t[len(head):] for t in texts if t.startswith(head)]


async def _token_pieces(counter: TokenSplitter) -> tuple[str, ...]:
    texts = await token_texts(counter, "".join(read_poem_lines()))
    candidates = [t for t in dict.fromkeys(texts) if t and _UNDECODABLE not in t]
    costs = await unit_costs(counter, candidates)
    kept = [t for t, cost in zip(candidates, costs, strict=True) if cost == 1]
    spaced = [t for t in kept if len(t) > 1 and t[0] == " " and not t[1].isspace()]
    if len(spaced) >= MIN_KEPT_PIECES:
        return tuple(spaced)
    if len(kept) >= MIN_KEPT_PIECES:
        return tuple(kept)
    raise DatasetError(
        f"tokenizer {counter.name!r} reads only {len(kept)} of the {len(candidates)} distinct "
        f"tokens of the sonnet text as one token each, too few to build prompts of exact "
        f"lengths")
