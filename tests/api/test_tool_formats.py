"""Tool formats: which one a chat template teaches (read from what it renders and the marker
it writes), the generic format's messages for templates without tool support, and each
format's grammar for a call under ``tool_choice: "auto"``: free text, or calls whose
arguments follow their tool's parameters, one at most without ``parallel_tool_calls``."""

from __future__ import annotations

import json

import pytest
import xgrammar

from pagedserve.server.api.protocol.tools import ToolRequest
from pagedserve.server.api.tools.formats import (
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    ModelTools,
    ToolFormat,
)
from pagedserve.server.api.tools.generic import generic_messages, instructions
from pagedserve.server.sampling.grammar import GrammarCompiler
from pagedserve.server.tokenizer.chat_capabilities import TemplateCapabilities
from tests.tokenizer_files import CHATML_TEMPLATE

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Oslo", "Rome"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {}, "additionalProperties": False}}}]

# Small templates in the shape of each family's (written here, not taken from checkpoints).
LLAMA_STYLE = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nCall a function as "
    '{"name": function name, "parameters": arguments}:{% for t in tools %}'
    "{{ t | tojson }}{% endfor %}<|eot_id|>{% endif %}"
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content }}{% for c in m.tool_calls or [] %}"
    '{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}'
    "{% endfor %}<|eot_id|>{% endfor %}"
)
MISTRAL_STYLE = (
    "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | map(attribute='function') | list"
    " | tojson }}</s>{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% else %}{{ m.content }}</s>{% endif %}{% endfor %}"
)
# Only user and assistant turns, alternating: no system message, no tool role.
ALTERNATING = (
    "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
    "{{ raise_exception('only user and assistant turns') }}{% endif %}"
    "[{{ m.role }}] {{ m.content }}\n{% endfor %}"
)


@pytest.mark.parametrize(("template", "expected", "capabilities"), [
    (None, HERMES, TemplateCapabilities(True, True, True, True)),
    (LLAMA_STYLE, LLAMA3_JSON, TemplateCapabilities(True, True, True, True)),
    (MISTRAL_STYLE, MISTRAL, TemplateCapabilities(True, True, True, True)),
    (CHATML_TEMPLATE, GENERIC, TemplateCapabilities(False, False, True, True)),
    (ALTERNATING, GENERIC, TemplateCapabilities(False, False, False, False)),
])
def test_the_format_is_read_from_the_template(template: str | None, expected: ToolFormat,
                                              capabilities: TemplateCapabilities) -> None:
    model = ModelTools.of(template, {})
    assert (model.format, model.capabilities) == (expected, capabilities)
    assert ModelTools.of(template, {}, "mistral").format == MISTRAL  # --tool-call-parser


ARGUMENTS = '{"city": "Rome"}'
LOOP = [{"role": "user", "content": "Weather in Rome?"},
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": ARGUMENTS}},
            {"id": "call_2", "type": "function",
             "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "noon"}]
CALLS_TEXT = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
              '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')


def test_generic_messages_where_the_template_shows_system_and_tool_turns() -> None:
    tools = ToolRequest(TOOLS, "auto", parallel=True)
    chat = generic_messages(LOOP, tools, TemplateCapabilities(False, False, True, True))
    assert chat == [
        {"role": "system", "content": instructions(tools)},
        LOOP[0],
        {"role": "assistant", "content": CALLS_TEXT},
        {"role": "tool", "tool_call_id": "call_1",
         "content": "<tool_response>\n18 C\n</tool_response>"},
        {"role": "tool", "tool_call_id": "call_2",
         "content": "<tool_response>\nnoon\n</tool_response>"},
    ]
    assert '{"name": "get_weather", "parameters": ' in instructions(tools)
    assert "one <tool_call> block for each" in instructions(tools)


def test_generic_messages_where_the_template_shows_user_and_assistant_only() -> None:
    tools = ToolRequest(TOOLS, "required", parallel=False)
    chat = generic_messages([{"role": "system", "content": "Be brief."}, *LOOP], tools,
                            TemplateCapabilities(False, False, False, False))
    assert chat == [
        {"role": "system", "content": "Be brief."},  # the template drops it: not ours
        {"role": "user", "content": instructions(tools) + "\n\nWeather in Rome?"},
        {"role": "assistant", "content": CALLS_TEXT},
        {"role": "user", "content": "<tool_response>\n18 C\n</tool_response>\n"
                                    "<tool_response>\nnoon\n</tool_response>"},
    ]
    assert "Call at most one function." in instructions(tools)


def test_generic_keeps_an_assistants_text_beside_its_calls_and_a_system_message() -> None:
    chat = generic_messages(
        [{"role": "system", "content": "Be brief."}, LOOP[0],
         {**LOOP[1], "content": "Let me check.", "tool_calls": LOOP[1]["tool_calls"][:1]}],
        ToolRequest(TOOLS, "auto", parallel=True), TemplateCapabilities(False, False, True, True))
    assert chat[0]["content"].startswith("Be brief.\n\nYou can call functions.")
    assert chat[2]["content"] == "Let me check.\n" + CALLS_TEXT.split("\n<tool_call>")[0]


def _accepts(fmt: ToolFormat, parallel: bool, text: str) -> bool:
    compiler = GrammarCompiler([bytes([b]) for b in range(256)] + [b""], [256])
    matcher = xgrammar.GrammarMatcher(
        compiler.compile(fmt.call_grammar(ToolRequest(TOOLS, "auto", parallel))))
    return matcher.accept_string(text) and matcher.accept_token(256)  # and may end there


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
CALLS = {
    HERMES: (HERMES_CALL, HERMES_CALL.replace("Rome", "Paris"),
             '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'),
    LLAMA3_JSON: ('{"name": "get_weather", "parameters": {"city": "Rome"}}',
                  '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                  '; {"name": "get_time", "parameters": {}}'),
    MISTRAL: ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]',
              '[TOOL_CALLS][{"name": "get_weather", "arguments": {"town": "Rome"}}]',
              None),
}


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON, MISTRAL, GENERIC])
def test_auto_grammar_allows_text_or_valid_calls(fmt: ToolFormat) -> None:
    valid, invalid, second = CALLS[HERMES if fmt is GENERIC else fmt]
    assert _accepts(fmt, True, "It is sunny in Rome today.")
    assert _accepts(fmt, True, "Let me look. " + valid)
    assert not _accepts(fmt, True, invalid)
    assert not _accepts(fmt, True, valid.replace("get_weather", "get_wether"))
    if second is not None:
        assert _accepts(fmt, True, valid + second)
        assert not _accepts(fmt, False, valid + second)  # parallel_tool_calls false
    else:  # one array holds every call
        two = valid.replace("}}]", '}}, {"name": "get_time", "arguments": {}}]')
        assert _accepts(fmt, True, two) and not _accepts(fmt, False, two)


def test_the_generic_format_leaves_tools_out_of_the_template() -> None:
    assert json.loads(GENERIC.call_grammar(ToolRequest(TOOLS, "auto", True)).structural_tag)
    assert (GENERIC.template_tools, HERMES.template_tools) == (False, True)


def test_a_marker_that_is_a_special_token_leaves_auto_calls_unconstrained() -> None:
    """The grammar's vocabulary has no text for special tokens: a grammar would forbid the
    very marker that starts a call."""
    assert ModelTools.of(MISTRAL_STYLE, {}).constrained
    assert not ModelTools.of(MISTRAL_STYLE, {}, special_texts=frozenset({"[TOOL_CALLS]"})
                             ).constrained
