"""``/v1/chat/completions`` through the official openai SDK: the model's chat template, the
role on the first token's chunk, chat-shaped logprobs, usage equal to the tokenizer's counts."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from pagedserve.server import LLM, SamplingParams
from pagedserve.server.engine.core.outputs import RequestOutput
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a cache."},
]


@pytest.fixture(scope="module")
def offline(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), num_kv_blocks=64)


def chat_prompt_ids(offline: LLM) -> list[int]:
    """What the server must feed the engine: the checkpoint's ChatML template, rendered."""
    tokenizer = offline.get_tokenizer()
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    return tokenizer.encode(text, add_special_tokens=False)


def reference(offline: LLM, **params: object) -> RequestOutput:
    return offline.generate([{"prompt_token_ids": chat_prompt_ids(offline)}],
                            SamplingParams(**params))[0]


async def test_greedy_chat_matches_offline_engine(client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, temperature=0, max_tokens=8)
    result = await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                  max_completion_tokens=8, temperature=0)
    (choice,) = result.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == expected.outputs[0].text
    assert choice.finish_reason == expected.outputs[0].finish_reason
    assert (result.object, result.model) == ("chat.completion", MODEL)
    assert result.id.startswith("chatcmpl-")
    assert result.usage.prompt_tokens == len(chat_prompt_ids(offline))
    assert result.usage.completion_tokens == len(expected.outputs[0].token_ids)


async def test_tokenize_messages_counts_what_chat_sends(server: LiveServer,
                                                        offline: LLM) -> None:
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/tokenize", json={"model": MODEL, "messages": MESSAGES}
    ) as response:
        body = await response.json()
    ids = chat_prompt_ids(offline)
    assert body == {"count": len(ids), "tokens": ids, "max_model_len": 1024}


async def test_stream_sends_the_role_with_the_first_token(client: AsyncOpenAI,
                                                         offline: LLM) -> None:
    expected = reference(offline, temperature=0, max_tokens=5, ignore_eos=True, logprobs=0)
    want = expected.outputs[0]
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=5, temperature=0, stream=True,
        logprobs=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    *token_chunks, usage_chunk = chunks
    # Every chunk with choices carries exactly one generated token: none goes out before
    # the engine has produced one, so the first such chunk is a client's true first token.
    assert len(token_chunks) == 5
    assert all(c.object == "chat.completion.chunk" for c in token_chunks)
    tokenizer = offline.get_tokenizer()
    for chunk, token_id in zip(token_chunks, want.token_ids, strict=True):
        (entry,) = chunk.choices[0].logprobs.content
        assert bytes(entry.bytes) == tokenizer.token_bytes(token_id)
    first = token_chunks[0].choices[0]
    assert first.delta.role == "assistant"
    # Its text may be "" (a token ending mid-character), but it carries the token.
    assert first.delta.content is not None
    assert all(c.choices[0].delta.role is None for c in token_chunks[1:])
    content = "".join(c.choices[0].delta.content or "" for c in token_chunks)
    assert content == want.text
    assert [c.choices[0].finish_reason for c in token_chunks] == [None] * 4 + ["length"]
    assert usage_chunk.choices == []
    assert usage_chunk.usage.completion_tokens == 5
    assert usage_chunk.usage.prompt_tokens == len(expected.prompt_token_ids)


async def test_parallel_samples_each_get_the_role_on_their_first_token(
        client: AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, n=2, temperature=1.0, seed=5,
        stream=True, logprobs=True, extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    assert len(chunks) == 6  # one chunk per token per choice, nothing else
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert [c.delta.role for c in mine] == ["assistant", None, None]
        assert all(len(c.logprobs.content) == 1 for c in mine)
        assert [c.finish_reason for c in mine] == [None, None, "length"]


async def test_logprobs_in_chat_shape(client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, temperature=0, max_tokens=4, logprobs=3, ignore_eos=True)
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
        top_logprobs=3, extra_body={"ignore_eos": True},
    )
    content = result.choices[0].logprobs.content
    tokenizer = offline.get_tokenizer()
    want = expected.outputs[0]
    assert len(content) == 4
    for entry, token_id, position in zip(content, want.token_ids, want.logprobs, strict=True):
        assert bytes(entry.bytes) == tokenizer.token_bytes(token_id)
        assert entry.logprob == pytest.approx(position[token_id].logprob)
        assert len(entry.top_logprobs) == 3
        top = [t.logprob for t in entry.top_logprobs]
        assert top == sorted(top, reverse=True)
        assert entry.top_logprobs[0].bytes == entry.bytes  # greedy picks the top token


