"""vLLM's extra request fields, so that a vLLM client's body runs unchanged: ``bad_words``,
``add_special_tokens``, ``truncate_prompt_tokens``, ``priority``,
``spaces_between_special_tokens``, ``return_tokens_as_token_ids``, ``request_id`` (and
``X-Request-Id``), and for chat
``chat_template_kwargs`` and ``documents``;
each against the offline engine or the tokenizer, and each misuse as an exact 400."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from pagedserve.server import LLM, SamplingParams
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

PROMPT = "The paged KV cache"
MESSAGES = [{"role": "user", "content": "Name a cache."}]


@pytest.fixture(scope="module")
def offline(model_dir: Path) -> LLM:
    return LLM(model=str(model_dir), num_kv_blocks=64)


def greedy(offline: LLM, prompt_ids: list[int], **params: Any) -> str:
    params = SamplingParams(temperature=0, max_tokens=6, **params)
    return offline.generate([{"prompt_token_ids": prompt_ids}], params)[0].outputs[0].text


async def post(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + path, json={"model": MODEL, **body}
    ) as response:
        return response.status, await response.json()


def error(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


async def test_bad_words_reach_the_engine(client: AsyncOpenAI, offline: LLM) -> None:
    tokenizer = offline.get_tokenizer()
    ids = tokenizer.encode(PROMPT)
    plain = greedy(offline, ids)
    # The random model's greedy text is mostly partial characters: ban its first letter.
    word = next(char for char in plain if char.isalnum())
    banned = greedy(offline, ids, bad_words=[word])
    assert word not in banned and banned != plain
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6,
                                             temperature=0, extra_body={"bad_words": [word]})
    assert result.choices[0].text == banned


async def test_add_special_tokens(client: AsyncOpenAI, offline: LLM) -> None:
    tokenizer = offline.get_tokenizer()
    with_bos, without = tokenizer.encode(PROMPT), tokenizer.encode(PROMPT,
                                                                   add_special_tokens=False)
    assert len(with_bos) == len(without) + 1
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6,
                                             temperature=0,
                                             extra_body={"add_special_tokens": False})
    assert (result.usage.prompt_tokens, result.choices[0].text) == (
        len(without), greedy(offline, without))
    # Chat's template writes its own framing, so chat adds nothing unless asked.
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES),
                                add_special_tokens=False)
    for add, expected in ((False, chat_ids), (True, [tokenizer.bos_token_id, *chat_ids])):
        chat = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
            extra_body={"add_special_tokens": add})
        assert (chat.usage.prompt_tokens, chat.choices[0].message.content) == (
            len(expected), greedy(offline, expected))


async def test_truncate_prompt_tokens_keeps_the_last_tokens(client: AsyncOpenAI,
                                                            offline: LLM) -> None:
    tokenizer = offline.get_tokenizer()
    ids = tokenizer.encode(PROMPT)
    tail = tokenizer.decode(ids[-3:])
    for prompt in (PROMPT, ids):  # text, and token ids
        result = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=6, temperature=0, echo=True,
            extra_body={"truncate_prompt_tokens": 3})
        assert result.choices[0].text == tail + greedy(offline, ids[-3:])
        assert result.usage.prompt_tokens == 3
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(MESSAGES),
                                add_special_tokens=False)
    chat = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
        extra_body={"truncate_prompt_tokens": 4})
    assert (chat.usage.prompt_tokens, chat.choices[0].message.content) == (
        4, greedy(offline, chat_ids[-4:]))
    # -1 keeps up to max_model_len (1,024 here): the whole short prompt.
    whole = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6,
                                            temperature=0,
                                            extra_body={"truncate_prompt_tokens": -1})
    assert whole.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize(("body", "expected"), [
    ({"truncate_prompt_tokens": 0},
     error("truncate_prompt_tokens must be -1 (the model's max_model_len) or at least 1, got 0",
           "truncate_prompt_tokens")),
    ({"truncate_prompt_tokens": 1025},
     error("truncate_prompt_tokens must be at most the model's max_model_len (1024), got 1025",
           "truncate_prompt_tokens")),
    ({"priority": 1},
     error("priority 1 needs priority scheduling, which this server does not run (requests "
           "are served first come, first served); send priority 0 or leave it out",
           "priority")),
    ({"bad_words": [3]}, None),
])
async def test_field_errors(server: LiveServer, body: dict[str, Any],
                            expected: dict[str, Any] | None) -> None:
    status, answer = await post(server, "/v1/completions",
                                {"prompt": PROMPT, "max_tokens": 2, **body})
    assert status == 400
    if expected is not None:
        assert answer == expected
    else:
        assert answer["error"]["param"] == "bad_words"


async def test_accepted_as_in_vllm(server: LiveServer) -> None:
    body = {"prompt": PROMPT, "max_tokens": 2, "priority": 0,
            "spaces_between_special_tokens": False}
    assert (await post(server, "/v1/completions", body))[0] == 200


async def test_chat_template_variables(server: LiveServer) -> None:
    # The test model's ChatML template reads no extra names: they change nothing, as with
    # transformers; the renderer's use of them is tested with the chat templates.
    plain = await post(server, "/tokenize", {"messages": MESSAGES})
    extra = await post(server, "/tokenize", {
        "messages": MESSAGES, "chat_template_kwargs": {"enable_thinking": False},
        "documents": [{"title": "t", "text": "d"}]})
    assert plain == extra and plain[0] == 200
    status, answer = await post(server, "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 2, "chat_template_kwargs": {"messages": []}})
    assert (status, answer) == (400, error(
        "chat_template_kwargs cannot set 'messages': it is a field of the request",
        "chat_template_kwargs"))
    status, answer = await post(server, "/v1/chat/completions", {
        "messages": MESSAGES, "max_tokens": 2, "documents": ["text"]})
    assert status == 400 and answer["error"]["param"] == "documents"


async def test_return_tokens_as_token_ids(client: AsyncOpenAI, offline: LLM,
                                          server: LiveServer) -> None:
    ids = offline.get_tokenizer().encode(PROMPT)
    want = offline.generate([{"prompt_token_ids": ids}], SamplingParams(
        temperature=0, max_tokens=5, logprobs=2, ignore_eos=True))[0].outputs[0]

    def name(token_id: int) -> str:
        return f"token_id:{token_id}"

    def top(position: dict) -> dict[str, float]:
        return {name(t): pytest.approx(lp.logprob) for t, lp in position.items()}

    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    result = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5,
                                             temperature=0, logprobs=2, extra_body=extra)
    logprobs = result.choices[0].logprobs
    assert logprobs.tokens == [name(t) for t in want.token_ids]
    # Keyed by id, no two tokens collapse into one key (the model's partial characters
    # would, by text).
    assert logprobs.top_logprobs == [top(p) for p in want.logprobs]
    chat = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0, logprobs=True,
        top_logprobs=1, extra_body=extra)
    for entry in chat.choices[0].logprobs.content:
        assert entry.token.startswith("token_id:") and entry.bytes == list(entry.token.encode())
        assert [t.token for t in entry.top_logprobs] == [entry.token]  # greedy: the top one
    status, body = await post(server, "/v1/completions", {
        "prompt": PROMPT, "max_tokens": 1, "prompt_logprobs": 0, **extra})
    assert status == 200
    positions = body["choices"][0]["prompt_logprobs"][1:]
    assert [p[str(t)]["decoded_token"] for p, t in zip(positions, ids[1:], strict=True)] == [
        name(t) for t in ids[1:]]


async def test_request_id_names_the_response(client: AsyncOpenAI, server: LiveServer) -> None:
    # vLLM's: the body's request_id, or the X-Request-Id header (which wins), prefixed as
    # each endpoint prefixes its ids; two requests naming one id both run.
    first, second = await asyncio.gather(*(
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3,
                                  extra_body={"request_id": "job-7"}) for _ in range(2)))
    assert first.id == second.id == "cmpl-job-7"
    chat = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=2, extra_body={"request_id": "body"},
        extra_headers={"X-Request-Id": "trace-1"})
    assert chat.id == "chatcmpl-trace-1"
    response = await client.responses.create(model=MODEL, input="hi", max_output_tokens=2,
                                             extra_body={"request_id": "r1"})
    assert response.id == "resp_r1"
    fresh = await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2)
    assert fresh.id.startswith("cmpl-") and fresh.id != first.id
