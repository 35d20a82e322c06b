"""The generic tool format, for chat templates that know no tools: the tools described in the
system turn, and earlier calls and results written as text the template shows.

The model is told to write a call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>``: the Hermes markers, which many models have seen; the hermes parser reads
them, and the format's grammar holds a call once its marker is written. An assistant's
earlier calls become that text in its content; each ``tool`` result is written inside
``<tool_response></tool_response>``, as a ``tool`` message where the template shows those,
else in a user message (consecutive results share one). The description joins the first
system message, or opens the first user message where the template drops system messages.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

from pagedserve.server.tokenizer.chat_capabilities import TemplateCapabilities
from pagedserve.server.tokenizer.chat_messages import template_messages

if TYPE_CHECKING:
    from pagedserve.server.api.tools.parsers import ToolParser


class OfferedTools(Protocol):
    """A request's tools as the tool formats read them (``protocol.tools.ToolRequest``)."""

    tools: list[dict[str, Any]]  # OpenAI's {"type": "function", "function": {...}} items
    choice: str  # "none", "auto", "required", or the name of a function
    parallel: bool

    @property
    def calls_tools(self) -> bool: ...

    def parameters(self, name: str) -> dict[str, Any]: ...

    def parser(self, auto: ToolParser) -> ToolParser | None: ...

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_RESULT_OPEN, _RESULT_CLOSE = "<tool_response>", "</tool_response>"


def generic_messages(messages: list[Any], tools: OfferedTools | None,
                     capabilities: TemplateCapabilities) -> list[dict[str, Any]]:
    """``messages`` as a template without tool support can show them; with ``tools``, the
    tools described too."""
    chat: list[dict[str, Any]] = []
    in_results = False  # the last message holds tool results the next one may join
    for message in template_messages(messages):
        role = message["role"]
        if role == "assistant" and "tool_calls" in message:
            chat.append(_calls_as_text(message))
        elif role == "tool":
            result = f"{_RESULT_OPEN}\n{message['content']}\n{_RESULT_CLOSE}"
            if capabilities.tool_results:
                chat.append({**message, "content": result})
            elif in_results:
                chat[-1] = {**chat[-1], "content": chat[-1]["content"] + "\n" + result}
            else:
                chat.append({"role": "user", "content": result})
        else:
            chat.append(message)
        in_results = role == "tool"
    return chat if tools is None else _described(chat, tools, capabilities.system)


def call_text(name: str, arguments: Any) -> str:
    """One call as the generic format writes it."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{_OPEN}\n{body}\n{_CLOSE}"


def _calls_as_text(message: dict[str, Any]) -> dict[str, Any]:
    calls = [call_text(c["function"]["name"], c["function"]["arguments"])
             for c in message["tool_calls"]]
    text = "\n".join([message["content"], *calls] if message["content"] else calls)
    return {k: v for k, v in message.items() if k != "tool_calls"} | {"content": text}


def instructions(tools: OfferedTools) -> str:
    """What the system turn says of the tools."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools.tools)
    how = ("To call several functions, write one <tool_call> block for each."
           if tools.parallel else "Call at most one function.")
    when = ("If no function fits the request, answer it directly." if tools.choice == "auto"
            else "Answer with a function call.")
    return (f"You can call functions. Their signatures are within <tools></tools>:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            f"To call a function, write its name and arguments as JSON within "
            f"<tool_call></tool_call> tags:\n"
            f"{_OPEN}\n{{\"name\": <function-name>, \"arguments\": <arguments-object>}}\n"
            f"{_CLOSE}\n{how} Each result comes back within {_RESULT_OPEN}{_RESULT_CLOSE} "
            f"tags. {when}")


def _described(chat: list[dict[str, Any]], tools: OfferedTools, system: bool
               ) -> list[dict[str, Any]]:
    text = instructions(tools)
    first = chat[0]
    if system and first["role"] in ("system", "developer"):
        return [{**first, "content": f"{first['content']}\n\n{text}"}, *chat[1:]]
    if system:
        return [{"role": "system", "content": text}, *chat]
    at = next((i for i, m in enumerate(chat) if m["role"] == "user"), None)
    if at is None:
        return [{"role": "user", "content": text}, *chat]
    user = chat[at]
    return [*chat[:at], {**user, "content": f"{text}\n\n{user['content']}"}, *chat[at + 1:]]
