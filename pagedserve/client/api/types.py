"""Typed views of OpenAI-shaped responses and stream chunks.

Each type keeps the JSON it was parsed from in ``raw`` so that nothing a server adds (vLLM's
extra fields, for instance) is lost when a result is written back out. Parsing is lenient
about optional fields, strict about the ones every OpenAI-compatible server sends.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from multidict import CIMultiDict

from pagedserve.client.api.client_errors import APIResponseValidationError

T = TypeVar("T")
ChoiceParser = Callable[[dict[str, Any]], Any]


def parse_response(from_dict: Callable[..., T], data: Any, *args: Any) -> T:
    """``from_dict(data, *args)``, with a malformed answer reported as the server's fault."""
    try:
        return from_dict(data, *args)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise APIResponseValidationError(f"unexpected response shape: {exc!r}", body=data) from exc


def require_field(data: Any, key: str, what: str) -> Any:
    """``data[key]``, or the server's fault reported when ``data`` has no such field."""
    if not isinstance(data, dict) or key not in data:
        raise APIResponseValidationError(f"{what} has no {key!r} field", body=data)
    return data[key]


def _parse_answer(
    cls: Callable[..., T],
    data: dict[str, Any],
    headers: Mapping[str, str] | None,
    choice: ChoiceParser,
    what: str,
) -> T:
    """A ``Completion`` or ``ChatCompletion``: they differ only in how a choice is parsed."""
    choices = require_field(data, "choices", what)
    return cls(
        id=str(data.get("id", "")),
        model=str(data.get("model", "")),
        created=int(data.get("created") or 0),
        choices=[choice(c) for c in choices],
        usage=Usage.from_dict(data.get("usage")),
        raw=data,
        response_headers=CIMultiDict(headers or {}),
    )


def _parse_chunk(
    cls: Callable[..., T], data: dict[str, Any], choice: ChoiceParser, what: str
) -> T:
    """A ``CompletionChunk`` or ``ChatCompletionChunk``; as ``_parse_answer``, less two fields."""
    choices = [choice(c) for c in require_field(data, "choices", what)]
    return cls(
        id=str(data.get("id", "")),
        model=str(data.get("model", "")),
        choices=choices,
        usage=Usage.from_dict(data.get("usage")),
        raw=data,
    )


@dataclass(slots=True, frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Usage | None:
        if not data:
            return None
        prompt = int(data.get("prompt_tokens") or 0)
        completion = int(data.get("completion_tokens") or 0)
        return cls(prompt, completion, int(data.get("total_tokens") or prompt + completion))


@dataclass(slots=True, frozen=True)
class CompletionLogprobs:
    """Legacy completions logprobs: parallel lists, one entry per generated token."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> CompletionLogprobs | None:
        if not data:
            return None
        return cls(
            tokens=list(data.get("tokens") or []),
            token_logprobs=list(data.get("token_logprobs") or []),
            top_logprobs=list(data.get("top_logprobs") or []),
            text_offset=list(data.get("text_offset") or []),
        )


@dataclass(slots=True, frozen=True)
class TopLogprob:
    token: str
    logprob: float
    bytes: list[int] | None = None


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One generated token of a chat answer with its logprob and the top alternatives."""

    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenLogprob:
        top = [
            TopLogprob(t["token"], float(t["logprob"]), t.get("bytes"))
            for t in data.get("top_logprobs") or []
        ]
        return cls(data["token"], float(data["logprob"]), data.get("bytes"), top)


def _chat_logprobs(data: dict[str, Any] | None) -> list[TokenLogprob] | None:
    if not data or data.get("content") is None:
        return None
    return [TokenLogprob.from_dict(item) for item in data["content"]]


@dataclass(slots=True, frozen=True)
class CompletionChoice:
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompletionChoice:
        return cls(
            index=int(data.get("index", 0)),
            text=require_field(data, "text", "completion choice"),
            finish_reason=data.get("finish_reason"),
            logprobs=CompletionLogprobs.from_dict(data.get("logprobs")),
        )


@dataclass(slots=True, frozen=True)
class ChatMessage:
    role: str
    content: str | None
    tool_calls: list[dict[str, Any]] | None = None


@dataclass(slots=True, frozen=True)
class ChatChoice:
    index: int
    message: ChatMessage
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatChoice:
        message = require_field(data, "message", "chat choice")
        return cls(
            index=int(data.get("index", 0)),
            message=ChatMessage(
                role=message.get("role", "assistant"),
                content=message.get("content"),
                tool_calls=message.get("tool_calls"),
            ),
            finish_reason=data.get("finish_reason"),
            logprobs=_chat_logprobs(data.get("logprobs")),
        )


@dataclass(slots=True, frozen=True)
class Completion:
    """The answer of ``POST /v1/completions``."""

    id: str
    model: str
    created: int
    choices: list[CompletionChoice]
    usage: Usage | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    # The load hints of a pagedserve server travel in these.
    response_headers: Mapping[str, str] = field(
        default_factory=CIMultiDict, repr=False, compare=False
    )

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], response_headers: Mapping[str, str] | None = None
    ) -> Completion:
        return _parse_answer(cls, data, response_headers, CompletionChoice.from_dict, "completion")


