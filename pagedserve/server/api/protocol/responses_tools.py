"""Function tools in a ``/v1/responses`` request, in the Responses API's shapes, read into
chat's (``tools.py``) so that one template, grammar and parser serve both.

A tool is flat (``{"type": "function", "name", "description", "parameters", "strict"}``) where
chat nests it under ``function``; a named ``tool_choice`` is ``{"type": "function", "name"}``.
A call the model made comes back as a ``function_call`` input item (``call_id``, ``name``,
``arguments``) and its result as a ``function_call_output`` item (``call_id``, ``output``):
they become an assistant message's ``tool_calls`` and a ``tool`` message, as chat sends them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.api.protocol.fields import Fields, show, type_error
from pagedserve.server.api.protocol.tools import (
    ToolRequest,
    check_function_type,
    choice_option,
    named_choice,
    read_function,
)

TextPart = Callable[[str, Any], dict[str, str]]  # reads one text part, named by its place


def read_response_tools(fields: Fields) -> ToolRequest | None:
    value = fields.raw("tools")
    if value is not None and not isinstance(value, list):
        raise type_error("tools", "a list of tools", value)
    tools = [_tool(i, tool) for i, tool in enumerate(value or [])]
    choice = _choice(fields.raw("tool_choice"), tools)
    parallel = fields.boolean("parallel_tool_calls", True)
    return ToolRequest(tools, choice, parallel) if tools else None


def _tool(i: int, value: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    fields = Fields(value, prefix=f"{where}.")
    check_function_type(fields, where)
    return {"type": "function", "function": read_function(fields, where)}


def _choice(value: Any, tools: list[dict[str, Any]]) -> str:
    if value is None or isinstance(value, str):
        return choice_option(value, tools)
    fields = Fields(value, prefix="tool_choice.")
    kind = fields.string("type", required=True)
    if kind != "function":
        raise InvalidRequestError(f"tool_choice.type must be \"function\", got {show(kind)}: "
                                  "this server has function tools only",
                                  param="tool_choice.type")
    name = fields.string("name", required=True)
    fields.finish()
    return named_choice(name, tools)


def response_tools(tools: ToolRequest | None) -> list[dict[str, Any]]:
    """The tools as a Response object lists them (flat, with the defaults filled in)."""
    if tools is None:
        return []
    return [{"type": "function", "description": None, "parameters": None, "strict": True,
             **tool["function"]} for tool in tools.tools]


def response_tool_choice(tools: ToolRequest | None) -> Any:
    if tools is None:
        return "auto"
    if tools.choice in ("none", "auto", "required"):
        return tools.choice
    return {"type": "function", "name": tools.choice}


def function_call(where: str, item: dict[str, Any]) -> dict[str, Any]:
    """A ``function_call`` input item as one of chat's ``tool_calls``."""
    fields = Fields(item, prefix=f"{where}.")
    fields.ignore("type", "id", "status")
    call = {"id": fields.string("call_id", required=True), "type": "function",
            "function": {"name": fields.string("name", required=True),
                         "arguments": fields.string("arguments", required=True)}}
    fields.finish()
    return call


def function_call_output(where: str, item: dict[str, Any], text_part: TextPart) -> dict[str, Any]:
    """A ``function_call_output`` input item as chat's ``tool`` message (``text_part``
    reads each part of an output given as a list)."""
    fields = Fields(item, prefix=f"{where}.")
    fields.ignore("type", "id", "status")
    call_id = fields.string("call_id", required=True)
    output = fields.raw("output")
    fields.finish()
    if output is None:
        raise InvalidRequestError(f"{where}.output is required", param=f"{where}.output")
    if isinstance(output, list):
        output = [text_part(f"{where}.output[{j}]", part) for j, part in enumerate(output)]
    elif not isinstance(output, str):
        raise type_error(f"{where}.output", "a string or a list of text parts", output)
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def add_input_item(messages: list[dict[str, Any]], where: str, item: dict[str, Any],
                   text_part: TextPart) -> None:
    """Appends a ``function_call`` or ``function_call_output`` item to the chat messages:
    calls join the assistant turn right before them (the text or calls the model wrote
    with them), or open one."""
    if item["type"] == "function_call_output":
        messages.append(function_call_output(where, item, text_part))
        return
    call = function_call(where, item)
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last["tool_calls"] = [*last.get("tool_calls", []), call]
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
