"""Streaming token ids → text, one step's new tokens at a time.

The detokenizer works on bytes: each new token's bytes (``Tokenizer.token_bytes``) go through
an incremental UTF-8 decoder, which returns every character as soon as its last byte arrives
and holds back the bytes of a character still in progress. So a delta never ends in a broken
character, a call costs O(new tokens) whatever the sequence length, and the deltas joined equal
``decode(output_ids)`` for byte-level BPE and tiktoken vocabularies (invalid UTF-8 included:
both decode it to U+FFFD per maximal invalid subsequence).

The prompt matters for one thing, the first word's space. A SentencePiece vocabulary writes
``" Paris"`` as ``▁Paris`` and its decoder drops that space at the start of a text; the output
continues the prompt, so the space is real and is kept, as vLLM keeps it by decoding with prompt
context. Only when the prompt has no text (empty, or special tokens that are skipped) is the
output's first space dropped, as ``decode`` drops it.

Call ``flush`` when the sequence ends: bytes of a character the model never finished come out
as U+FFFD, as ``decode`` renders them.
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Iterable, Sequence

from pagedserve.server.tokenizer.base import Tokenizer

_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class IncrementalDetokenizer:
    """The text of one sequence's output tokens, delivered as deltas."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skipped = tokenizer.all_special_ids if skip_special_tokens else frozenset()
        self._utf8 = _Utf8Decoder(errors="replace")
        self._strip_space = tokenizer.strips_leading_space and all(
            token_id in self._skipped for token_id in prompt_token_ids
        )

    def add_tokens(self, new_token_ids: Iterable[int]) -> str:
        """The text completed by ``new_token_ids``: whole characters only. An id the
        tokenizer has no text for adds nothing, and a character in progress carries on
        across it, as ``decode`` joins the bytes around it."""
        token_bytes = self._tokenizer.token_bytes
        data = b"".join(token_bytes(t) for t in new_token_ids if t not in self._skipped)
        if self._strip_space and data:
            data = data.removeprefix(b" ")
            self._strip_space = False
        return self._utf8.decode(data)

    def flush(self) -> str:
        """The held-back bytes of an unfinished character, as U+FFFD ('' if none)."""
        return self._utf8.decode(b"", final=True)

    def fork(self) -> IncrementalDetokenizer:
        """An independent copy in the same state, for a sequence forked from this one."""
        child = copy.copy(self)
        child._utf8 = _Utf8Decoder(errors="replace")
        child._utf8.setstate(self._utf8.getstate())
        return child
