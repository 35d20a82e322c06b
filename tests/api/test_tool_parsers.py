"""The Hermes tool-call parser, whole and streamed in every split of its text, and the
readers of grammar-shaped calls (tool_choice required and named), whose arguments stream
piece by piece and add up to what the whole output gives."""

from __future__ import annotations

import pytest

from pagedserve.server.api.tools.grammar_calls import NamedCall, RequiredCalls
from pagedserve.server.api.tools.parsers import HermesToolParser, assemble

CALLS_TEXT = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
              '"Oslo"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
              '</tool_call>')


def _plain(calls: list) -> list[tuple[str, str]]:
    return [(c.name, c.arguments) for c in calls]


def test_hermes_reads_content_and_calls() -> None:
    content, calls = HermesToolParser().extract(CALLS_TEXT)
    assert content == "Let me look."
    assert _plain(calls) == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]
    assert calls[0].id != calls[1].id and calls[0].id.startswith("call_")
    assert calls[0].to_openai() == {"id": calls[0].id, "type": "function", "function": {
        "name": "get_weather", "arguments": '{"city": "Oslo"}'}}


@pytest.mark.parametrize(("text", "content", "calls"), [
    ("no calls here", "no calls here", []),
    ("", None, []),
    ('<tool_call>\n{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a": 1}')]),
    ("<tool_call>\nnot json\n</tool_call>", "<tool_call>\nnot json\n</tool_call>", []),
    ("a < b <tool", "a < b <tool", []),
])
def test_hermes_edge_cases(text: str, content: str | None, calls: list) -> None:
    got_content, got_calls = HermesToolParser().extract(text)
    assert (got_content, _plain(got_calls)) == (content, calls)


@pytest.mark.parametrize("size", [1, 2, 3, 5, 11, 1000])
def test_hermes_streams_the_same_calls_in_any_split(size: int) -> None:
    stream = HermesToolParser().stream()
    pieces = [CALLS_TEXT[i:i + size] for i in range(0, len(CALLS_TEXT), size)]
    content, deltas = "", []
    for k, piece in enumerate(pieces):
        text, done = stream.feed(piece, final=k == len(pieces) - 1)
        assert "<" not in text  # a call's markup is never sent as content, even in part
        content += text
        deltas += done
    assert content.strip() == "Let me look."
    assert all(d.id is not None for d in deltas)  # each call comes whole
    assert _plain(assemble(deltas)) == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]


def test_required_and_named_outputs() -> None:
    content, calls = RequiredCalls().extract(
        '[{"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {}}]')
    assert content is None and _plain(calls) == [("f", '{"x": 1}'), ("g", "{}")]
    assert RequiredCalls().extract('[{"name": "f", "para') == ('[{"name": "f", "para', [])
    content, calls = NamedCall("f").extract('{"x": 2}')
    assert content is None and _plain(calls) == [("f", '{"x": 2}')]


# Strings that hold the array's own punctuation, a nested array, and a call that names its
# function after its arguments.
REQUIRED_TEXT = ('[{"name": "f", "parameters": {"x": [1, {"y": "a,}\\" b"}], "z": null}}, '
                 '{"parameters": {"q": "]"}, "name": "g"}]')


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_required_arguments_stream_as_they_come(size: int) -> None:
    stream = RequiredCalls().stream()
    deltas = []
    for i in range(0, len(REQUIRED_TEXT), size):
        content, piece = stream.feed(REQUIRED_TEXT[i:i + size],
                                     final=i + size >= len(REQUIRED_TEXT))
        assert content == ""
        deltas += piece
    assert [(d.index, d.name) for d in deltas if d.id is not None] == [(0, "f"), (1, "g")]
    # The first call's arguments come piece by piece (unless the text came at once).
    pieces = [d.arguments for d in deltas if d.index == 0]
    assert (len(pieces) == 1) == (size >= len(REQUIRED_TEXT))
    calls = assemble(deltas)
    _, whole = RequiredCalls().extract(REQUIRED_TEXT)
    assert _plain(calls) == _plain(whole) == [
        ("f", '{"x": [1, {"y": "a,}\\" b"}], "z": null}'), ("g", '{"q": "]"}')]


def test_a_cut_short_required_call_streams_what_came() -> None:
    stream = RequiredCalls().stream()
    _, deltas = stream.feed('[{"name": "f", "parameters": {"x": 1', final=True)
    assert _plain(assemble(deltas)) == [("f", '{"x": 1')]
    assert RequiredCalls().stream().feed('[{"name": "f', final=True) == ("", [])


def test_named_arguments_stream_as_they_come() -> None:
    stream = NamedCall("f").stream()
    first, second = stream.feed('{"x"', False)[1], stream.feed(": 2}", True)[1]
    assert [(d.index, d.name, d.arguments) for d in first + second] == [
        (0, "f", '{"x"'), (0, None, ": 2}")]
    assert first[0].id.startswith("call_")
