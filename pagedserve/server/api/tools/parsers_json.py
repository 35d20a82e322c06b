"""Tool calls written as bare JSON after a marker, whole (``extract``) or as the text streams.

``llama3_json`` reads Llama 3.1–3.3's format: each call a JSON object ``{"name": ...,
"parameters": {...}}`` (``arguments`` is read too), the first one optionally after
``<|python_tag|>``, several separated by ``;``. ``mistral`` reads Mistral's: ``[TOOL_CALLS]``
followed by a JSON array of ``{"name": ..., "arguments": {...}}`` objects, or by
``name[ARGS]{...}``; its call ids are nine letters and digits, as Mistral's templates demand.

The text before a call is the message's content; so is text after a call that opens no
other, and a call whose JSON does not parse, as vLLM leaves it. Streamed, a call is sent whole
once its JSON value is complete (until then it may still turn out to be text).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pagedserve.server.api.tools.parsers import (
    ToolCall,
    ToolCallDelta,
    ToolParser,
    ToolStream,
    assemble,
    partial_suffix,
)

_DECODER = json.JSONDecoder()
_SEPARATORS = " \t\r\n;,"


@dataclass(frozen=True, slots=True)
class _Marker:
    text: str
    kept: bool  # the marker is the start of the call's JSON (``{"name"``), not a prefix


class Incomplete(Exception):
    """The text may still become a call: wait for more."""


class _MarkedJsonStream(ToolStream):
    """Content until a marker, then JSON values that ``read`` turns into calls."""

    def __init__(self, markers: tuple[_Marker, ...],
                 read: Callable[[str], tuple[list[ToolCall], int] | None]) -> None:
        self._markers = markers
        self._read = read  # (calls, characters used) from text that starts a call, or None
        self._held = ""
        self._in_calls = False
        self._opened = ""  # the marker text the calls began with (content if they fail)
        self._count = 0

    def feed(self, text: str, final: bool) -> tuple[str, list[ToolCallDelta]]:
        self._held += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while self._held and (self._in_calls or self._open(content, final)):
            body = self._held.lstrip(_SEPARATORS)
            if not body:  # separators after a call: what follows decides
                self._held = self._held if not final else ""
                break
            if any(body.startswith(m.text) for m in self._markers if not m.kept):
                self._held, self._in_calls = body, False  # the next call has its own marker
                continue
            if not final and any(m.text.startswith(body) for m in self._markers):
                break  # perhaps a marker
            try:
                read = self._read(body)
            except Incomplete:
                if not final:
                    break
                read = None
            if read is None:
                content.append(self._opened + self._held)  # not a call after all
                self._held, self._in_calls = "", False
                break
            found, used = read
            calls.extend(found)
            self._held, self._opened = body[used:], ""
            # Another call follows, or the text goes back to content.
            rest = self._held.lstrip(_SEPARATORS)
            self._in_calls = not rest or rest[0] in "{["
        first, self._count = self._count, self._count + len(calls)
        return "".join(content), [ToolCallDelta.whole(first + k, call)
                                  for k, call in enumerate(calls)]

    def _open(self, content: list[str], final: bool) -> bool:
        """Move the text before the first marker to ``content``; True once one is found."""
        hits = [(self._held.find(m.text), m) for m in self._markers]
        hits = [(at, m) for at, m in hits if at >= 0]
        if not hits:
            keep = 0 if final else max(partial_suffix(self._held, m.text)
                                       for m in self._markers)
            content.append(self._held[:len(self._held) - keep])
            self._held = self._held[len(self._held) - keep:]
            return False
        at, marker = min(hits, key=lambda hit: hit[0])
        content.append(self._held[:at])
        self._opened = "" if marker.kept else marker.text
        self._held = self._held[at + len(self._opened):]
        self._in_calls = True
        return True


def decode(body: str, start: int = 0) -> tuple[Any, int] | None:
    """The JSON value at ``body[start:]`` and where it ends; None where it is not JSON;
    Incomplete where more text could complete it."""
    try:
        return _DECODER.raw_decode(body, start)
    except json.JSONDecodeError as exc:
        # Cut inside a string, or at the end: more text may complete it.
        if exc.msg.startswith("Unterminated string") or exc.pos >= len(body.rstrip()):
            raise Incomplete from None
        return None


def _call(value: Any, arguments_key: str) -> ToolCall | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False))


class _JsonParser(ToolParser):
    markers: tuple[_Marker, ...] = ()

    def extract(self, text: str) -> tuple[str | None, list[ToolCall]]:
        content, deltas = self.stream().feed(text, final=True)
        calls = assemble(deltas)
        return (content.strip() or None) if calls else (content or None), calls

    def stream(self) -> ToolStream:
        return _MarkedJsonStream(self.markers, self.read)

    def read(self, body: str) -> tuple[list[ToolCall], int] | None:
        raise NotImplementedError


class Llama3JsonToolParser(_JsonParser):
    markers = (_Marker("<|python_tag|>", kept=False), _Marker('{"name"', kept=True))

    def read(self, body: str) -> tuple[list[ToolCall], int] | None:
        decoded = decode(body)
        if decoded is None:
            return None
        call = _call(decoded[0], "parameters")
        return None if call is None else ([call], decoded[1])


def mistral_call_id() -> str:
    """Nine letters and digits, the only ids Mistral's templates take back."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))


class MistralToolParser(_JsonParser):
    markers = (_Marker("[TOOL_CALLS]", kept=False),)

    def read(self, body: str) -> tuple[list[ToolCall], int] | None:
        if body[:1] not in "[{":
            return _named_arguments(body)
        decoded = decode(body)
        if decoded is None:
            return None
        value, end = decoded
        items = value if isinstance(value, list) else [value]
        calls = [call for item in items if (call := _call(item, "arguments")) is not None]
        if not calls or len(calls) < len(items):
            return None
        for call in calls:
            call.id = mistral_call_id()
        return calls, end


_NAME = re.compile(r"[\w.-]+")
# A name and as much of "[ARGS]" as has come.
_NAME_SO_FAR = re.compile(r"[\w.-]+(\[(A(R(G(S)?)?)?)?)?")


def _named_arguments(body: str) -> tuple[list[ToolCall], int] | None:
    """``name[ARGS]{...}``, Mistral's format from its v11 tokenizer on."""
    at = body.find("[ARGS]")
    if at < 0:
        if _NAME_SO_FAR.fullmatch(body):
            raise Incomplete
        return None
    name = body[:at]
    decoded = decode(body, at + len("[ARGS]")) if _NAME.fullmatch(name) else None
    if decoded is None:
        return None
    arguments, end = decoded
    return [ToolCall(name, json.dumps(arguments, ensure_ascii=False), mistral_call_id())], end
