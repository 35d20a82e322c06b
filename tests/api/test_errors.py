"""The error table, over raw HTTP: each misuse gets its status and exactly OpenAI's error
body; the SDK raises its matching exception; nothing bad stops the engine."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import orjson
import pytest
from openai import AsyncOpenAI

from pagedserve.common.load_hints import LoadHints
from tests.api.conftest import MAX_BODY_BYTES, MODEL
from tests.api.live_server import LiveServer


def error(message: str, param: str | None = None, code: str | None = None,
          type: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "hello", "max_tokens": 2, **fields}


def json_error_of(raw: bytes) -> str:
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"The request body is not valid JSON: {exc}"
    raise AssertionError("the body parsed")


CASES = [
    pytest.param("POST", "/v1/completions", b'{"model": ', 400,
                 error(json_error_of(b'{"model": ')), id="invalid-json"),
    pytest.param("POST", "/v1/completions", [1, 2], 400,
                 error("the request body must be a JSON object, got [1,2]"), id="not-an-object"),
    pytest.param("POST", "/v1/completions", completion(max_tokens="2"), 400,
                 error('max_tokens must be an integer, got "2"', "max_tokens"), id="wrong-type"),
    pytest.param("POST", "/v1/completions", completion(temperature=-0.5), 400,
                 error("temperature must be non-negative, got -0.5", "temperature"),
                 id="temperature-range"),
    pytest.param("POST", "/v1/completions", completion(top_p=1.5), 400,
                 error("top_p must be in (0, 1], got 1.5", "top_p"), id="top-p-range"),
    pytest.param("POST", "/v1/completions", completion(n=0), 400,
                 error("n must be at least 1, got 0", "n"), id="n-range"),
    pytest.param("POST", "/v1/completions", completion(logprobs=21), 400,
                 error("logprobs must be in [0, 20], got 21", "logprobs"), id="logprobs-range"),
    pytest.param("POST", "/v1/completions", completion(logit_bias={"5000": 1}), 400,
                 error("logit_bias must hold token ids in [0, 384), got 5000", "logit_bias"),
                 id="logit-bias-vocab"),
    pytest.param("POST", "/v1/completions", completion(prompt=[[3, 999]]), 400,
                 error("prompt token id 999 is out of range for a vocabulary of 384", "prompt"),
                 id="prompt-id-vocab"),
    pytest.param("POST", "/v1/completions", completion(prompt=[5] * 1000, max_tokens=100), 400,
                 error("This model's maximum context length is 1024 tokens. However, you "
                       "requested 1100 tokens (1000 in the prompt, 100 for the completion). "
                       "Please reduce the prompt or max_tokens.", "max_tokens"),
                 id="over-max-model-len"),
    pytest.param("POST", "/v1/completions", {"model": MODEL, "prompt": [5] * 1024}, 400,
                 error("This model's maximum context length is 1024 tokens. However, the "
                       "prompt has 1024 tokens, which leaves no room for a completion. "
                       "Please reduce the prompt.", "prompt"),
                 id="prompt-fills-max-model-len"),
    pytest.param("POST", "/v1/completions", completion(suffix="!"), 400,
                 error("suffix is not supported by this server", "suffix"), id="suffix"),
    pytest.param("POST", "/v1/completions", completion(stream=True, use_beam_search=True), 400,
                 error("use_beam_search cannot be combined with stream", "stream"),
                 id="stream-beam"),
    pytest.param("POST", "/v1/completions", completion(model="gpt-4"), 404,
                 error("The model `gpt-4` does not exist.", "model", "model_not_found"),
                 id="unknown-model"),
    pytest.param("POST", "/v1/chat/completions",
                 {"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400,
                 error("messages[0].role must be one of assistant, developer, system, tool, "
                       "user, got 'robot'", "messages"), id="chat-role"),
    pytest.param("POST", "/v1/chat/completions",
                 {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                  "tools": [{"type": "function"}]}, 400,
                 error("tools[0].function is required", "tools[0].function"),
                 id="chat-tools"),
    pytest.param("POST", "/detokenize", {"model": MODEL, "tokens": [1, 5000]}, 400,
                 error("token id 5000 is out of range for a vocabulary of 384", "tokens"),
                 id="detokenize-vocab"),
    pytest.param("GET", "/v1/nothing", None, 404,
                 error("Invalid URL (GET /v1/nothing)", code="unknown_url"), id="unknown-route"),
    pytest.param("GET", "/v1/completions", None, 405,
                 error("Method GET is not allowed for /v1/completions",
                       code="method_not_allowed"), id="wrong-method"),
    pytest.param("GET", "/v1/models/gpt-4", None, 404,
                 error("The model `gpt-4` does not exist.", "model", "model_not_found"),
                 id="retrieve-unknown-model"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "expected"), CASES)
async def test_error_table(server: LiveServer, method: str, path: str, body: Any, status: int,
                           expected: dict[str, Any]) -> None:
    data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
    async with aiohttp.ClientSession() as session, session.request(
        method, server.base_url + path, data=data,
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status == status
        assert response.content_type == "application/json"
        assert await response.json() == expected
        assert LoadHints.from_headers(response.headers) is not None
    assert server.engine.is_healthy


async def test_oversized_body_is_413(server: LiveServer) -> None:
    body = orjson.dumps(completion(prompt="x" * MAX_BODY_BYTES))
    async with aiohttp.ClientSession() as session, session.post(
        server.base_url + "/v1/completions", data=body,
        headers={"Content-Type": "application/json"},
    ) as response:
        assert response.status == 413
        assert await response.json() == error(
            f"Request body too large: {len(body)} bytes sent, the limit is {MAX_BODY_BYTES} "
            f"bytes.", code="request_too_large")


async def test_sdk_raises_bad_request_with_param(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=MODEL, prompt="x", max_tokens=2,
                                        frequency_penalty=3.0)
    assert info.value.status_code == 400
    assert info.value.param == "frequency_penalty"
    assert info.value.message.endswith("frequency_penalty must be in [-2, 2], got 3.0")


async def test_sdk_raises_not_found_for_an_unknown_model(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(
            model="nope", messages=[{"role": "user", "content": "x"}])
    assert info.value.code == "model_not_found"


async def test_server_keeps_serving_after_bad_requests(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model=MODEL, prompt=[[]], max_tokens=1)
    result = await client.completions.create(model=MODEL, prompt="still here", max_tokens=2)
    assert result.usage.completion_tokens >= 1
