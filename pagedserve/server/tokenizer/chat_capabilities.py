"""What a chat template can show, found by rendering probe conversations through it.

Templates say nothing of themselves, so each capability is a render whose output either holds
a probe's text or not (a template that raises on it lacks it too): whether the template lists
``tools``, writes an assistant's ``tool_calls``, writes ``tool`` results, and keeps a
``system`` message. A tool format for a template without tool support (``tools.generic``)
fills in what it lacks. The answers depend on the template and its special tokens alone, so
they are computed once per template.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from pagedserve.common.engine_errors import InvalidRequestError
from pagedserve.server.tokenizer.chat_template import render_chat_template

_TOOL = "pagedserve_probe_tool"
_CALL = "pagedserve_probe_call"
_RESULT = "pagedserve probe result"
_SYSTEM = "pagedserve probe system"
_QUESTION = {"role": "user", "content": "pagedserve probe question"}
# Nine letters and digits: Mistral's templates refuse any other call id.
_CALL_ID = "probe0001"


@dataclass(frozen=True, slots=True)
class TemplateCapabilities:
    tools: bool  # lists the request's tools
    tool_calls: bool  # writes an assistant's tool calls
    tool_results: bool  # writes a ``tool`` message's content
    system: bool  # keeps a system message's content


def template_capabilities(template: str | None,
                          special_tokens: Mapping[str, str] | None = None
                          ) -> TemplateCapabilities:
    """What ``template`` (None: the default template) shows, rendered with
    ``special_tokens``."""
    return _capabilities(template, tuple(sorted((special_tokens or {}).items())))


@lru_cache(maxsize=16)
def _capabilities(template: str | None, special_tokens: tuple[tuple[str, str], ...]
                  ) -> TemplateCapabilities:
    tokens = dict(special_tokens)
    tools = [{"type": "function", "function": {
        "name": _TOOL, "description": "probe",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}]
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": _CALL_ID, "type": "function",
        "function": {"name": _CALL, "arguments": {"x": "y"}}}]}
    result = {"role": "tool", "tool_call_id": _CALL_ID, "name": _CALL, "content": _RESULT}

    def shows(text: str, messages: list[dict[str, Any]], **variables: Any) -> bool:
        try:
            return text in render_chat_template(template, messages, special_tokens=tokens,
                                                variables=variables)
        except InvalidRequestError:
            return False

    return TemplateCapabilities(
        tools=shows(_TOOL, [_QUESTION], tools=tools),
        tool_calls=shows(_CALL, [_QUESTION, call], tools=tools),
        tool_results=shows(_RESULT, [_QUESTION, call, result], tools=tools),
        system=shows(_SYSTEM, [{"role": "system", "content": _SYSTEM}, _QUESTION]),
    )
