"""Function tools in ``/v1/responses`` through the openai SDK, on the checkpoint without a
chat template (the default template lists the tools): ``tool_choice`` required and named
return parsed ``function_call`` items (the grammar holds the random model to them), auto
reads a Hermes call next to the text, the stream sends each item's events in OpenAI's order
with argument deltas that add up to the arguments, ``function_call`` and
``function_call_output`` input items go back through the template, and bad tool requests
are exact 400s."""

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
from tests.api.test_tools import HERMES_CALL, SCHEMAS, TOOLS
from tests.live_model import MODEL

# The chat tools in the Responses API's flat shape.
RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
QUESTION = "What is the weather in Oslo?"


@pytest_asyncio.fixture
async def client(tools_server: LiveServer) -> AsyncIterator[AsyncOpenAI]:
    async with AsyncOpenAI(base_url=tools_server.base_url + "/v1", api_key="unused",
                           max_retries=0) as openai_client:
        yield openai_client


def check_call(item: Any) -> None:
    assert item.type == "function_call" and item.status == "completed"
    assert item.call_id.startswith("call_") and item.id.startswith("fc_")
    jsonschema.validate(json.loads(item.arguments), SCHEMAS[item.name])


async def test_required_returns_a_parsed_function_call(client: AsyncOpenAI) -> None:
    result = await client.responses.create(
        model=MODEL, input=QUESTION, tools=RESPONSE_TOOLS, tool_choice="required",
        parallel_tool_calls=False, temperature=1.0, max_output_tokens=250,
        extra_body={"seed": 4})
    assert result.status == "completed"
    (item,) = result.output
    check_call(item)
    assert result.output_text == ""
    assert (result.tool_choice, result.parallel_tool_calls) == ("required", False)
    assert [t.model_dump(exclude_none=True) for t in result.tools] == [
        {**t, "strict": True} for t in RESPONSE_TOOLS]


async def test_a_named_choice_calls_that_function(client: AsyncOpenAI) -> None:
    result = await client.responses.create(
        model=MODEL, input=QUESTION, tools=RESPONSE_TOOLS, temperature=1.0,
        tool_choice={"type": "function", "name": "get_time"}, max_output_tokens=100,
        extra_body={"seed": 6})
    (item,) = result.output
    assert item.name == "get_time"
    check_call(item)
    assert result.tool_choice.name == "get_time"


async def test_auto_reads_the_models_hermes_call_beside_its_text(client: AsyncOpenAI) -> None:
    result = await client.responses.create(
        model=MODEL, input=QUESTION, tools=RESPONSE_TOOLS, max_output_tokens=200,
        temperature=1.0, extra_body={"guided_regex": r"Sure\. " + HERMES_CALL})
    message, item = result.output
    assert (message.type, result.output_text) == ("message", "Sure.")
    assert item.name == "get_weather"
    check_call(item)


def items_of(events: list[Any]) -> dict[int, list[Any]]:
    """Each output item's events, by ``output_index``."""
    items: dict[int, list[Any]] = {}
    for event in events:
        if hasattr(event, "output_index"):
            items.setdefault(event.output_index, []).append(event)
    return items


async def test_streamed_calls_send_their_arguments_as_they_come(client: AsyncOpenAI) -> None:
    request = {"model": MODEL, "input": QUESTION, "tools": RESPONSE_TOOLS,
               "tool_choice": "required", "temperature": 1.0, "max_output_tokens": 250,
               "extra_body": {"seed": 4}}
    whole = await client.responses.create(**request)
    events = [e async for e in await client.responses.create(**request, stream=True)]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    final = events[-1].response
    items = items_of(events)
    assert len(items) == len(final.output) == len(whole.output)
    for index, item_events in items.items():
        added, *deltas, done, item_done = item_events
        assert added.type == "response.output_item.added"
        assert (added.item.arguments, added.item.status) == ("", "in_progress")
        assert {e.type for e in deltas} == {"response.function_call_arguments.delta"}
        assert len(deltas) > 3  # piece by piece, not the whole call at its end
        assert done.type == "response.function_call_arguments.done"
        assert item_done.type == "response.output_item.done"
        item = final.output[index]
        assert "".join(e.delta for e in deltas) == done.arguments == item.arguments
        assert item_done.item == item and added.item.call_id == item.call_id
        assert {e.item_id for e in [*deltas, done]} == {item.id}
        check_call(item)
        assert (item.name, item.arguments) == (whole.output[index].name,
                                               whole.output[index].arguments)


