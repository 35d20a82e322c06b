"""``POST /v1/responses`` (OpenAI's Responses API, text in and text out): the request body,
read and type-checked, with its input turned into chat messages for the model's template.

``input`` is a string (one user message) or a list of messages, each a ``role`` and a
``content`` that is a string or a list of ``input_text`` / ``output_text`` parts;
``instructions`` becomes a leading system message, as in vLLM. Function tools, the calls
the model made (``function_call`` items) and their results (``function_call_output``) are
read as chat's (``responses_tools.py``). Nothing is stored, so
``previous_response_id`` and the other features that need stored state, built-in tools and
non-text inputs are refused by name. ``text.format`` constrains the output (a JSON schema, or
any JSON object) as chat's ``response_format`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server.api.protocol.chat_rendering import ChatRendering
from pagedserve.server.api.protocol.fields import Fields, show, type_error
from pagedserve.server.api.protocol.responses_tools import add_input_item, read_response_tools
from pagedserve.server.api.protocol.sampling_fields import read_sampling_fields
from pagedserve.server.api.protocol.structured import read_json_schema
from pagedserve.server.api.protocol.tools import ToolRequest, attach_tools

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
# Features that need stored responses or other modalities.
_UNSUPPORTED = ("previous_response_id", "conversation", "prompt", "background")
# Billing, tracking and caching hints: nothing to do here.
_IGNORED = ("store", "user", "safety_identifier", "prompt_cache_key", "service_tier",
            "max_tool_calls", "stream_options")
_TOOL_ITEMS = ("function_call", "function_call_output")
# Sampling fields with no meaning for a single response.
_SINGLE_OUTPUT = ("n", "best_of", "use_beam_search")


@dataclass(slots=True)
class ResponsesRequest:
    model: str
    messages: list[dict[str, Any]]
    instructions: str | None
    max_output_tokens: int | None
    stream: bool
    request_id: str | None  # vLLM's: the response's id (X-Request-Id wins)
    metadata: dict[str, Any]
    sampling: dict[str, Any]
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    tools: ToolRequest | None = None
    rendering: ChatRendering = field(default_factory=ChatRendering)


def parse_responses_request(body: Any) -> ResponsesRequest:
    fields = Fields(body)
    text = body.get("text") if isinstance(body, dict) else None
    echoed_format: dict[str, Any] | None = (text.get("format") if isinstance(text, dict)
                                            else None)
    model = fields.string("model", required=True)
    instructions = fields.string("instructions")
    messages = read_input(fields.raw("input"))
    if instructions is not None:
        messages.insert(0, {"role": "system", "content": instructions})
    request = ResponsesRequest(
        model=model,
        messages=messages,
        instructions=instructions,
        max_output_tokens=fields.integer("max_output_tokens"),
        stream=fields.boolean("stream", False),
        request_id=fields.string("request_id"),
        metadata=_read_metadata(fields.raw("metadata")),
        sampling=read_sampling_fields(fields, response_format=False),
    )
    text_format = _read_text(fields.object("text"))
    if text_format is not None:
        if request.sampling.get("structured_outputs") is not None:
            raise InvalidRequestError(
                f"text.format and {request.sampling['structured_outputs'].source} both "
                "constrain the output: send one", param="text.format")
        request.sampling["structured_outputs"] = text_format
        if echoed_format is not None:  # the Response object repeats it
            request.text_format = echoed_format
    for name in _SINGLE_OUTPUT:
        if name in request.sampling:
            raise InvalidRequestError(f"{name} is not supported by the Responses API (it has "
                                      "one output); use /v1/chat/completions", param=name)
    _read_tools(fields, request)
    _refuse_unless(fields, "reasoning", lambda v: v == {}, "is not supported by this model")
    _refuse_unless(fields, "include", lambda v: v == [], "is not supported by this server")
    _refuse_unless(fields, "truncation", lambda v: v == "disabled",
                   'must be "disabled": this server does not drop input to fit')
    _refuse_unless(fields, "top_logprobs", lambda v: v == 0, "is not supported by this server")
    fields.reject(*_UNSUPPORTED)
    fields.ignore(*_IGNORED)
    fields.finish()
    return request


def read_input(value: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages (text parts as the chat template's text parts)."""
    if value is None:
        raise InvalidRequestError("input is required", param="input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise type_error("input", "a string or a non-empty list of messages", value)
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        if isinstance(item, dict) and item.get("type") in _TOOL_ITEMS:
            add_input_item(messages, f"input[{i}]", item, _text_part)
        else:
            messages.append(_message(i, item))
    return messages


def _message(i: int, item: Any) -> dict[str, Any]:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise type_error(where, "a message object", item)
    kind = item.get("type", "message")
    if kind != "message":
        raise InvalidRequestError(f"{where}.type {show(kind)} is not supported by this "
                                  "server: only messages, function_call and "
                                  "function_call_output are", param=where)
    fields = Fields(item, prefix=f"{where}.")
    fields.ignore("type", "id", "status")
    role = fields.string("role", required=True)
    if role not in _ROLES:
        raise InvalidRequestError(f"{where}.role must be one of {', '.join(_ROLES)}, got "
                                  f"{show(role)}", param=f"{where}.role")
    content = fields.raw("content")
    fields.finish()
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise type_error(f"{where}.content", "a string or a list of text parts", content)
    return {"role": role, "content": [_text_part(f"{where}.content[{j}]", part)
                                      for j, part in enumerate(content)]}


def _text_part(where: str, part: Any) -> dict[str, str]:
    if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
        kind = part.get("type") if isinstance(part, dict) else part
        raise InvalidRequestError(f"{where} must be an input_text or output_text part, got "
                                  f"{show(kind)}: this server takes text only", param=where)
    fields = Fields(part, prefix=f"{where}.")
    fields.ignore("type", "annotations", "logprobs")
    text = fields.string("text", required=True)
    fields.finish()
    return {"type": "text", "text": text}


def _read_metadata(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise type_error("metadata", "an object", value)
    return value


def _read_tools(fields: Fields, request: ResponsesRequest) -> None:
    """Tools, when the request sends them, reach the template (``attach_tools``)."""
    tools = read_response_tools(fields)
    if tools is not None:
        attach_tools(request, tools)


def _read_text(text: Fields | None) -> StructuredOutputsParams | None:
    """``text.format``: text, any JSON object, or OpenAI's flat ``json_schema`` format
    (``name``, ``schema``, ``strict`` beside ``type``)."""
    if text is None:
        return None
    text_format = text.object("format")
    spec = None
    if text_format is not None:
        kind = text_format.string("type", required=True)
        if kind == "json_object":
            spec = StructuredOutputsParams(json_object=True, source="text.format")
            text_format.finish()
        elif kind == "json_schema":
            spec = read_json_schema(text_format, "text.format")
        elif kind == "text":
            text_format.finish()
        else:
            raise InvalidRequestError(f"text.format.type {show(kind)} is not supported: use "
                                      "\"text\", \"json_object\" or \"json_schema\"",
                                      param="text.format.type")
    text.ignore("verbosity")
    text.finish()
    return spec


def _refuse_unless(fields: Fields, name: str, accepted: Callable[[Any], bool],
                   reason: str) -> None:
    value = fields.raw(name)
    if value is not None and not accepted(value):
        raise InvalidRequestError(f"{name} {reason}, got {show(value)}", param=name)
