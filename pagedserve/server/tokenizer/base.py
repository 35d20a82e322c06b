"""The tokenizer interface the engine and the server use, whatever library backs it.

A backend sets the attributes below in its constructor and implements ``encode``, ``decode``
and ``token_bytes``; chat-template rendering is shared. ``token_bytes`` is what makes
incremental detokenization exact: the text of a token sequence is the UTF-8 decoding of the
concatenation of its tokens' bytes (special tokens left out when they are skipped).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer.chat_encoding import encode_chat
from pagedserve.server.tokenizer.chat_template import render_chat_template
from pagedserve.server.tokenizer.tokenizer_load_error import TokenizerLoadError

__all__ = ["Tokenizer", "TokenizerLoadError"]


class Tokenizer(ABC):
    """Text ↔ token ids for one model.

    Attributes:
        name: a short label (the checkpoint directory's name, or the tiktoken encoding).
        vocab_size: one more than the largest id the tokenizer has text for; an id below it
            may still be unassigned (tiktoken encodings have gaps). The model's vocabulary
            may be larger.
        bos_token_id / eos_token_id: the beginning- and end-of-sequence ids, or None.
        all_special_ids: the ids ``decode(..., skip_special_tokens=True)`` leaves out.
        special_tokens_map: the named special tokens as text (``bos_token``, ``eos_token``,
            ...); chat templates see them as variables.
        chat_template: the model's Jinja chat template, or None for the default one.
        strips_leading_space: the decoder drops the space its first token carries
            (SentencePiece-style ``▁word`` vocabularies), so a text's first word has none.
        special_texts: the texts ``encode`` turns into special ids where they occur.
    """

    name: str
    vocab_size: int
    bos_token_id: int | None
    eos_token_id: int | None
    all_special_ids: frozenset[int]
    special_tokens_map: Mapping[str, str]
    chat_template: str | None
    strips_leading_space: bool = False
    special_texts: frozenset[str] = frozenset()

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` adds the model's BOS/EOS framing."""

    @abstractmethod
    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: special-token text in it is spelled out, and
        no BOS/EOS is added."""

    @abstractmethod
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; invalid UTF-8 becomes U+FFFD, an id without text "".

        Raises InvalidRequestError for a negative id.
        """

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The bytes ``token_id`` contributes to a decoded text (possibly part of a character);
        b"" for an id the tokenizer has no token for.

        Raises InvalidRequestError for a negative id.
        """

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True,
        continue_final_message: bool = False, variables: Mapping[str, object] | None = None,
    ) -> str:
        """The prompt text for a chat; see ``chat_template`` for validation and the default.

        The rendered text already carries whatever special tokens the template writes (often
        the BOS), so encode it with ``add_special_tokens=False``.
        """
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens_map,
            continue_final_message=continue_final_message,
            variables=variables,
        )

    def encode_chat(
        self, messages: Sequence[Mapping[str, object]], add_generation_prompt: bool = True,
        continue_final_message: bool = False, variables: Mapping[str, object] | None = None,
        add_special_tokens: bool = False, allow_special_tokens_in_content: bool = False,
    ) -> tuple[str, list[int]]:
        """The prompt text of a chat and its ids, with special-token text inside the
        messages' contents kept as text (see ``chat_encoding``) unless
        ``allow_special_tokens_in_content``."""
        return encode_chat(
            self, messages, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, variables=variables,
            add_special_tokens=add_special_tokens,
            allow_special_tokens_in_content=allow_special_tokens_in_content)

    def negative_token_error(self, token_id: int) -> InvalidRequestError:
        """The error for an id no vocabulary has."""
        return InvalidRequestError(f"token ids must be non-negative, got {token_id}",
                                   param="token_ids")
