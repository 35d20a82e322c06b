"""Tool calling over HTTP with the openai SDK, on a checkpoint without a chat template (so
the default, tools-aware one renders): ``tools`` with ``tool_choice`` auto (the Hermes
parser; a regex makes the random model write a call), required and named (grammars), none;
``parallel_tool_calls``; streamed ``tool_calls`` deltas; ``tool`` results and assistant
calls back through the template; bad tool requests as exact 400s."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from pagedserve.server.tokenizer import load_tokenizer
from tests.api.live_server import LiveServer
from tests.live_model import MODEL

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
           "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]},
                          "unit": {"enum": ["C", "F"]}}}
TIME = {"type": "object", "additionalProperties": False, "required": ["zone"],
        "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 12}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
# Makes the random model write one Hermes call, so that the auto path parses a real output.
HERMES_CALL = (r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "(Oslo|Lima)", '
               r'"unit": "C"\}\}\n</tool_call>')


@pytest_asyncio.fixture
async def client(tools_server: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=tools_server.base_url + "/v1", api_key="unused",
                           max_retries=0) as openai_client:
        yield openai_client


def check_call(call: Any) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


async def test_auto_parses_the_models_hermes_call(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=1.0, max_tokens=200,
        extra_body={"guided_regex": HERMES_CALL})
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    check_call(call)


async def test_auto_streams_the_call_as_a_tool_calls_delta(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=1.0, max_tokens=200,
        stream=True, extra_body={"guided_regex": r"Sure\. " + HERMES_CALL})
    content, calls, reasons = "", [], []
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += choice.delta.tool_calls or []
            reasons.append(choice.finish_reason)
    assert content == "Sure. "
    (call,) = calls
    assert call.index == 0 and call.function.name == "get_weather"
    check_call(call)
    assert reasons[-1] == "tool_calls"


@pytest.mark.parametrize("parallel", [True, False])
async def test_required_calls_come_from_the_grammar(client: AsyncOpenAI,
                                                    parallel: bool) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="required", n=2,
        parallel_tool_calls=parallel, temperature=1.0, seed=4, max_tokens=250)
    finished = [c for c in result.choices if c.finish_reason == "tool_calls"]
    assert finished
    for choice in finished:
        assert choice.message.content is None and choice.message.tool_calls
        if not parallel:
            assert len(choice.message.tool_calls) == 1
        for call in choice.message.tool_calls:
            check_call(call)
    for choice in result.choices:
        if choice.finish_reason == "length":  # random weights may list calls past the limit
            assert choice.message.tool_calls is None
            assert choice.message.content.startswith('[{"name": "get_')


async def test_a_named_choice_calls_that_function_streamed(client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, temperature=1.0, max_tokens=200,
        tool_choice={"type": "function", "function": {"name": "get_time"}}, stream=True,
        seed=6)
    deltas, reasons = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            assert not choice.delta.content
            deltas += choice.delta.tool_calls or []
            reasons.append(choice.finish_reason)
    call = deltas[0]
    assert call.function.name == "get_time" and {d.index for d in deltas} == {0}
    call.function.arguments = "".join(d.function.arguments for d in deltas)
    check_call(call)
    assert reasons[-1] == "stop"


async def streamed_calls(stream: Any) -> dict[tuple[int, int], list[Any]]:
    """Each (choice, call)'s ``tool_calls`` deltas, in order."""
    calls: dict[tuple[int, int], list[Any]] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                calls.setdefault((choice.index, delta.index), []).append(delta)
    return calls


@pytest.mark.parametrize("tool_choice", [
    "required", {"type": "function", "function": {"name": "get_weather"}}])
async def test_grammar_call_arguments_stream_as_tokens_arrive(client: AsyncOpenAI,
                                                              tool_choice: Any) -> None:
    request = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "temperature": 1.0,
               "seed": 4, "max_tokens": 250, "n": 2, "tool_choice": tool_choice,
               "parallel_tool_calls": False}
    whole = await client.chat.completions.create(**request)
    streamed = await streamed_calls(await client.chat.completions.create(**request,
                                                                         stream=True))
    for choice in whole.choices:
        (call,) = choice.message.tool_calls
        first, *rest = streamed[(choice.index, 0)]
        assert (first.type, first.function.name) == ("function", call.function.name)
        assert first.id.startswith("call_")
        assert all(d.id is None and d.function.name is None for d in rest)
        assert len(rest) > 3  # piece by piece, not the whole call at its end
        arguments = "".join(d.function.arguments for d in [first, *rest])
        assert arguments == call.function.arguments
        check_call(call)


async def test_none_answers_in_text(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=200,
        extra_body={"guided_regex": HERMES_CALL})
    message = result.choices[0].message
    assert message.tool_calls is None and message.content.startswith("<tool_call>")


async def test_tool_results_go_back_through_the_template(client: AsyncOpenAI,
                                                         untemplated_dir: Path) -> None:
    arguments = '{"city": "Oslo", "unit": "C"}'
    messages = [*MESSAGES,
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4 C, snow"}]
    result = await client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                                  max_tokens=2, temperature=0.0)
    tokenizer = load_tokenizer(untemplated_dir)
    template_messages = [*messages[:1], {**messages[1], "tool_calls": [{
        **messages[1]["tool_calls"][0],
        "function": {"name": "get_weather", "arguments": json.loads(arguments)}}]},
        messages[2]]
    prompt = tokenizer.apply_chat_template(template_messages, variables={"tools": TOOLS})
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"' in prompt
    assert "<tool_response>\n4 C, snow\n</tool_response>" in prompt
    assert '"name": "get_time"' in prompt  # the tools are listed
    expected = len(tokenizer.encode(prompt, add_special_tokens=False))
    assert result.usage.prompt_tokens == expected


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     'tool_choice names function "nope", which is not among the tools '
     '(["get_weather","get_time"])', "tool_choice"),
    ({"tool_choice": "required"}, 'tool_choice "required" needs tools', "tool_choice"),
    ({"tools": [{"type": "retrieval"}]},
     'tools[0].type "retrieval" is not supported: only "function" is', "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"description": "x"}}]},
     "tools[0].function.name is required", "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     'tool_choice "required" and response_format both constrain the output: send one',
     "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "objekt"}}}], "tool_choice": "required"},
     'invalid JSON schema in tools: Unsupported type "objekt"', "tools"),
])
async def test_bad_tool_requests_are_exact_400s(client: AsyncOpenAI, body: dict[str, Any],
                                                message: str, param: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            str(client.base_url) + "chat/completions",
            json={"model": MODEL, "messages": MESSAGES, "max_tokens": 2, **body}) as reply:
        assert (reply.status, await reply.json()) == (400, {"error": {
            "message": message, "type": "invalid_request_error", "param": param,
            "code": None}})
