"""A request whose output processing raises gets an OpenAI-shaped 500 (a stream: an error
event, then [DONE]); the requests running beside it complete and the server goes on."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from pagedserve.client.api.sse import iter_sse
from pagedserve.server.engine.core.sequence import SequenceGroup
from pagedserve.server.engine.output_processor import OutputProcessor
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

POISON = "poison pill"
REQUEST_FAILED = {"error": {
    "message": "The server had an error while processing the output of this request, and "
               "ended it.",
    "type": "server_error", "param": None, "code": "request_failed"}}


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    """Output processing raises for the poison prompt once it has two tokens."""
    process = OutputProcessor._process

    def failing(self: OutputProcessor, group: SequenceGroup, logprobs: dict) -> list:
        if group.prompt == POISON and group.seqs[0].num_output_tokens >= 2:
            raise RuntimeError("post-processing exploded")
        return process(self, group, logprobs)

    monkeypatch.setattr(OutputProcessor, "_process", failing)


def body(prompt: str, **extra: object) -> dict[str, object]:
    return {"model": MODEL, "prompt": prompt, "max_tokens": 12, "ignore_eos": True,
            "temperature": 0.0, **extra}


async def test_one_failing_request_fails_alone(server: LiveServer, poisoned: None) -> None:
    url = server.base_url + "/v1/completions"
    free = server.engine.stats().free_token_capacity
    async with aiohttp.ClientSession() as session:

        async def post(payload: dict[str, object]) -> tuple[int, dict]:
            async with session.post(url, json=payload) as response:
                return response.status, await response.json()

        async def stream(payload: dict[str, object]) -> list:
            async with session.post(url, json={**payload, "stream": True}) as response:
                assert response.status == 200
                return [event async for event in iter_sse(response.content)]

        failed, neighbour, streamed, neighbour_stream = await asyncio.gather(
            post(body(POISON)), post(body("a healthy neighbour")),
            stream(body(POISON)), stream(body("another neighbour")))

        assert failed == (500, REQUEST_FAILED)
        assert neighbour[0] == 200
        assert neighbour[1]["choices"][0]["finish_reason"] == "length"
        assert neighbour[1]["usage"]["completion_tokens"] == 12
        # The poisoned stream sent its first token, then the error, then [DONE].
        assert [e.json()["choices"][0]["index"] for e in streamed[:-2]] == [0]
        assert streamed[-2].json() == REQUEST_FAILED and streamed[-1].is_done
        assert neighbour_stream[-1].is_done
        assert neighbour_stream[-2].json()["choices"][0]["finish_reason"] == "length"

        await asyncio.to_thread(server.wait_idle, free)
        async with session.get(server.base_url + "/health") as health:
            assert health.status == 200
        status, after = await post(body("the next request"))
        assert status == 200 and after["usage"]["completion_tokens"] == 12
