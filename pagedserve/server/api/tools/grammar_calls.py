"""The outputs that ``tool_choice`` "required" and a named function's grammars shape (see
``protocol/tools.py``), read whole or as they stream, each call's arguments sent as its tokens
arrive.

"required": a JSON array of ``{"name": ..., "parameters": {...}}``. A call's arguments are
the text of its ``parameters`` value as the model wrote it, so the streamed pieces add up to
exactly what the whole output gives; its first piece waits for its name. A named function:
the whole output is that function's arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from pagedserve.server.api.tools.parsers import (
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolStream,
    assemble,
    call_id,
)

_ITEM_DEPTH = 2  # inside the array (1) and inside one call's object (2)


class RequiredCalls(ToolParser):
    """``tool_choice: "required"``."""

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        try:
            json.loads(text)
        except ValueError:
            return text or None, []  # cut short by max_tokens: the text is all there is
        _, deltas = self.stream().feed(text, final=True)
        return None, assemble(deltas)

    def stream(self) -> ToolStream:
        return _CallArrayStream()


class NamedCall(ToolParser):
    """A named ``tool_choice``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        return None, [ToolCall(self.name, text)]

    def stream(self) -> ToolStream:
        return _ArgumentsStream(self.name)


class _ArgumentsStream(ToolStream):
    def __init__(self, name: str) -> None:
        self._name = name
        self._opened = False

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCallDelta]]:
        if not self._opened:
            self._opened = True
            return "", [ToolCallDelta(0, text, call_id(), self._name)]
        return "", [ToolCallDelta(0, text)] if text else []


@dataclass(slots=True)
class _Call:
    """One ``{"name": ..., "parameters": ...}`` object of the array, as far as it has come."""

    index: int
    key: str | None = None  # the member whose value comes next (None: a key comes next)
    awaiting_value: bool = False  # between a member's ":" and its value's first character
    name: str | None = None
    arguments_start: int | None = None  # where ``parameters``' value begins in the text
    arguments_end: int = 0  # past its last character read so far (spaces after it aside)
    arguments_done: bool = False
    sent: int = 0  # how far into the text its arguments were sent
    opened: bool = False  # its first piece (id and name) was sent
    id: str = field(default_factory=call_id)

    @property
    def in_arguments(self) -> bool:
        return self.arguments_start is not None and not self.arguments_done

    def end_member(self) -> None:
        if self.arguments_start is not None:
            self.arguments_done = True
        self.key = None


class _CallArrayStream(ToolStream):
    """Reads the array one character at a time, tracking only nesting and strings (the
    grammar guarantees the rest), so that each step costs its new text alone."""

    def __init__(self) -> None:
        self._text = ""
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self._string_start = 0
        self._call: _Call | None = None
        self._count = 0

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCallDelta]]:
        start = len(self._text)
        self._text += text
        deltas: list[ToolCallDelta] = []
        for i in range(start, len(self._text)):
            self._read(i, deltas)
        if self._call is not None:
            self._send(self._call, deltas)
        return "", deltas

    def _read(self, i: int, deltas: list[ToolCallDelta]) -> None:
        char, call = self._text[i], self._call
        if self._in_string:
            if call is not None and call.in_arguments:
                call.arguments_end = i + 1
            self._read_string(i, char, call)
            return
        if char.isspace():
            return
        depth = self._depth
        if call is not None and depth == _ITEM_DEPTH:
            if char in ",}":
                call.end_member()
            elif char == ":":
                call.awaiting_value = True
                return
            elif call.awaiting_value and call.key == "parameters":
                call.arguments_start = call.sent = i
        if call is not None:
            call.awaiting_value = False
            if call.in_arguments:
                call.arguments_end = i + 1
        if char == '"':
            self._in_string, self._string_start = True, i
        elif char in "[{":
            self._depth += 1
            if self._depth == _ITEM_DEPTH:
                self._call = _Call(self._count)
                self._count += 1
        elif char in "]}":
            self._depth -= 1
            if depth == _ITEM_DEPTH and call is not None:
                self._send(call, deltas)
                self._call = None

    def _read_string(self, i: int, char: str, call: _Call | None) -> None:
        if self._escaped:
            self._escaped = False
        elif char == "\\":
            self._escaped = True
        elif char == '"':
            self._in_string = False
            if call is not None and self._depth == _ITEM_DEPTH:
                value = json.loads(self._text[self._string_start:i + 1])
                if call.key is None:
                    call.key = value
                elif call.key == "name":
                    call.name = value

    def _send(self, call: _Call, deltas: list[ToolCallDelta]) -> None:
        """What of ``call`` is new: its opening once its name is known, then its arguments
        as far as they have come."""
        if call.name is None:
            return
        piece = ""
        if call.arguments_start is not None:
            piece = self._text[call.sent:call.arguments_end]
            call.sent = max(call.sent, call.arguments_end)
        if not call.opened:
            call.opened = True
            deltas.append(ToolCallDelta(call.index, piece, call.id, call.name))
        elif piece:
            deltas.append(ToolCallDelta(call.index, piece))
