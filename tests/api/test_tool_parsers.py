"""The Hermes tool-call parser, whole and streamed in every split of its text, and the
readers of grammar-shaped calls (tool_choice required and named)."""

from __future__ import annotations

import pytest

from pagedserve.server.api.tool_parsers import HermesToolParser, NamedCall, RequiredCalls

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
    content, calls = "", []
    for k, piece in enumerate(pieces):
        text, done = stream.feed(piece, final=k == len(pieces) - 1)
        assert "<" not in text  # a call's markup is never sent as content, even in part
        content += text
        calls += done
    assert content.strip() == "Let me look."
    assert _plain(calls) == [("get_weather", '{"city": "Oslo"}'), ("get_time", "{}")]


def test_required_and_named_outputs() -> None:
    content, calls = RequiredCalls().extract(
        '[{"name": "f", "parameters": {"x": 1}}, {"name": "g", "parameters": {}}]')
    assert content is None and _plain(calls) == [("f", '{"x": 1}'), ("g", "{}")]
    assert RequiredCalls().extract('[{"name": "f", "para') == ('[{"name": "f", "para', [])
    content, calls = NamedCall("f").extract('{"x": 2}')
    assert content is None and _plain(calls) == [("f", '{"x": 2}')]
