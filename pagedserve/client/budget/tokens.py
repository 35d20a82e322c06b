"""Counting a request's tokens before it is sent, to reserve them from a ``TokenBudget``.

Three counters: ``TiktokenCounter`` (``cl100k_base`` by default, offline), ``ServerTokenCounter``
(exact counts from a pagedserve or vLLM server's ``POST /tokenize``) and ``CallableCounter``
(any function). ``reserved_tokens`` turns a count into the reservation
``prompt_tokens + prompts × width × max_tokens``.

Chat messages are counted as OpenAI documents for its chat models: 3 tokens of framing per
message, the tokens of every field's value (role and content included), 1 more for a
``name`` field, and 3 for the framing that primes the reply. A Responses API body counts as
the chat messages its ``input`` and ``instructions`` make.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from pagedserve.client.api.client_errors import InvalidRequestError
from pagedserve.common.encoding import load_encoding

if TYPE_CHECKING:
    from pagedserve.client.api.client import AsyncClient

EndpointKind = Literal["completions", "chat", "responses"]

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING_TOKENS = 3
# OpenAI's default max_tokens for /v1/completions; chat has none (up to the context).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass(slots=True, frozen=True)
class PromptCount:
    """Prompt tokens of one request (all its prompts together) and the server's context
    length when the counter learnt it."""

    tokens: int
    max_model_len: int | None = None


class TokenCounter(ABC):
    @abstractmethod
    async def count(self, kind: EndpointKind, body: Mapping[str, Any]) -> PromptCount:
        """The prompt tokens of a request body for ``kind``."""


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) for t in value)


def split_prompts(prompt: object) -> list[str | list[int]]:
    """The prompts of a completions request: one string, one list of token ids, or a list of
    either."""
    if isinstance(prompt, str) or (_is_token_ids(prompt) and prompt):
        return [prompt]  # type: ignore[list-item]
    if isinstance(prompt, list) and prompt and all(
        isinstance(p, str) or _is_token_ids(p) for p in prompt
    ):
        return list(prompt)
    raise InvalidRequestError.expected(
        "prompt", prompt, "a string, a list of token ids, or a non-empty list of either"
    )


def _messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError.expected("messages", messages,
                                           "a non-empty list of message objects")
    if not all(isinstance(m, Mapping) for m in messages):
        raise InvalidRequestError.expected("messages", messages, "a list of message objects")
    return messages


def response_messages(body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A Responses API body's ``input`` (and ``instructions``, a leading system message) as
    the chat messages a server renders it into; ``input_text`` / ``output_text`` parts as
    text parts."""
    value = body.get("input")
    if isinstance(value, str):
        messages: list[Mapping[str, Any]] = [{"role": "user", "content": value}]
    elif isinstance(value, list) and value and all(isinstance(m, Mapping) for m in value):
        messages = [{"role": m.get("role"), "content": _text_parts(m.get("content"))}
                    for m in value]
    else:
        raise InvalidRequestError.expected("input", value,
                                           "a string or a non-empty list of messages")
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.insert(0, {"role": "system", "content": instructions})
    return messages


def _text_parts(content: object) -> object:
    if not isinstance(content, list):
        return content
    return [{"type": "text", "text": p.get("text", "")} if isinstance(p, Mapping)
            and p.get("type") in ("input_text", "output_text") else p for p in content]