async def test_auto_streams_the_message_then_the_call(client: AsyncOpenAI) -> None:
    events = [e async for e in await client.responses.create(
        model=MODEL, input=QUESTION, tools=RESPONSE_TOOLS, max_output_tokens=200,
        temperature=1.0, stream=True, extra_body={"guided_regex": r"Sure\. " + HERMES_CALL})]
    message, call = items_of(events).values()
    assert [e.type for e in message] == [
        "response.output_item.added", "response.content_part.added",
        *["response.output_text.delta"] * (len(message) - 5), "response.output_text.done",
        "response.content_part.done", "response.output_item.done"]
    assert message[-1].item.content[0].text == "Sure. "
    # A Hermes call comes whole once its closing tag arrives.
    assert [e.type for e in call] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done"]
    check_call(call[-1].item)
    assert [i.type for i in events[-1].response.output] == ["message", "function_call"]


async def test_calls_and_their_outputs_go_back_through_the_template(
        client: AsyncOpenAI, untemplated_dir: Path) -> None:
    arguments = '{"city": "Oslo", "unit": "C"}'
    result = await client.responses.create(
        model=MODEL, tools=RESPONSE_TOOLS, max_output_tokens=2, temperature=0.0, input=[
            {"role": "user", "content": QUESTION},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather",
             "arguments": arguments},
            {"type": "function_call_output", "call_id": "call_1", "output": "4 C, snow"}])
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": json.loads(arguments)}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "4 C, snow"}]
    tokenizer = load_tokenizer(untemplated_dir)
    prompt = tokenizer.apply_chat_template(messages, variables={"tools": TOOLS})
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"' in prompt
    assert "<tool_response>\n4 C, snow\n</tool_response>" in prompt
    assert result.usage.input_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))


async def test_text_and_calls_of_one_turn_form_one_assistant_message(
        client: AsyncOpenAI, untemplated_dir: Path) -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "get_time",
            "arguments": '{"zone": 1}'}
    result = await client.responses.create(
        model=MODEL, tools=RESPONSE_TOOLS, max_output_tokens=1, input=[
            {"role": "user", "content": "Time?"},
            {"role": "assistant", "content": "Let me look."}, call,
            {**call, "call_id": "call_2"}])
    messages = [{"role": "user", "content": "Time?"},
                {"role": "assistant", "content": "Let me look.", "tool_calls": [
                    {"id": f"call_{k}", "type": "function",
                     "function": {"name": "get_time", "arguments": {"zone": 1}}}
                    for k in (1, 2)]}]
    tokenizer = load_tokenizer(untemplated_dir)
    prompt = tokenizer.apply_chat_template(messages, variables={"tools": TOOLS})
    assert prompt.count('{"name": "get_time", "arguments": {"zone": 1}}') == 2
    assert prompt.count("Let me look.") == 1
    assert result.usage.input_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"tools": RESPONSE_TOOLS, "tool_choice": {"type": "function", "name": "nope"}},
     'tool_choice names function "nope", which is not among the tools '
     '(["get_weather","get_time"])', "tool_choice"),
    ({"tools": RESPONSE_TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto"}},
     'tool_choice.type must be "function", got "allowed_tools": this server has function '
     'tools only', "tool_choice.type"),
    ({"tool_choice": "required"}, 'tool_choice "required" needs tools', "tool_choice"),
    ({"tools": [{"type": "function", "description": "x"}]}, "tools[0].name is required",
     "tools[0].name"),
    ({"tools": [{"type": "function", "name": "f", "parameters": []}]},
     "tools[0].parameters must be a JSON schema object, got []", "tools[0].parameters"),
    ({"tools": RESPONSE_TOOLS, "tool_choice": "required",
      "text": {"format": {"type": "json_object"}}},
     'tool_choice "required" and text.format both constrain the output: send one',
     "tool_choice"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[0].call_id is required", "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]},
     "input[0].output must be a string or a list of text parts, got 3", "input[0].output"),
])
async def test_bad_tool_requests_are_exact_400s(client: AsyncOpenAI, body: dict[str, Any],
                                                message: str, param: str) -> None:
    async with aiohttp.ClientSession() as session, session.post(
            str(client.base_url) + "responses",
            json={"model": MODEL, "input": QUESTION, "max_output_tokens": 2, **body}) as reply:
        assert (reply.status, await reply.json()) == (400, {"error": {
            "message": message, "type": "invalid_request_error", "param": param,
            "code": None}})
