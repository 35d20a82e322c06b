"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's extensions): the request bodies."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.chat import read_messages
from pagedserve.server.api.protocol.chat_rendering import ChatRendering, read_chat_rendering
from pagedserve.server.api.protocol.fields import Fields, type_error
from pagedserve.server.api.protocol.tools import ToolRequest, attach_tools, read_tools


@dataclass(slots=True)
class TokenizeRequest:
    """Exactly one of ``prompt`` and ``messages`` (with chat's ``tools``, ``tool_choice``
    and ``parallel_tool_calls``, which change the prompt); ``model`` may be omitted.

    ``add_special_tokens`` defaults as in vLLM: on for a prompt (the BOS framing completions
    add), off for messages (the chat template writes its own)."""

    model: str | None
    prompt: str | None
    messages: list[Any] | None
    rendering: ChatRendering
    add_special_tokens: bool
    tools: ToolRequest | None = None  # chat's tools, which change the prompt as in chat
    sampling: dict[str, Any] = field(default_factory=dict)  # what tools ask of the output


@dataclass(slots=True)
class DetokenizeRequest:
    model: str | None
    tokens: list[int]


def parse_tokenize_request(body: Any) -> TokenizeRequest:
    fields = Fields(body)
    model = fields.string("model")
    has_prompt, has_messages = fields.has("prompt"), fields.has("messages")
    if has_prompt == has_messages:
        raise InvalidRequestError("give exactly one of prompt and messages",
                                  param="messages" if has_messages else "prompt")
    prompt = fields.string("prompt")
    messages = read_messages(fields.raw("messages")) if has_messages else None
    rendering = read_chat_rendering(fields)
    add_special_tokens = fields.boolean("add_special_tokens", not has_messages)
    request = TokenizeRequest(model, prompt, messages, rendering, add_special_tokens)
    tools = read_tools(fields) if has_messages else None
    if tools is not None:
        attach_tools(request, tools)
    fields.finish()
    return request


def parse_detokenize_request(body: Any) -> DetokenizeRequest:
    fields = Fields(body)
    model = fields.string("model")
    tokens = fields.integers("tokens")
    if tokens is None:
        raise InvalidRequestError("tokens is required", param="tokens")
    if any(t < 0 for t in tokens):
        raise type_error("tokens", "a list of non-negative token ids", tokens)
    fields.finish()
    return DetokenizeRequest(model, tokens)