@dataclass(slots=True, frozen=True)
class ChatCompletion:
    """The answer of ``POST /v1/chat/completions``."""

    id: str
    model: str
    created: int
    choices: list[ChatChoice]
    usage: Usage | None
    raw: dict[str, Any] = field(repr=False, compare=False)
    # The load hints of a pagedserve server travel in these.
    response_headers: Mapping[str, str] = field(
        default_factory=CIMultiDict, repr=False, compare=False
    )

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], response_headers: Mapping[str, str] | None = None
    ) -> ChatCompletion:
        return _parse_answer(cls, data, response_headers, ChatChoice.from_dict, "chat completion")


@dataclass(slots=True, frozen=True)
class CompletionChunkChoice:
    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompletionChunkChoice:
        return cls(
            index=int(data.get("index", 0)),
            text=data.get("text") or "",
            finish_reason=data.get("finish_reason"),
            logprobs=CompletionLogprobs.from_dict(data.get("logprobs")),
        )


@dataclass(slots=True, frozen=True)
class CompletionChunk:
    """One SSE event of a streamed completion."""

    id: str
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompletionChunk:
        return _parse_chunk(cls, data, CompletionChunkChoice.from_dict, "completion chunk")


@dataclass(slots=True, frozen=True)
class ChatDelta:
    role: str | None
    content: str | None


@dataclass(slots=True, frozen=True)
class ChatChunkChoice:
    index: int
    delta: ChatDelta
    finish_reason: str | None
    logprobs: list[TokenLogprob] | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatChunkChoice:
        delta = data.get("delta") or {}
        return cls(
            index=int(data.get("index", 0)),
            delta=ChatDelta(role=delta.get("role"), content=delta.get("content")),
            finish_reason=data.get("finish_reason"),
            logprobs=_chat_logprobs(data.get("logprobs")),
        )


@dataclass(slots=True, frozen=True)
class ChatCompletionChunk:
    """One SSE event of a streamed chat completion."""

    id: str
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChatCompletionChunk:
        return _parse_chunk(cls, data, ChatChunkChoice.from_dict, "chat completion chunk")


@dataclass(slots=True, frozen=True)
class TokenizeResult:
    """The answer of pagedserve's ``POST /tokenize``."""

    count: int
    tokens: list[int]
    max_model_len: int | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TokenizeResult:
        count = require_field(data, "count", "tokenize response")
        limit = data.get("max_model_len")
        tokens = list(data.get("tokens") or [])
        return cls(int(count), tokens, None if limit is None else int(limit))


@dataclass(slots=True, frozen=True)
class ServerLoad:
    """pagedserve's ``GET /load``: the load hints plus the engine's fixed limits."""

    kv_cache_usage: float
    num_waiting: int
    num_running: int
    free_token_capacity: int
    num_preemptions: int
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    total_kv_tokens: int | None
    # The running count at which the server measured its most tokens per second lately.
    best_running: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerLoad:
        def optional(key: str) -> int | None:
            return None if data.get(key) is None else int(data[key])

        return cls(
            kv_cache_usage=float(require_field(data, "kv_cache_usage", "/load response")),
            num_waiting=int(data.get("num_waiting") or 0),
            num_running=int(data.get("num_running") or 0),
            free_token_capacity=int(data.get("free_token_capacity") or 0),
            num_preemptions=int(data.get("num_preemptions") or 0),
            max_num_seqs=optional("max_num_seqs"),
            max_num_batched_tokens=optional("max_num_batched_tokens"),
            total_kv_tokens=optional("total_kv_tokens"),
            best_running=optional("best_running"),
        )
