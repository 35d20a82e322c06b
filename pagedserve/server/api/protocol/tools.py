"""OpenAI's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` in a chat request.

The tools reach the prompt in the model's tool format (``tools.formats``: the chat template's
own, or a generic one). ``auto`` leaves the choice to the model, a parser reads its calls
from the text, and the format's grammar holds a call once the model starts one;
``required`` and a named function are a grammar, as in vLLM: ``required`` makes the output a
JSON array of ``{"name": ..., "parameters": {...}}`` (one item when ``parallel_tool_calls``
is false), a named function makes it that function's arguments. ``none`` calls nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server.api.protocol.fields import Fields, show, type_error
from pagedserve.server.api.tools.grammar_calls import NamedCall, RequiredCalls
from pagedserve.server.api.tools.parsers import FirstCallOnly, ToolParser

_ANY_OBJECT = {"type": "object"}


@dataclass(slots=True)
class ToolRequest:
    tools: list[dict[str, Any]]  # OpenAI's {"type": "function", "function": {...}} items
    choice: str  # "none", "auto", "required", or the name of a function
    parallel: bool

    @property
    def calls_tools(self) -> bool:
        return self.choice != "none"

    def parameters(self, name: str) -> dict[str, Any]:
        function = next(t["function"] for t in self.tools if t["function"]["name"] == name)
        return function.get("parameters") or _ANY_OBJECT

    def constraint(self) -> StructuredOutputsParams | None:
        """The grammar ``required`` or a named choice puts on the output."""
        if self.choice in ("none", "auto"):
            return None
        if self.choice != "required":
            return StructuredOutputsParams(json=self.parameters(self.choice),
                                           source="tool_choice")
        calls = [{"type": "object", "additionalProperties": False,
                  "required": ["name", "parameters"],
                  "properties": {"name": {"const": t["function"]["name"]},
                                 "parameters": self.parameters(t["function"]["name"])}}
                 for t in self.tools]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not self.parallel:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema, source="tools")

    def parser(self, auto: ToolParser) -> ToolParser | None:
        """What reads the calls out of the output (``auto``: the server's parser)."""
        if self.choice == "none":
            return None
        if self.choice == "auto":
            return auto if self.parallel else FirstCallOnly(auto)
        if self.choice == "required":
            return RequiredCalls()
        return NamedCall(self.choice)


def read_tools(fields: Fields) -> ToolRequest | None:
    tools = [_tool(i, t) for i, t in enumerate(_list(fields.raw("tools")))]
    choice = _choice(fields.raw("tool_choice"), tools)
    parallel = fields.boolean("parallel_tool_calls", True)
    if not tools:
        return None
    return ToolRequest(tools, choice, parallel)


def _list(value: Any) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise type_error("tools", "a list of tools", value)
    return value


def _tool(i: int, value: Any) -> dict[str, Any]:
    where = f"tools[{i}]"
    fields = Fields(value, prefix=f"{where}.")
    check_function_type(fields, where)
    function = fields.object("function")
    fields.finish()
    if function is None:
        raise InvalidRequestError(f"{where}.function is required", param=f"{where}.function")
    return {"type": "function", "function": read_function(function, f"{where}.function")}


def check_function_type(fields: Fields, where: str) -> None:
    kind = fields.string("type", required=True)
    if kind != "function":
        raise InvalidRequestError(f"{where}.type {show(kind)} is not supported: only "
                                  "\"function\" is", param=f"{where}.type")


def read_function(function: Fields, where: str) -> dict[str, Any]:
    """A function's ``name``, ``description`` and ``parameters`` (all of ``function``'s
    members: anything else is refused by name)."""
    checked: dict[str, Any] = {"name": function.string("name", required=True)}
    description = function.string("description")
    if description is not None:
        checked["description"] = description
    parameters = function.raw("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise type_error(f"{where}.parameters", "a JSON schema object", parameters)
        checked["parameters"] = parameters
    function.boolean("strict", False)  # the grammar holds a required or named call to it
    function.finish()
    return checked


def _choice(value: Any, tools: list[dict[str, Any]]) -> str:
    if value is None or isinstance(value, str):
        return choice_option(value, tools)
    fields = Fields(value, prefix="tool_choice.")
    if fields.string("type", required=True) != "function":
        raise type_error("tool_choice.type", "\"function\"", value.get("type"))
    function = fields.object("function")
    fields.finish()
    if function is None:
        raise InvalidRequestError("tool_choice.function is required",
                                  param="tool_choice.function")
    name = function.string("name", required=True)
    function.finish()
    return named_choice(name, tools)


def choice_option(value: str | None, tools: list[dict[str, Any]]) -> str:
    """``tool_choice`` given as a string, or absent (``auto`` with tools, else ``none``)."""
    if value is None:
        return "auto" if tools else "none"
    if value not in ("none", "auto", "required"):
        raise type_error("tool_choice", "\"none\", \"auto\", \"required\" or a named "
                         "function", value)
    if value == "required" and not tools:
        raise InvalidRequestError("tool_choice \"required\" needs tools",
                                  param="tool_choice")
    return value


def named_choice(name: str, tools: list[dict[str, Any]]) -> str:
    names = [t["function"]["name"] for t in tools]
    if name not in names:
        raise InvalidRequestError(f"tool_choice names function {show(name)}, which is not "
                                  f"among the tools ({show(names)})", param="tool_choice")
    return name


class ToolCarrier(Protocol):
    """What a request (chat, responses, tokenize) holds that its tools change."""

    tools: ToolRequest | None
    sampling: dict[str, Any]


def attach_tools(request: ToolCarrier, tools: ToolRequest) -> None:
    """The request's tools (which reach the prompt in the model's tool format, see
    ``tools.formats``); a required or named choice becomes the output's grammar, which no
    other constraint may join."""
    request.tools = tools
    constraint = tools.constraint()
    if constraint is None:
        return
    other = request.sampling.get("structured_outputs")
    if other is not None:
        raise InvalidRequestError(f"tool_choice {show(tools.choice)} and {other.source} both "
                                  "constrain the output: send one", param="tool_choice")
    request.sampling["structured_outputs"] = constraint
