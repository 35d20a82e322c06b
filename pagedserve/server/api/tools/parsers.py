"""Tool calls out of a model's text: whole (``extract``) or as the text streams (``stream``).

``hermes`` reads the format Hermes and Qwen models are trained on (and their chat templates
describe): each call a JSON object ``{"name": ..., "arguments": {...}}`` between
``<tool_call>`` and ``</tool_call>``, the text before the first call being the message's
content. A call whose JSON does not parse stays in the content as text, as vLLM leaves it.

``tool_choice`` "required" and a named function are enforced by a grammar instead (see
``protocol/tools.py``); ``grammar_calls.py`` reads their outputs.

A stream sends each call as ``ToolCallDelta`` pieces: the first carries the call's id and
name, and the pieces' ``arguments`` add up to the call's whole arguments text. A Hermes call
is sent whole once its closing tag arrives (its JSON names the call after or before its
arguments, and a call that does not parse is content after all).
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=call_id)

    def to_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of one streamed call."""

    index: int  # the call's place among its choice's calls
    arguments: str  # the next piece of its arguments' JSON text
    id: str | None = None  # the call's id and name, on its first piece only
    name: str | None = None

    @classmethod
    def whole(cls, index: int, call: ToolCall) -> ToolCallDelta:
        return cls(index, call.arguments, call.id, call.name)

    def to_openai(self) -> dict[str, Any]:
        """As a chat chunk's ``tool_calls`` item."""
        if self.id is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {"index": self.index, "id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


def assemble(deltas: list[ToolCallDelta]) -> list[ToolCall]:
    """The whole calls that streamed pieces make."""
    calls: dict[int, ToolCall] = {}
    for delta in deltas:
        if delta.id is not None:
            calls[delta.index] = ToolCall(delta.name or "", "", delta.id)
        calls[delta.index].arguments += delta.arguments
    return list(calls.values())


class ToolStream(ABC):
    """One choice's text as it streams: ``feed`` returns the content to send now and the
    pieces of calls this text adds; ``final`` flushes whatever was held back."""

    @abstractmethod
    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCallDelta]]: ...


class ToolParser(ABC):
    @abstractmethod
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The message's content (None when there is none) and its tool calls."""

    @abstractmethod
    def stream(self) -> ToolStream: ...


class FirstCallOnly(ToolParser):
    """``parallel_tool_calls: false``: the first call alone, whatever else the text holds."""

    def __init__(self, parser: ToolParser) -> None:
        self._parser = parser

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        content, calls = self._parser.extract(text)
        return content, calls[:1]

    def stream(self) -> ToolStream:
        return _FirstCallStream(self._parser.stream())


class _FirstCallStream(ToolStream):
    def __init__(self, stream: ToolStream) -> None:
        self._stream = stream

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCallDelta]]:
        content, deltas = self._stream.feed(text, final)
        return content, [delta for delta in deltas if delta.index == 0]


def _call_from_json(body: str) -> ToolCall | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class HermesToolParser(ToolParser):
    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        content, deltas = self.stream().feed(text, final=True)
        calls = assemble(deltas)
        return (content.strip() or None) if calls else (content or None), calls

    def stream(self) -> ToolStream:
        return _HermesStream()


class _HermesStream(ToolStream):
    def __init__(self) -> None:
        self._held = ""
        self._in_call = False
        self._count = 0

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCallDelta]]:
        self._held += text
        content: list[str] = []
        calls: list[ToolCall] = []
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
                keep = 0 if final else partial_suffix(self._held, _OPEN)
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
        first, self._count = self._count, self._count + len(calls)
        return "".join(content), [ToolCallDelta.whole(first + k, call)
                                  for k, call in enumerate(calls)]


def partial_suffix(text: str, marker: str) -> int:
    """How many trailing characters of ``text`` could be the start of ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


TOOL_PARSERS: dict[str, type[ToolParser]] = {"hermes": HermesToolParser}
