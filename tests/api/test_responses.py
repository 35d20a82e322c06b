"""``/v1/responses`` through the official openai SDK: the text equals the offline engine's on
the chat-templated conversation, ``instructions`` lead as a system message, a length stop
is ``incomplete``, the stream's typed events come in OpenAI's order with deltas that add up
to the text, and what needs stored state, built-in tools or other modalities is an exact
400 (function tools: test_responses_tools)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from pagedserve.server import LLM, SamplingParams
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer


@pytest.fixture(scope="module")
def offline(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), num_kv_blocks=64)


def expected(offline: LLM, messages: list[dict[str, Any]], max_tokens: int):
    tokenizer = offline.get_tokenizer()
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    return ids, offline.generate([{"prompt_token_ids": ids}], params)[0].outputs[0]


async def test_text_matches_the_offline_engine(client: AsyncOpenAI, offline: LLM) -> None:
    messages = [{"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Name a cache."}]
    ids, want = expected(offline, messages, 6)
    result = await client.responses.create(model=MODEL, instructions="Be terse.",
                                           input="Name a cache.", max_output_tokens=6,
                                           temperature=0)
    assert result.output_text == want.text
    assert (result.object, result.model, result.instructions) == ("response", MODEL,
                                                                   "Be terse.")
    assert result.id.startswith("resp_")
    (message,) = result.output
    assert (message.type, message.role) == ("message", "assistant")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (len(ids),
                                                                       len(want.token_ids))
    assert result.usage.total_tokens == len(ids) + len(want.token_ids)
    # Stopped by max_output_tokens (the random model rarely says its end token).
    if want.finish_reason == "length":
        assert result.status == "incomplete"
        assert result.incomplete_details.reason == "max_output_tokens"
    else:
        assert result.status == "completed" and result.incomplete_details is None


async def test_message_list_input(client: AsyncOpenAI, offline: LLM) -> None:
    conversation = [{"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "Hello"},
                    {"role": "user", "content": "Name a cache."}]
    _, want = expected(offline, conversation, 5)
    result = await client.responses.create(model=MODEL, max_output_tokens=5, temperature=0,
                                           input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "user", "content": "Name a cache."},
    ])
    assert result.output_text == want.text


async def test_stream_events_in_openai_order(client: AsyncOpenAI, offline: LLM) -> None:
    _, want = expected(offline, [{"role": "user", "content": "Name a cache."}], 6)
    stream = await client.responses.create(model=MODEL, input="Name a cache.",
                                           max_output_tokens=6, temperature=0, stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", *["response.output_text.delta"] * len(deltas),
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.incomplete" if want.finish_reason == "length" else "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(d.delta for d in deltas) == want.text == events[-4].text
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert events[-1].response.output_text == want.text
    assert events[-1].response.usage.output_tokens == len(want.token_ids)


async def post(server: LiveServer, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/v1/responses", json={"model": MODEL, **body}
    ) as response:
        return response.status, await response.json()


@pytest.mark.parametrize(("body", "message", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"},
     "previous_response_id is not supported by this server", "previous_response_id"),
    ({"input": "x", "tools": [{"type": "web_search"}]},
     'tools[0].type "web_search" is not supported: only "function" is', "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
     "input[0].content[0] must be an input_text or output_text part, got \"input_image\": "
     "this server takes text only", "input[0].content[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]},
     "input[0].type \"reasoning\" is not supported by this server: only messages, "
     "function_call and function_call_output are", "input[0]"),
    ({"input": "x", "text": {"format": {"type": "grammar"}}},
     "text.format.type \"grammar\" is not supported: use \"text\", \"json_object\" or "
     "\"json_schema\"", "text.format.type"),
    ({"input": "x", "n": 2},
     "n is not supported by the Responses API (it has one output); use /v1/chat/completions",
     "n"),
    ({"input": []}, "input must be a string or a non-empty list of messages, got []", "input"),
    ({}, "input is required", "input"),
])
async def test_refusals(server: LiveServer, body: dict[str, Any], message: str,
                        param: str) -> None:
    assert await post(server, body) == (400, {"error": {
        "message": message, "type": "invalid_request_error", "param": param, "code": None}})


async def test_sdk_stream_helper_gets_the_final_response(client: AsyncOpenAI,
                                                         offline: LLM) -> None:
    # A stop string ends the text, so the response completes (a length stop is incomplete,
    # for which the SDK's helper, as against OpenAI, has no final response).
    tokenizer = offline.get_tokenizer()
    messages = [{"role": "user", "content": "Name a cache."}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    want = offline.generate([{"prompt_token_ids": ids}], SamplingParams(
        temperature=0, max_tokens=60, stop=["e"]))[0].outputs[0]
    assert want.finish_reason == "stop"
    async with client.responses.stream(model=MODEL, input="Name a cache.",
                                       max_output_tokens=60, temperature=0,
                                       extra_body={"stop": ["e"]}) as stream:
        final = await stream.get_final_response()
    assert (final.status, final.output_text) == ("completed", want.text)
