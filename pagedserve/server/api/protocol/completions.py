"""``POST /v1/completions``: the request body, read and type-checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.fields import Fields, is_int, type_error
from pagedserve.server.api.protocol.prompt import PromptEncoding, read_prompt_encoding
from pagedserve.server.api.protocol.sampling_fields import read_sampling_fields

# A prompt is text or token ids; a request carries one or more of them.
PromptInput = str | list[int]

_PROMPT_SHAPES = "a string, a list of strings, a list of token ids or a list of token-id lists"


@dataclass(slots=True)
class CompletionRequest:
    model: str
    prompts: list[PromptInput]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    echo: bool
    request_id: str | None  # vLLM's: the response's id (X-Request-Id wins)
    logprobs: int | None
    tokens_as_ids: bool  # vLLM's return_tokens_as_token_ids
    encoding: PromptEncoding
    sampling: dict[str, Any]


def parse_completion_request(body: Any) -> CompletionRequest:
    fields = Fields(body)
    model = fields.string("model", required=True)
    prompts = read_prompts(fields.raw("prompt"))
    stream = fields.boolean("stream", False)
    include_usage, continuous_usage = read_stream_options(fields, stream)
    request = CompletionRequest(
        model=model,
        prompts=prompts,
        max_tokens=fields.integer("max_tokens"),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        echo=fields.boolean("echo", False),
        request_id=fields.string("request_id"),
        logprobs=fields.integer("logprobs"),
        tokens_as_ids=fields.boolean("return_tokens_as_token_ids", False),
        encoding=read_prompt_encoding(fields, add_special_tokens=True),
        sampling=read_sampling_fields(fields),
    )
    fields.ignore("user")
    fields.reject("suffix")
    fields.finish()
    return request


def read_prompts(value: Any) -> list[PromptInput]:
    """OpenAI's four prompt shapes, as a list of prompts."""
    if value is None:
        raise InvalidRequestError("prompt is required", param="prompt")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise type_error("prompt", _PROMPT_SHAPES, value)
    if all(isinstance(p, str) for p in value):
        return list(value)
    if all(is_int(t) for t in value):
        return [list(value)]
    if all(isinstance(p, list) and p and all(is_int(t) for t in p) for p in value):
        return [list(p) for p in value]
    raise type_error("prompt", _PROMPT_SHAPES, value)


def read_stream_options(fields: Fields, stream: bool) -> tuple[bool, bool]:
    """``stream_options``: (``include_usage``, vLLM's ``continuous_usage_stats``, which puts
    each choice's usage so far on every chunk and, as in vLLM, needs ``include_usage``);
    the options exist only for streamed responses."""
    options = fields.object("stream_options")
    if options is None:
        return False, False
    if not stream:
        raise InvalidRequestError("stream_options is only allowed when stream is true",
                                  param="stream_options")
    include_usage = options.boolean("include_usage", False)
    continuous_usage = options.boolean("continuous_usage_stats", False)
    options.ignore("include_obfuscation")  # OpenAI's padding against side channels; moot here
    options.finish()
    return include_usage, include_usage and continuous_usage