def _conversation(kind: EndpointKind, body: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return response_messages(body) if kind == "responses" else _messages(body)


class TiktokenCounter(TokenCounter):
    """Counts with a tiktoken encoding; special-token text in a prompt counts as plain text,
    since that is how a server reads untrusted input."""

    def __init__(self, encoding: str = "cl100k_base") -> None:
        self.encoding = load_encoding(encoding)

    def count_text(self, text: str) -> int:
        return len(self.encoding.encode_ordinary(text))

    def count_prompt(self, prompt: object) -> int:
        return sum(
            len(p) if isinstance(p, list) else self.count_text(p) for p in split_prompts(prompt)
        )

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        total = REPLY_PRIMING_TOKENS
        for message in messages:
            total += TOKENS_PER_MESSAGE
            for key, value in message.items():
                total += self.count_text(_message_value_text(value))
                if key == "name":
                    total += TOKENS_PER_NAME
        return total

    async def count(self, kind: EndpointKind, body: Mapping[str, Any]) -> PromptCount:
        if kind != "completions":
            return PromptCount(self.count_messages(_conversation(kind, body)))
        return PromptCount(self.count_prompt(body.get("prompt")))


def _message_value_text(value: object) -> str:
    """The text a message field contributes: strings as they are, the text parts of a
    multi-part content list, anything else (tool calls) as its JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, Mapping) for p in value):
        return "".join(str(p.get("text", "")) for p in value if p.get("type") == "text")
    return orjson.dumps(value).decode()


class ServerTokenCounter(TokenCounter):
    """Exact counts from the server's own tokenizer and chat template (``POST /tokenize``)."""

    def __init__(self, client: AsyncClient, model: str | None = None) -> None:
        self.client = client
        self.model = model

    def _model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model") or self.model
        if not isinstance(model, str) or not model:
            raise InvalidRequestError.expected("model", model, "a model name to tokenize with")
        return model

    async def count(self, kind: EndpointKind, body: Mapping[str, Any]) -> PromptCount:
        model = self._model(body)
        if kind != "completions":
            result = await self.client.tokenize(model, messages=_conversation(kind, body))
            return PromptCount(result.count, result.max_model_len)
        tokens, max_model_len = 0, None
        for prompt in split_prompts(body.get("prompt")):
            if isinstance(prompt, list):
                tokens += len(prompt)
                continue
            result = await self.client.tokenize(model, prompt=prompt)
            tokens += result.count
            max_model_len = result.max_model_len
        return PromptCount(tokens, max_model_len)


class CallableCounter(TokenCounter):
    """Wraps ``fn(kind, body) -> int`` (or a coroutine function) returning prompt tokens."""

    def __init__(self, fn: Callable[[EndpointKind, Mapping[str, Any]], int | Awaitable[int]]):
        self.fn = fn

    async def count(self, kind: EndpointKind, body: Mapping[str, Any]) -> PromptCount:
        value = self.fn(kind, body)
        if inspect.isawaitable(value):
            value = await value
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidRequestError.expected("token count", value, "a non-negative int")
        return PromptCount(value)


def _count_param(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequestError.expected(name, value, "a non-negative integer")
    return value


def reserved_tokens(
    kind: EndpointKind,
    body: Mapping[str, Any],
    count: PromptCount,
    default_max_tokens: int,
) -> int:
    """In-flight tokens a request can occupy on the server: its prompts plus, for each
    prompt, ``width × max_tokens`` generated tokens, where width covers ``n``, ``best_of``
    and beam search. Without ``max_tokens`` (``max_output_tokens`` for responses),
    completions use OpenAI's default of 16, and chat and responses the rest of the context
    when known, else ``default_max_tokens``."""
    n = _count_param(body, "n", 1) or 1
    best_of = _count_param(body, "best_of", None) or n
    width = max(n, best_of)
    max_tokens = _count_param(body, "max_completion_tokens", None)
    if max_tokens is None:
        max_tokens = _count_param(body, "max_tokens", None)
    if kind == "responses":
        max_tokens = _count_param(body, "max_output_tokens", None)
    num_prompts = 1
    if kind == "completions":
        num_prompts = len(split_prompts(body.get("prompt")))
        if max_tokens is None:
            max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    elif max_tokens is None:
        known = count.max_model_len
        max_tokens = known - count.tokens if known else default_max_tokens
    return count.tokens + num_prompts * width * max(max_tokens, 0)
