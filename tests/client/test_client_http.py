from __future__ import annotations

import socket

import pytest

from pagedserve.client import (
    APIConnectionError,
    APITimeoutError,
    AsyncClient,
    BadRequestError,
    InternalServerError,
    Model,
    NotFoundError,
    RateLimitError,
    RetryPolicy,
    Timeout,
)
from pagedserve.client.api.client import normalize_base_url
from pagedserve.client.api.types import (
    ChatCompletion,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    ServerLoad,
    TokenizeResult,
    Usage,
)

FAST = RetryPolicy(max_retries=2, initial_backoff=0.01, max_backoff=0.02, jitter=0.0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("given", "root"),
    [
        ("http://h:8000", "http://h:8000/"),
        ("http://h:8000/v1", "http://h:8000/"),
        ("https://api.example.com/v1/", "https://api.example.com/"),
        ("https://proxy.example.com/openai/v1", "https://proxy.example.com/openai"),
    ],
)
def test_base_url_is_normalised_to_the_server_root(given, root):
    assert str(normalize_base_url(given)) == root


@pytest.mark.parametrize("bad", ["localhost:8000", "ftp://h", "http://"])
def test_bad_base_url_is_rejected(bad):
    with pytest.raises(ValueError) as info:
        AsyncClient(bad)
    assert str(info.value) == f"base_url must be an http(s) URL with a host, got {bad!r}"


async def test_completion_typed_result(serve):
    server, url = await serve()
    async with AsyncClient(url + "/v1", api_key="sk-test") as client:
        result = await client.completions.create(
            model="m", prompt="hello world", max_tokens=3, logprobs=1, temperature=None
        )
    assert isinstance(result, Completion)
    assert result.usage == Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5)
    assert result.choices == [
        CompletionChoice(
            index=0,
            text=" tok0 tok1 tok2",
            finish_reason="length",
            logprobs=CompletionLogprobs(
                tokens=[" tok0", " tok1", " tok2"],
                token_logprobs=[-0.5, -0.5, -0.5],
                top_logprobs=[{" tok0": -0.5}, {" tok1": -0.5}, {" tok2": -0.5}],
                text_offset=[0, 5, 10],
            ),
        )
    ]
    # None-valued fields are left out so the server's default applies.
    assert server.arrivals[0].body == {
        "model": "m", "prompt": "hello world", "max_tokens": 3, "logprobs": 1
    }
    assert server.auth_headers == ["Bearer sk-test"]


async def test_chat_typed_result_with_logprobs(serve):
    _, url = await serve()
    async with AsyncClient(url) as client:
        result = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2, n=2,
            logprobs=True,
        )
    assert isinstance(result, ChatCompletion)
    assert [c.message.content for c in result.choices] == [" tok0 tok1", " tok0 tok1"]
    assert [c.index for c in result.choices] == [0, 1]
    assert result.choices[0].message.role == "assistant"
    assert result.choices[1].finish_reason == "length"
    assert [(t.token, t.logprob) for t in result.choices[0].logprobs] == [
        (" tok0", -0.5), (" tok1", -0.5)
    ]
    assert result.choices[0].logprobs[1].top_logprobs[0].token == " tok1"
    assert result.usage == Usage(1, 4, 5)
    assert result.raw["object"] == "chat.completion"


async def test_429_is_retried_after_retry_after_ms(serve):
    script = {"p": [("status", 429, {"retry-after-ms": "150"})]}
    server, url = await serve(script=script)
    async with AsyncClient(url, retry_policy=FAST) as client:
        result = await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert result.choices[0].text == " tok0"
    rejected, = server.answers_for("p")[:1]
    retried = server.arrivals_for("p")[1]
    assert rejected.status == 429
    assert retried.at - rejected.at >= 0.15


async def test_5xx_retried_until_success(serve):
    server, url = await serve(script={"p": [("status", 500), ("status", 503)]})
    async with AsyncClient(url, retry_policy=FAST) as client:
        result = await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert result.usage.completion_tokens == 1
    assert [a.status for a in server.answers_for("p")] == [500, 503, 200]


