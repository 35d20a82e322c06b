"""The engine's per-position logprobs in each endpoint's OpenAI shape.

Completions: ``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, parallel lists,
``top_logprobs`` holding the chosen token and the requested top k (so up to k + 1 entries,
as OpenAI documents). Chat: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``
with exactly the top k. Both are built incrementally so a stream's chunks carry only their
own tokens while ``text_offset`` keeps counting from the start of the text.
"""

from __future__ import annotations

import codecs
from typing import Any

from pagedserve.server.engine.core.outputs import Logprob, PositionLogprobs
from pagedserve.server.tokenizer.base import Tokenizer

# OpenAI reports a log probability of -inf (a banned token) as this finite value, which
# JSON can carry.
MIN_LOGPROB = -9999.0


def _clamp(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text on its own; a token holding part of a character shows U+FFFD."""
    return tokenizer.token_bytes(token_id).decode("utf-8", errors="replace")


def token_label(tokenizer: Tokenizer, token_id: int, as_id: bool) -> str:
    """How logprobs name a token: its text, or with vLLM's ``return_tokens_as_token_ids``
    ``"token_id:{id}"``, which tells apart tokens whose texts are equal (two partial
    characters both show U+FFFD) and maps back to the id."""
    return f"token_id:{token_id}" if as_id else token_text(tokenizer, token_id)


def _padded(token_ids: list[int],
            positions: list[PositionLogprobs | None]) -> list[PositionLogprobs | None]:
    # A position the engine has no logprobs for reads as None, never as a dropped token.
    return list(positions) + [None] * (len(token_ids) - len(positions))


def _ranked(position: PositionLogprobs) -> list[tuple[int, float]]:
    return sorted(((t, lp.logprob) for t, lp in position.items()), key=lambda e: -e[1])


class CompletionLogprobs:
    """Builds completions-style logprobs for consecutive tokens of one text."""

    def __init__(self, tokenizer: Tokenizer, start_offset: int, skip_special_tokens: bool,
                 tokens_as_ids: bool = False):
        self._tokenizer = tokenizer
        self._as_ids = tokens_as_ids
        self._skip = tokenizer.all_special_ids if skip_special_tokens else frozenset()
        self._offset = start_offset
        # Offsets count characters of the decoded text; a character split across tokens
        # belongs to the token where it starts.
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def extend(self, token_ids: list[int],
               positions: list[PositionLogprobs | None]) -> dict[str, list[Any]]:
        tokens: list[str] = []
        token_logprobs: list[float | None] = []
        top_logprobs: list[dict[str, float] | None] = []
        text_offset: list[int] = []
        for token_id, position in zip(token_ids, _padded(token_ids, positions), strict=True):
            tokens.append(token_label(self._tokenizer, token_id, self._as_ids))
            text_offset.append(self._offset)
            if token_id not in self._skip:
                self._offset += len(self._decoder.decode(self._tokenizer.token_bytes(token_id)))
            if position is None:  # the first prompt token has no logprob
                token_logprobs.append(None)
                top_logprobs.append(None)
                continue
            chosen = position.get(token_id)
            token_logprobs.append(_clamp(chosen.logprob) if chosen is not None else None)
            top_logprobs.append({token_label(self._tokenizer, t, self._as_ids): _clamp(lp)
                                 for t, lp in _ranked(position)})
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top_logprobs,
            "text_offset": text_offset,
        }


def chat_logprobs(tokenizer: Tokenizer, token_ids: list[int],
                  positions: list[PositionLogprobs | None], top_k: int,
                  tokens_as_ids: bool = False) -> dict[str, Any]:
    content = []
    for token_id, position in zip(token_ids, _padded(token_ids, positions), strict=True):
        position = position or {}
        chosen = position.get(token_id)
        logprob = chosen.logprob if chosen else MIN_LOGPROB
        content.append({
            **_chat_token(tokenizer, token_id, logprob, tokens_as_ids),
            "top_logprobs": [_chat_token(tokenizer, t, lp, tokens_as_ids)
                             for t, lp in _ranked(position)[:top_k]],
        })
    return {"content": content}


def _chat_token(tokenizer: Tokenizer, token_id: int, logprob: float,
                as_id: bool) -> dict[str, Any]:
    # With token ids as names, "bytes" are the name's, as vLLM sends them.
    raw = f"token_id:{token_id}".encode() if as_id else tokenizer.token_bytes(token_id)
    return {
        "token": raw.decode("utf-8", errors="replace"),
        "logprob": _clamp(logprob),
        "bytes": list(raw),
    }


def vllm_prompt_logprobs(tokenizer: Tokenizer | None,
                         positions: list[PositionLogprobs | None] | None,
                         tokens_as_ids: bool = False) -> list[dict[str, Any] | None] | None:
    """vLLM's ``prompt_logprobs``: per prompt position, token id → logprob, rank, text (or
    the ``"token_id:{id}"`` name)."""
    if positions is None:
        return None
    return [
        None if position is None else {
            str(token_id): {
                "logprob": lp.logprob,
                "rank": lp.rank,
                "decoded_token": (f"token_id:{token_id}" if tokens_as_ids
                                  else _decoded(tokenizer, token_id, lp)),
            }
            for token_id, lp in position.items()
        }
        for position in positions
    ]


def _decoded(tokenizer: Tokenizer | None, token_id: int, logprob: Logprob) -> str | None:
    if logprob.decoded_token is not None or tokenizer is None:
        return logprob.decoded_token
    return token_text(tokenizer, token_id)
