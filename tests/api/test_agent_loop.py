"""The agent loop as OpenAI documents it, with the openai SDK against a live server: a call
with ``tools``, the assistant message sent back exactly as the SDK returned it (content
null beside ``tool_calls``), a ``tool`` message per call with its ``tool_call_id``, and a
second call that the model answers; whole and streamed (the calls assembled from their
deltas, as OpenAI's streaming guide does).

Two templates: the test model's ChatML one, which knows no tools (the generic format
describes them in the system turn and writes calls and results as text), and the default
template, which writes Hermes calls itself. The prompt of each turn is read back through
/tokenize and /detokenize, so what the model saw of its call and the result is checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from openai import AsyncOpenAI

from pagedserve.server.api.protocol.tools import ToolRequest
from pagedserve.server.api.tools.generic import instructions
from pagedserve.server.tokenizer import load_tokenizer
from tests.api.live_server import LiveServer
from tests.live_model import MODEL

WEATHER = {"type": "object", "additionalProperties": False, "required": ["city"],
           "properties": {"city": {"enum": ["Oslo", "Paris", "Lima"]}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                            "parameters": WEATHER}}]


async def prompt_text(server: LiveServer, model_dir: Path, messages: list[Any],
                      **fields: Any) -> str:
    """The prompt the server renders for ``messages``, as text with its special tokens."""
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + "/tokenize",
            json={"messages": [sent(m) for m in messages], **fields}) as reply:
        tokens = (await reply.json())["tokens"]
    return load_tokenizer(model_dir).decode(tokens, skip_special_tokens=False)


async def streamed_message(stream: Any) -> tuple[dict[str, Any], str | None]:
    """The assistant message that a stream's deltas build, and its finish reason."""
    content, calls, reason = "", {}, None
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
            reason = choice.finish_reason or reason
    message = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, reason


async def agent_loop(client: AsyncOpenAI, stream: bool) -> list[Any]:
    """Two turns of the documented loop; returns the conversation, the answer last."""
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris?"}]
    request = {"model": MODEL, "messages": messages, "tools": TOOLS, "temperature": 1.0,
               "seed": 2, "max_tokens": 60, "tool_choice": "required",
               "parallel_tool_calls": False}
    if stream:
        message, reason = await streamed_message(
            await client.chat.completions.create(**request, stream=True))
    else:
        completion = await client.chat.completions.create(**request)
        message, reason = completion.choices[0].message, completion.choices[0].finish_reason
    assert reason == "tool_calls"
    messages.append(message)  # as the SDK returned it
    calls = message["tool_calls"] if stream else message.tool_calls
    for call in calls:
        function = call["function"] if stream else call.function
        arguments = json.loads(function["arguments"] if stream else function.arguments)
        jsonschema.validate(arguments, WEATHER)
        messages.append({"role": "tool", "tool_call_id": call["id"] if stream else call.id,
                         "content": f"18 C in {arguments['city']}"})
    answer = await client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, temperature=0.0, max_tokens=8)
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    messages.append(answer.choices[0].message)
    return messages


def sent(message: Any) -> dict[str, Any]:
    return message if isinstance(message, dict) else message.model_dump(exclude_none=True)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_loop_on_a_template_without_tools(server: LiveServer, client: AsyncOpenAI,
                                                    model_dir: Path, stream: bool) -> None:
    messages = await agent_loop(client, stream)
    (call,) = sent(messages[1])["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    shown = await prompt_text(server, model_dir, messages[:3], tools=TOOLS)
    tools = ToolRequest(TOOLS, "auto", parallel=True)
    assert shown == (
        f"<|im_start|>system\n{instructions(tools)}<|im_end|>\n"
        "<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        + json.dumps({"name": "get_weather", "arguments": arguments})
        + "\n</tool_call><|im_end|>\n"
        f"<|im_start|>tool\n<tool_response>\n18 C in {arguments['city']}\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("stream", [False, True])
async def test_the_loop_on_a_template_with_hermes_calls(tools_server: LiveServer,
                                                        untemplated_dir: Path,
                                                        stream: bool) -> None:
    async with AsyncOpenAI(base_url=tools_server.base_url + "/v1", api_key="unused",
                           max_retries=0) as client:
        messages = await agent_loop(client, stream)
    (call,) = sent(messages[1])["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    shown = await prompt_text(tools_server, untemplated_dir, messages[:3], tools=TOOLS)
    assert ("<|im_start|>assistant\n<tool_call>\n"
            + json.dumps({"name": "get_weather", "arguments": arguments})
            + "\n</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response>\n"
            f"18 C in {arguments['city']}\n</tool_response><|im_end|>\n") in shown
    assert shown.startswith("<|im_start|>system\nYou may call one or more functions.")


@pytest.mark.parametrize(("body", "expected"), [
    ({"tools": TOOLS}, "auto"),
    ({"tools": TOOLS, "parallel_tool_calls": False}, "auto, one call"),
    ({"tools": TOOLS, "tool_choice": "none"}, None),
    ({"tools": TOOLS, "guided_choice": ["plain"]}, "guided_choice"),
])
async def test_auto_holds_a_call_to_the_formats_grammar_once_started(
        server: LiveServer, client: AsyncOpenAI, monkeypatch: pytest.MonkeyPatch,
        body: dict[str, Any], expected: str | None) -> None:
    """The grammar itself is checked in test_tool_formats.py; here, that an ``auto``
    request carries it (a random model rarely writes a trigger), and a constraint the
    request sets itself wins."""
    engine = server.engine.engine
    compiled: list[Any] = []
    compile_grammar = engine.compile_grammar
    monkeypatch.setattr(engine, "compile_grammar",
                        lambda spec: compiled.append(spec) or compile_grammar(spec))
    await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Oslo?"}],
        max_tokens=4, extra_body={k: v for k, v in body.items() if k == "guided_choice"},
        **{k: v for k, v in body.items() if k != "guided_choice"})
    if expected is None:
        assert compiled == []
        return
    (spec,) = compiled
    if expected == "guided_choice":
        assert spec.choice == ("plain",)
        return
    tag = json.loads(spec.structural_tag)["format"]
    assert (tag["type"], tag["triggers"]) == ("triggered_tags", ["<tool_call>"])
    assert tag["stop_after_first"] == (expected == "auto, one call")
    (call,) = tag["tags"]
    assert call["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
    assert call["content"]["json_schema"] == WEATHER and call["end"] == "}\n</tool_call>"