async def test_retries_exhausted_raise_the_last_error(serve):
    server, url = await serve(script={"p": [("status", 503)] * 5})
    async with AsyncClient(url, retry_policy=FAST) as client:
        with pytest.raises(InternalServerError) as info:
            await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert str(info.value) == "503 Service Unavailable: injected 503"
    assert len(server.arrivals_for("p")) == 3


async def test_rate_limit_error_after_retries(serve):
    _, url = await serve(script={"p": [("status", 429)] * 3})
    async with AsyncClient(url, retry_policy=FAST) as client:
        with pytest.raises(RateLimitError) as info:
            await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert info.value.code == "429"


async def test_400_is_not_retried(serve):
    server, url = await serve(script={"p": [("status", 400)]})
    async with AsyncClient(url, retry_policy=FAST) as client:
        with pytest.raises(BadRequestError) as info:
            await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert str(info.value) == "400 Bad Request: injected 400"
    assert info.value.body == {
        "error": {"message": "injected 400", "type": "injected_error", "code": "400"}
    }
    assert len(server.arrivals_for("p")) == 1


async def test_slow_first_byte_times_out_then_retry_succeeds(serve):
    server, url = await serve(script={"p": [("slow", 0.5)]})
    async with AsyncClient(url, retry_policy=FAST, timeout=Timeout(total=0.1)) as client:
        result = await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert result.choices[0].text == " tok0"
    assert len(server.arrivals_for("p")) == 2


async def test_timeout_without_retries_left(serve):
    _, url = await serve(script={"p": [("slow", 0.5)]})
    async with AsyncClient(url, max_retries=0, timeout=0.1) as client:
        with pytest.raises(APITimeoutError) as info:
            await client.completions.create(model="m", prompt="p", max_tokens=1)
    assert str(info.value) == f"request to {url}/v1/completions timed out"


async def test_body_dropped_midway_is_retried(serve):
    server, url = await serve(script={"p": [("drop",)]})
    async with AsyncClient(url, retry_policy=FAST) as client:
        result = await client.completions.create(model="m", prompt="p", max_tokens=2)
    assert result.choices[0].text == " tok0 tok1"
    assert len(server.arrivals_for("p")) == 2


async def test_connection_refused():
    url = f"http://127.0.0.1:{_free_port()}"
    async with AsyncClient(url, max_retries=0) as client:
        with pytest.raises(APIConnectionError) as info:
            await client.completions.create(model="m", prompt="p")
    assert str(info.value).startswith(f"connection to {url}/v1/completions failed: ")
    assert not isinstance(info.value, APITimeoutError)


async def test_tokenize_load_and_models(serve):
    load = {"kv_cache_usage": 0.25, "num_waiting": 1, "num_running": 2,
            "free_token_capacity": 300, "num_preemptions": 0, "max_num_seqs": 8,
            "max_num_batched_tokens": 512, "total_kv_tokens": 400}
    server, url = await serve(load=load, max_model_len=1024)
    async with AsyncClient(url) as client:
        counted = await client.tokenize("m", prompt="hello world")
        assert counted == TokenizeResult(count=2, tokens=[15339, 1917], max_model_len=1024)
        assert await client.load() == ServerLoad(0.25, 1, 2, 300, 0, 8, 512, 400)
        models = await client.models.list()
        assert [model.id for model in models] == ["fake-model"]
        assert models.data[0] == Model("fake-model", created=0, owned_by="fake")
        assert await client.models.retrieve("fake-model") == models.data[0]
        with pytest.raises(NotFoundError) as missing:
            await client.models.retrieve("other")
        assert missing.value.code == "model_not_found"
        with pytest.raises(ValueError) as info:
            await client.tokenize("m")
        assert str(info.value) == "tokenize needs exactly one of prompt or messages"
    assert server.tokenize_bodies == [{"model": "m", "prompt": "hello world"}]


async def test_load_is_none_without_the_route(serve):
    _, url = await serve()
    async with AsyncClient(url) as client:
        assert await client.load() is None
