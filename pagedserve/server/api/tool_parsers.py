"""Tool calls out of a model's text: whole (``extract``) or as the text streams (``stream``).

``hermes`` reads the format Hermes and Qwen models are trained on (and their chat templates
describe): each call a JSON object ``{"name": ..., "arguments": {...}}`` between
``<tool_call>`` and ``</tool_call>``, the text before the first call being the message's
content. A call whose JSON does not parse stays in the content as text, as vLLM leaves it.

``tool_choice`` "required" and a named function are enforced by a grammar instead (see
``protocol_tools``); their outputs are read by ``RequiredCalls`` and ``NamedCall``.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=_call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


class ToolStream(ABC):
    """One choice's text as it streams: ``feed`` returns the content to send now and the
    calls completed by this piece; ``final`` flushes whatever was held back."""

    @abstractmethod
    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCall]]: ...


class ToolParser(ABC):
    @abstractmethod
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The message's content (None when there is none) and its tool calls."""

    @abstractmethod
    def stream(self) -> ToolStream: ...


def _call_from_json(body: str, arguments_key: str = "arguments") -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, {})
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class HermesToolParser(ToolParser):
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        stream = self.stream()
        content, calls = stream.feed(text, final=True)
        return (content.strip() or None) if calls else (content or None), calls

    def stream(self) -> ToolStream:
        return _HermesStream()


class _HermesStream(ToolStream):
    def __init__(self) -> None:
        self._held = ""
        self._in_call = False

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        self._held += text
        content, calls = [], []
        while True:
            if self._in_call:
                end = self._held.find(_CLOSE)
                if end < 0:
                    break
                body, self._held = self._held[:end], self._held[end + len(_CLOSE):]
                self._in_call = False
                call = _call_from_json(body)
                if call is None:
                    content.append(_OPEN + body + _CLOSE)
                else:
                    calls.append(call)
                continue
            start = self._held.find(_OPEN)
            if start < 0:
                keep = 0 if final else _partial_suffix(self._held, _OPEN)
                content.append(self._held[:len(self._held) - keep])
                self._held = self._held[len(self._held) - keep:]
                break
            content.append(self._held[:start])
            self._held = self._held[start + len(_OPEN):]
            self._in_call = True
        if final and self._in_call:  # the model stopped inside a call: read what is there
            call = _call_from_json(self._held)
            if call is None:
                content.append(_OPEN + self._held)
            else:
                calls.append(call)
            self._held, self._in_call = "", False
        return "".join(content), calls


def _partial_suffix(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class _WholeStream(ToolStream):
    """Holds the text until the end: the grammar-shaped outputs are read whole."""

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser
        self._text = ""

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCall]]:
        self._text += text
        if not final:
            return "", []
        content, calls = self._parser.extract(self._text)
        return content or "", calls


class RequiredCalls(ToolParser):
    """``tool_choice: "required"``: the grammar made the output a JSON array of
    ``{"name": ..., "parameters": {...}}``."""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            items = json.loads(text)
        except ValueError:
            return text or None, []  # cut short by max_tokens: the text is all there is
        calls = [_call_from_json(json.dumps(item), "parameters") for item in items]
        return None, [c for c in calls if c is not None]

    def stream(self) -> ToolStream:
        return _WholeStream(self)


class NamedCall(ToolParser):
    """A named ``tool_choice``: the grammar made the output that function's arguments."""

    def __init__(self, name: str) -> None:
        self.name = name

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        return None, [ToolCall(self.name, text)]

    def stream(self) -> ToolStream:
        return _WholeStream(self)


TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser}
