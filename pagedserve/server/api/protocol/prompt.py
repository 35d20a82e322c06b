"""vLLM's prompt-encoding fields, which completions and chat share: ``add_special_tokens``
(whether the tokenizer adds its special tokens, such as a BOS, to a text prompt: on by
default for completions, off for chat, whose template writes its own) and
``truncate_prompt_tokens`` (keep only the prompt's last k tokens; -1 keeps the model's
``max_model_len``)."""

from __future__ import annotations

from dataclasses import dataclass

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.fields import Fields

_TRUNCATE = "truncate_prompt_tokens"


@dataclass(frozen=True, slots=True)
class PromptEncoding:
    add_special_tokens: bool
    truncate_prompt_tokens: int | None = None

    def truncate(self, token_ids: list[int], max_model_len: int) -> list[int]:
        """The last ``truncate_prompt_tokens`` of ``token_ids`` (all of them when shorter,
        or when the field was not given)."""
        keep = self.truncate_prompt_tokens
        if keep is None:
            return token_ids
        if keep == -1:
            keep = max_model_len
        if keep > max_model_len:
            raise InvalidRequestError(
                f"{_TRUNCATE} must be at most the model's max_model_len ({max_model_len}), "
                f"got {keep}", param=_TRUNCATE)
        return token_ids[-keep:]


def read_prompt_encoding(fields: Fields, add_special_tokens: bool) -> PromptEncoding:
    add = fields.boolean("add_special_tokens", add_special_tokens)
    keep = fields.integer(_TRUNCATE, minimum=-1)
    if keep == 0:
        raise InvalidRequestError(f"{_TRUNCATE} must be -1 (the model's max_model_len) or at "
                                  "least 1, got 0", param=_TRUNCATE)
    return PromptEncoding(add, keep)
