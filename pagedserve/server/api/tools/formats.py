"""How a model calls tools under ``tool_choice: "auto"``: the format its chat template
teaches, or a generic one for a template that knows no tools.

A format says how the prompt presents the tools (the template's own ``tools`` variable, or
the generic system turn of ``tools.generic``), which parser reads the calls out of the text,
and what grammar a call follows once the model starts one: an xgrammar structural tag, free
text until the format's trigger, then a call to one of the tools whose arguments the tool's
parameters hold, and (``parallel_tool_calls`` false) nothing after the first call.

- ``hermes``: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` (Hermes,
  Qwen2.5 and Qwen3 templates; the default template's format);
- ``llama3_json``: ``{"name": ..., "parameters": {...}}`` (Llama 3.1-3.3 templates);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (Mistral templates);
- ``generic``: the Hermes markers, described in the system turn, for any other template.

``detect_tool_format`` reads the template: one that lists tools gets the format whose marker
it writes, any other the generic format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pagedserve.common.sampling_params import StructuredOutputsParams
from pagedserve.server.api.tools.generic import OfferedTools, generic_messages
from pagedserve.server.api.tools.parsers import HermesToolParser, ToolParser
from pagedserve.server.api.tools.parsers_json import Llama3JsonToolParser, MistralToolParser
from pagedserve.server.tokenizer.chat_capabilities import (
    TemplateCapabilities,
    template_capabilities,
)
from pagedserve.server.tokenizer.chat_template import DEFAULT_CHAT_TEMPLATE

# A small model that may write whitespace anywhere can fill its budget with it.
_MAX_WHITESPACE = 1


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    parser: Callable[[], ToolParser]
    trigger: str  # the text that starts a call
    begin: Callable[[str], str]  # a call's text up to its arguments, for a function name
    end: str  # a call's text after its arguments
    template_tools: bool = True  # the template presents the tools itself

    def call_grammar(self, tools: OfferedTools) -> StructuredOutputsParams:
        """Free text, and a call once the trigger is written."""
        tags = [{"type": "tag", "begin": self.begin(t["function"]["name"]),
                 "content": _json(tools.parameters(t["function"]["name"])), "end": self.end}
                for t in tools.tools]
        return _triggered(self.trigger, tags, tools.parallel)


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": schema,
            "max_whitespace_cnt": _MAX_WHITESPACE}


def _triggered(trigger: str, tags: list[dict[str, Any]], parallel: bool
               ) -> StructuredOutputsParams:
    tag = {"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": [trigger], "tags": tags,
        "stop_after_first": not parallel}}
    return StructuredOutputsParams(structural_tag=json.dumps(tag), source="tools")


def _hermes_begin(name: str) -> str:
    return '<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": '


def _llama_begin(name: str) -> str:
    return '{"name": ' + json.dumps(name) + ', "parameters": '


class _MistralFormat(ToolFormat):
    """All of a reply's calls in one JSON array after one marker."""

    def call_grammar(self, tools: OfferedTools) -> StructuredOutputsParams:
        calls = [{"type": "object", "additionalProperties": False,
                  "required": ["name", "arguments"],
                  "properties": {"name": {"const": t["function"]["name"]},
                                 "arguments": tools.parameters(t["function"]["name"])}}
                 for t in tools.tools]
        array = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        if not tools.parallel:
            array["maxItems"] = 1
        tag = {"type": "tag", "begin": self.trigger, "content": _json(array), "end": ""}
        return _triggered(self.trigger, [tag], parallel=False)


HERMES = ToolFormat("hermes", HermesToolParser, "<tool_call>", _hermes_begin, "}\n</tool_call>")
LLAMA3_JSON = ToolFormat("llama3_json", Llama3JsonToolParser, '{"name": ', _llama_begin, "}")
# One array after the marker holds every call (``_MistralFormat.call_grammar``).
MISTRAL = _MistralFormat("mistral", MistralToolParser, "[TOOL_CALLS]",
                         lambda name: "[TOOL_CALLS]", "")
GENERIC = replace(HERMES, name="generic", template_tools=False)
TOOL_FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON, MISTRAL, GENERIC)}
AUTO = "auto"


def detect_tool_format(template: str | None, capabilities: TemplateCapabilities) -> ToolFormat:
    """The format ``template`` (None: the default template) teaches, by the marker it writes;
    the generic one where it lists no tools or writes no marker known here."""
    if not capabilities.tools:
        return GENERIC
    text = template or DEFAULT_CHAT_TEMPLATE
    if "<tool_call>" in text:
        return HERMES
    if "[TOOL_CALLS]" in text:
        return MISTRAL
    if "<|python_tag|>" in text or ("<|start_header_id|>" in text and "parameters" in text):
        return LLAMA3_JSON
    return GENERIC


class ToolCarrier(Protocol):
    """What a request (chat, responses, tokenize) holds that its tools change."""

    messages: Any  # list[Any]; None for a tokenize request of a prompt, not a chat
    rendering: Any  # ChatRendering: its ``variables`` reach the template
    sampling: dict[str, Any]

    @property
    def tools(self) -> OfferedTools | None: ...


@dataclass(frozen=True, slots=True)
class ModelTools:
    """One model's tool format and what its template shows."""

    format: ToolFormat
    capabilities: TemplateCapabilities
    # The grammar's vocabulary has no text for special tokens, so a call whose marker is one
    # (Mistral's [TOOL_CALLS]) cannot be held to a grammar: it is parsed as written.
    constrained: bool = True

    @classmethod
    def of(cls, template: str | None, special_tokens: dict[str, str], name: str = AUTO,
           special_texts: frozenset[str] = frozenset()) -> ModelTools:
        """``name`` (``--tool-call-parser``): a format of ``TOOL_FORMATS``, or ``auto`` to
        read it from the template; ``special_texts``: the texts of the vocabulary's special
        tokens."""
        capabilities = template_capabilities(template, special_tokens)
        chosen = (detect_tool_format(template, capabilities) if name == AUTO
                  else TOOL_FORMATS[name])
        return cls(chosen, capabilities, chosen.trigger not in special_texts)

    def apply(self, request: ToolCarrier) -> None:
        """Present the request's tools to the prompt in this format, and hold an ``auto``
        call to its grammar once started (unless another constraint holds the output)."""
        tools, fmt = request.tools, self.format
        if request.messages is None:
            return
        if not fmt.template_tools:  # earlier calls and results too, with or without tools
            request.messages = generic_messages(
                request.messages, tools if tools is not None and tools.calls_tools else None,
                self.capabilities)
        if tools is None:
            return
        if fmt.template_tools:
            request.rendering = replace(
                request.rendering, variables={**request.rendering.variables,
                                              "tools": tools.tools})
        if (tools.choice == "auto" and self.constrained
                and request.sampling.get("structured_outputs") is None):
            request.sampling["structured_outputs"] = fmt.call_grammar(tools)

    def parser(self, tools: OfferedTools) -> ToolParser | None:
        """What reads the calls out of an output (None under ``tool_choice: "none"``)."""
        return tools.parser(self.format.parser())
