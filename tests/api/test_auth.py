"""``--api-key``: every route but /health and /metrics needs the bearer token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config

KEY = "sk-pagedserve-test"


@pytest.fixture(scope="module")
def keyed_server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir), api_key=KEY)).start()
    yield live
    live.stop()


def unauthorized(message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                      "code": "invalid_api_key"}}


MISSING = ("You didn't provide an API key: send it in the Authorization header as "
           "'Bearer YOUR_KEY'.")


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, unauthorized(MISSING)),
        ({"Authorization": "Basic abc"}, unauthorized(MISSING)),
        ({"Authorization": "Bearer wrong"}, unauthorized("Incorrect API key provided.")),
    ],
)
async def test_missing_or_wrong_key_is_401(keyed_server: LiveServer, headers: dict[str, str],
                                           expected: dict[str, object]) -> None:
    async with aiohttp.ClientSession() as session, session.get(
        keyed_server.base_url + "/v1/models", headers=headers
    ) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        # The engine's load is no business of a client without the key.
        assert not [h for h in response.headers if h.lower().startswith("x-pagedserve-")]
        assert await response.json() == expected


async def test_a_key_that_is_not_utf8_is_a_400(keyed_server: LiveServer,
                                               caplog: pytest.LogCaptureFixture) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", keyed_server.port)
    writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
                 b"Connection: close\r\n\r\n")
    head, _, body = (await reader.read()).partition(b"\r\n\r\n")
    writer.close()
    assert head.startswith(b"HTTP/1.1 400 ")
    assert json.loads(body) == {"error": {
        "message": "The Authorization header must be valid UTF-8.",
        "type": "invalid_request_error", "param": None, "code": None}}
    assert "Traceback" not in caplog.text


async def test_health_and_metrics_stay_open(keyed_server: LiveServer) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/health", "/metrics"):
            async with session.get(keyed_server.base_url + path) as response:
                assert response.status == 200


async def test_sdk_with_and_without_the_key(keyed_server: LiveServer) -> None:
    base_url = keyed_server.base_url + "/v1"
    async with AsyncOpenAI(base_url=base_url, api_key="wrong", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            await client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert info.value.code == "invalid_api_key"
    async with AsyncOpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        result = await client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        assert result.usage.completion_tokens == 1
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]
