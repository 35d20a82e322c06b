"""Every id below the model's vocabulary size is a token, even one the tokenizer has no text
for: the embedded model's cl100k vocabulary leaves 100256 and 100261-100275 unassigned within
its 100,277 rows, and a checkpoint may pad its embedding past its tokenizer. Such ids can be
sampled, biased, allowed, sent in prompts and reported in logprobs; they read as "" (as
transformers decodes them), and the engine stays healthy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from pagedserve.client.api.sse import iter_sse
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config
from tests.checkpoints import make_checkpoint
from tests.tokenizer_files import write_hf_tokenizer

UNASSIGNED = [100256, *range(100261, 100276)]
TINY_VOCAB = 100277
HELLO, WORLD = 9906, 1917  # cl100k: "Hello", " world"


@pytest.fixture(scope="module")
def tiny_server() -> Iterator[LiveServer]:
    live = LiveServer(server_config("tiny", engine={"max_model_len": 256})).start()
    yield live
    live.stop()


async def post(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            server.base_url + path, json={"model": MODEL, **body}) as response:
        return response.status, await response.json()


def invalid(message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param,
                      "code": None}}


async def test_sampling_at_temperature_one_crosses_unassigned_ids(
        tiny_server: LiveServer) -> None:
    # On random weights each of the 100,277 ids is about equally likely, so an unassigned one
    # comes up once in ~6,000 tokens; a moderate bias makes it once in a few, while every
    # other token stays possible.
    body = {"prompt": "hello", "max_tokens": 24, "n": 2, "temperature": 1.0, "seed": 3,
            "ignore_eos": True, "logprobs": 0,
            "logit_bias": {str(t): 7.0 for t in UNASSIGNED}}
    status, result = await post(tiny_server, "/v1/completions", body)
    assert status == 200
    assert result["usage"]["completion_tokens"] == 48
    for choice in result["choices"]:
        assert choice["finish_reason"] == "length"
        tokens = choice["logprobs"]["tokens"]
        assert len(tokens) == 24
        assert 0 < tokens.count("") < 24  # unassigned ids among ordinary tokens

    async with aiohttp.ClientSession() as session, session.post(
            tiny_server.base_url + "/v1/completions",
            json={"model": MODEL, **body, "n": 1, "stream": True}) as response:
        events = [event async for event in iter_sse(response.content)]
    assert events[-1].is_done
    chunks = [event.json() for event in events[:-1]]
    assert all("error" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == 24
    assert tiny_server.engine.is_healthy


async def test_logit_bias_forces_one_in_an_echoed_prompt_of_them(
        tiny_server: LiveServer) -> None:
    body = {"prompt": [HELLO, 100256, WORLD], "max_tokens": 3, "echo": True, "logprobs": 1,
            "logit_bias": {"100261": 100}}
    status, result = await post(tiny_server, "/v1/completions", body)
    assert status == 200
    (choice,) = result["choices"]
    assert choice["text"] == "Hello world"
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == ["Hello", "", " world", "", "", ""]
    assert logprobs["text_offset"] == [0, 5, 5, 11, 11, 11]
    assert logprobs["token_logprobs"][0] is None
    # Logprobs are the model's own (before the bias), as vLLM reports them by default.
    assert all(isinstance(lp, float) for lp in logprobs["token_logprobs"][1:])
    assert all(top.get("") is not None for top in logprobs["top_logprobs"][3:])
    assert choice["finish_reason"] == "length"


async def test_allowed_token_ids_in_chat_logprobs(tiny_server: LiveServer) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "allowed_token_ids": [100256], "logprobs": True, "top_logprobs": 1}
    status, result = await post(tiny_server, "/v1/chat/completions", body)
    assert status == 200
    (choice,) = result["choices"]
    assert choice["message"]["content"] == ""
    content = choice["logprobs"]["content"]
    assert [(c["token"], c["bytes"]) for c in content] == [("", [])] * 3
    assert [len(c["top_logprobs"]) for c in content] == [1, 1, 1]


async def test_a_stop_string_matches_across_unassigned_ids(tiny_server: LiveServer) -> None:
    # Only "Hello" and an unassigned id can be sampled: the text grows by "Hello" now and
    # then, and "HelloHello" completes however many empty tokens come between the two.
    body = {"prompt": "x", "max_tokens": 64, "temperature": 1.0, "seed": 0,
            "allowed_token_ids": [HELLO, 100256], "stop": ["HelloHello"]}
    status, result = await post(tiny_server, "/v1/completions", body)
    assert status == 200
    (choice,) = result["choices"]
    assert (choice["finish_reason"], choice["stop_reason"], choice["text"]) == (
        "stop", "HelloHello", "")
    assert result["usage"]["completion_tokens"] >= 2


async def test_ids_at_the_vocabulary_size_are_rejected(tiny_server: LiveServer) -> None:
    assert await post(tiny_server, "/detokenize", {"tokens": [HELLO, 100256, WORLD]}) == (
        200, {"prompt": "Hello world"})
    assert await post(tiny_server, "/detokenize", {"tokens": [TINY_VOCAB]}) == (400, invalid(
        f"token id {TINY_VOCAB} is out of range for a vocabulary of {TINY_VOCAB}", "tokens"))
    assert await post(tiny_server, "/v1/completions",
                      {"prompt": [HELLO, TINY_VOCAB], "max_tokens": 1}) == (400, invalid(
        f"prompt token id {TINY_VOCAB} is out of range for a vocabulary of {TINY_VOCAB}",
        "prompt"))
    assert await post(tiny_server, "/v1/completions",
                      {"prompt": "x", "max_tokens": 1,
                       "logit_bias": {str(TINY_VOCAB): 1}}) == (400, invalid(
        f"logit_bias must hold token ids in [0, {TINY_VOCAB}), got {TINY_VOCAB}",
        "logit_bias"))


@pytest.fixture(scope="module")
def padded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # An embedding padded to 400 rows over a 384-token tokenizer, as Qwen2 and OPT pad theirs.
    path = make_checkpoint(tmp_path_factory.mktemp("padded"), "llama", vocab_size=400)
    write_hf_tokenizer(path, 384)
    live = LiveServer(server_config(str(path))).start()
    yield live
    live.stop()


async def test_a_tokenizer_smaller_than_the_embedding(padded_server: LiveServer) -> None:
    body = {"prompt": [5, 390, 6], "max_tokens": 4, "allowed_token_ids": [390, 399],
            "logprobs": 1, "echo": True}
    status, result = await post(padded_server, "/v1/completions", body)
    assert status == 200
    (choice,) = result["choices"]
    tokens = choice["logprobs"]["tokens"]
    assert tokens[1] == "" and tokens[3:] == ["", "", "", ""]
    assert choice["text"] == padded_server.engine.tokenizer.decode([5, 6])
    assert await post(padded_server, "/detokenize", {"tokens": [400]}) == (400, invalid(
        "token id 400 is out of range for a vocabulary of 400", "tokens"))
    assert padded_server.engine.is_healthy
