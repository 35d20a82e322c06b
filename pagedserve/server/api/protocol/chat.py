"""``POST /v1/chat/completions``: the request body, read and type-checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import MAX_LOGPROBS
from pagedserve.server.api.protocol.chat_rendering import ChatRendering, read_chat_rendering
from pagedserve.server.api.protocol.completions import read_stream_options
from pagedserve.server.api.protocol.fields import Fields, show, type_error
from pagedserve.server.api.protocol.prompt import PromptEncoding, read_prompt_encoding
from pagedserve.server.api.protocol.sampling_fields import read_sampling_fields
from pagedserve.server.api.protocol.tools import ToolRequest, attach_tools, read_tools

# OpenAI fields for tools, audio and other outputs: a clear 400 rather than a silent answer
# that ignores them.
_UNSUPPORTED = (
    "functions",
    "function_call",
    "audio",
    "prediction",
    "web_search_options",
    "reasoning_effort",
    "verbosity",
)
# OpenAI fields about billing, storage and tracking: nothing to do here.
_IGNORED = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
)


@dataclass(slots=True)
class ChatCompletionRequest:
    model: str
    messages: list[Any]
    max_tokens: int | None
    stream: bool
    request_id: str | None  # vLLM's: the response's id (X-Request-Id wins)
    include_usage: bool
    continuous_usage: bool
    logprobs: bool
    top_logprobs: int | None
    tokens_as_ids: bool  # vLLM's return_tokens_as_token_ids
    echo: bool  # vLLM's: the reply starts with the last message, if the assistant's
    rendering: ChatRendering
    encoding: PromptEncoding
    sampling: dict[str, Any]
    tools: ToolRequest | None = None


def parse_chat_request(body: Any) -> ChatCompletionRequest:
    fields = Fields(body)
    model = fields.string("model", required=True)
    messages = read_messages(fields.raw("messages"))
    stream = fields.boolean("stream", False)
    max_tokens = fields.integer("max_tokens")
    # max_completion_tokens is OpenAI's current name; max_tokens its deprecated alias.
    max_completion_tokens = fields.integer("max_completion_tokens")
    logprobs = fields.boolean("logprobs", False)
    top_logprobs = fields.integer("top_logprobs", minimum=0, maximum=MAX_LOGPROBS)
    if top_logprobs is not None and not logprobs:
        raise InvalidRequestError("top_logprobs requires logprobs to be true",
                                  param="top_logprobs")
    include_usage, continuous_usage = read_stream_options(fields, stream)
    request = ChatCompletionRequest(
        model=model,
        messages=messages,
        max_tokens=max_completion_tokens if max_completion_tokens is not None else max_tokens,
        stream=stream,
        request_id=fields.string("request_id"),
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        tokens_as_ids=fields.boolean("return_tokens_as_token_ids", False),
        echo=fields.boolean("echo", False),
        rendering=read_chat_rendering(fields),
        encoding=read_prompt_encoding(fields, add_special_tokens=False),
        sampling=read_sampling_fields(fields),
    )
    _read_tools(fields, request)
    _read_modalities(fields)
    fields.reject(*_UNSUPPORTED)
    fields.ignore(*_IGNORED)
    fields.finish()
    return request


def _read_tools(fields: Fields, request: ChatCompletionRequest) -> None:
    """Tools, when the request sends them, reach the template (``attach_tools``)."""
    tools = read_tools(fields)
    if tools is not None:
        attach_tools(request, tools)


def read_messages(value: Any) -> list[Any]:
    """The raw messages; the tokenizer's chat-template renderer validates each one (roles,
    text parts) and names the offending ``messages[i]`` in its error."""
    if value is None:
        raise InvalidRequestError("messages is required", param="messages")
    if not isinstance(value, list) or not value:
        raise type_error("messages", "a non-empty list of messages", value)
    return value


def _read_modalities(fields: Fields) -> None:
    modalities = fields.strings("modalities")
    if modalities is not None and modalities != ["text"]:
        raise InvalidRequestError(
            f"modalities {show(modalities)} is not supported: only [\"text\"] is",
            param="modalities",
        )
