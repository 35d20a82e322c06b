"""The Llama 3 JSON and Mistral tool-call parsers, whole and streamed in every split of their
text; and ``parallel_tool_calls: false`` keeping the first call of any parser."""

from __future__ import annotations

import re

import pytest

from pagedserve.server.api.tools.parsers import (
    FirstCallOnly,
    HermesToolParser,
    ToolParser,
    assemble,
)
from pagedserve.server.api.tools.parsers_json import Llama3JsonToolParser, MistralToolParser

LLAMA = ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
         '{"name": "get_time", "parameters": {}}')
MISTRAL = ('Checking.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
           '{"name": "get_time", "arguments": {}}]')
MISTRAL_V11 = 'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]get_time[ARGS]{}'
TWO_CALLS = [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]


def _plain(calls: list) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in calls]


@pytest.mark.parametrize(("parser", "text", "content"), [
    (Llama3JsonToolParser(), LLAMA, None),
    (MistralToolParser(), MISTRAL, "Checking."),
    (MistralToolParser(), MISTRAL_V11, "Checking."),
])
def test_calls_and_content_are_read(parser: ToolParser, text: str, content: str | None) -> None:
    got_content, calls = parser.extract(text)
    assert (got_content, _plain(calls)) == (content, TWO_CALLS)


def test_mistral_call_ids_are_nine_letters_and_digits() -> None:
    _, calls = MistralToolParser().extract(MISTRAL)
    assert all(re.fullmatch(r"[A-Za-z0-9]{9}", c.id) for c in calls)
    assert calls[0].id != calls[1].id


@pytest.mark.parametrize(("parser", "text", "content", "calls"), [
    (Llama3JsonToolParser(), "It is sunny.", "It is sunny.", []),
    (Llama3JsonToolParser(), "", None, []),
    (Llama3JsonToolParser(), '{"name": "f", "parameters": {"a": 1}} and more',
     "and more", [("f", '{"a": 1}')]),
    (Llama3JsonToolParser(), '{"name": cut', '{"name": cut', []),
    (Llama3JsonToolParser(), '{"name": 5, "parameters": {}}', '{"name": 5, "parameters": {}}',
     []),
    (MistralToolParser(), "[TOOL_CALLS] not json", "[TOOL_CALLS] not json", []),
    (MistralToolParser(), '[TOOL_CALLS]f[ARGS]{"a": 1', '[TOOL_CALLS]f[ARGS]{"a": 1', []),
])
def test_edge_cases(parser: ToolParser, text: str, content: str | None, calls: list) -> None:
    got_content, got_calls = parser.extract(text)
    assert (got_content, _plain(got_calls)) == (content, calls)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(("parser", "text", "content"), [
    (Llama3JsonToolParser(), "Sure. " + LLAMA, "Sure. "),
    (MistralToolParser(), MISTRAL, "Checking."),
    (MistralToolParser(), MISTRAL_V11, "Checking."),
])
def test_streams_the_same_calls_in_any_split(parser: ToolParser, text: str, content: str,
                                             size: int) -> None:
    stream = parser.stream()
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    streamed, deltas = "", []
    for k, piece in enumerate(pieces):
        part, done = stream.feed(piece, final=k == len(pieces) - 1)
        streamed += part
        deltas += done
    assert streamed == content  # no markup or separator is ever sent as content
    assert all(d.id is not None for d in deltas)  # each call comes whole
    assert _plain(assemble(deltas)) == TWO_CALLS


@pytest.mark.parametrize("parser", [HermesToolParser(), MistralToolParser()])
def test_without_parallel_calls_only_the_first_counts(parser: ToolParser) -> None:
    text = MISTRAL if isinstance(parser, MistralToolParser) else (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    _, calls = FirstCallOnly(parser).extract(text)
    assert _plain(calls) == TWO_CALLS[:1]
    stream = FirstCallOnly(parser).stream()
    _, deltas = stream.feed(text, final=True)
    assert _plain(assemble(deltas)) == TWO_CALLS[:1]