async def test_no_logprobs_unless_asked(client: AsyncOpenAI) -> None:
    result = await client.chat.completions.create(model=MODEL, messages=MESSAGES,
                                                  max_tokens=2, temperature=0)
    assert result.choices[0].logprobs is None


async def test_prompt_logprobs_come_once_per_response_as_vllm_sends_them(
        client: AsyncOpenAI, offline: LLM) -> None:
    expected = reference(offline, temperature=0, max_tokens=1, prompt_logprobs=1)
    result = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_completion_tokens=1, temperature=0,
        extra_body={"prompt_logprobs": 1})
    served = result.model_extra["prompt_logprobs"]
    assert served[0] is None and len(served) == len(chat_prompt_ids(offline))
    for position, reference_position in zip(served[1:], expected.prompt_logprobs[1:],
                                            strict=True):
        assert set(position) == {str(t) for t in reference_position}
        for token_id, logprob in reference_position.items():
            assert position[str(token_id)]["logprob"] == pytest.approx(logprob.logprob,
                                                                       abs=1e-4)
            assert position[str(token_id)]["rank"] == logprob.rank


async def test_prompt_logprobs_in_a_chat_stream_are_a_400(server: LiveServer) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "stream": True, "prompt_logprobs": 1}
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/v1/chat/completions", json=body
    ) as response:
        assert (response.status, await response.json()) == (400, {"error": {
            "message": "prompt_logprobs is not available when stream is true",
            "type": "invalid_request_error", "param": "prompt_logprobs", "code": None}})


PREFILLED = [*MESSAGES, {"role": "assistant", "content": "An LRU"}]


async def test_continue_final_message_continues_the_reply(client: AsyncOpenAI, server: LiveServer,
                                                          offline: LLM) -> None:
    # vLLM's extension: the prompt ends inside the prefilled reply, with no end of turn.
    tokenizer = offline.get_tokenizer()
    text = tokenizer.apply_chat_template(PREFILLED, add_generation_prompt=False,
                                         continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\nAn LRU")
    ids = tokenizer.encode(text, add_special_tokens=False)
    expected = offline.generate([{"prompt_token_ids": ids}],
                                SamplingParams(temperature=0, max_tokens=6))[0].outputs[0]
    framing = {"add_generation_prompt": False, "continue_final_message": True}
    result = await client.chat.completions.create(model=MODEL, messages=PREFILLED,
                                                  max_tokens=6, temperature=0,
                                                  extra_body=framing)
    assert result.choices[0].message.content == expected.text
    assert result.usage.prompt_tokens == len(ids)
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/tokenize", json={"model": MODEL, "messages": PREFILLED, **framing}
    ) as response:
        assert (await response.json())["tokens"] == ids


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/tokenize"])
async def test_continue_final_message_with_a_generation_prompt_is_a_400(
        server: LiveServer, path: str) -> None:
    body = {"model": MODEL, "messages": PREFILLED, "continue_final_message": True}
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + path, json=body
    ) as response:
        assert (response.status, await response.json()) == (400, {"error": {
            "message": "continue_final_message and add_generation_prompt cannot both be "
                       "true: set add_generation_prompt to false to continue the last message",
            "type": "invalid_request_error", "param": "continue_final_message", "code": None}})


async def test_echo_starts_the_reply_with_the_continued_message(client: AsyncOpenAI,
                                                               offline: LLM) -> None:
    tokenizer = offline.get_tokenizer()
    text = tokenizer.apply_chat_template(PREFILLED, add_generation_prompt=False,
                                         continue_final_message=True)
    ids = tokenizer.encode(text, add_special_tokens=False)
    want = offline.generate([{"prompt_token_ids": ids}],
                            SamplingParams(temperature=0, max_tokens=4))[0].outputs[0]
    extra = {"add_generation_prompt": False, "continue_final_message": True, "echo": True}
    result = await client.chat.completions.create(model=MODEL, messages=PREFILLED,
                                                  max_tokens=4, temperature=0,
                                                  extra_body=extra)
    assert result.choices[0].message.content == "An LRU" + want.text
    assert result.usage.completion_tokens == len(want.token_ids)
    stream = await client.chat.completions.create(model=MODEL, messages=PREFILLED,
                                                  max_tokens=4, temperature=0, stream=True,
                                                  extra_body=extra)
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert pieces[0].startswith("An LRU") and "".join(pieces) == "An LRU" + want.text
    # The last message is the user's: nothing to echo.
    plain = await client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4,
                                                 temperature=0, extra_body={"echo": True})
    assert plain.choices[0].message.content == reference(
        offline, temperature=0, max_tokens=4).outputs[0].text
