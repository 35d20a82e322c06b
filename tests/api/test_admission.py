"""Admission control: past ``max_waiting_requests`` the server answers 429 + Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config

LONG = {"model": MODEL, "prompt": "wait your turn", "max_tokens": 1000, "ignore_eos": True}


@pytest.fixture(scope="module")
def one_slot_server(model_dir: Path) -> Iterator[LiveServer]:
    # One running sequence, one waiting request: the third concurrent request is refused.
    engine = {"max_num_seqs": 1, "max_waiting_requests": 1}
    live = LiveServer(server_config(str(model_dir), engine=engine)).start()
    yield live
    live.stop()


async def test_full_waiting_queue_is_429_with_retry_after(one_slot_server: LiveServer) -> None:
    server = one_slot_server
    url = server.base_url + "/v1/completions"
    async with aiohttp.ClientSession() as session:
        running = await session.post(url, json={**LONG, "stream": True})
        await running.content.readline()  # the first token: it holds the only slot
        waiting = asyncio.create_task(session.post(url, json=LONG))
        await asyncio.to_thread(server.wait_until, lambda s: s.num_waiting == 1)

        async with session.post(url, json={**LONG, "max_tokens": 1}) as refused:
            assert refused.status == 429
            assert refused.headers["Retry-After"] == "1"
            assert await refused.json() == {"error": {
                "message": "the waiting queue is full (1 requests, max_waiting_requests=1); "
                           "retry later",
                "type": "rate_limit_error", "param": None, "code": "queue_full"}}

        async with AsyncOpenAI(base_url=server.base_url + "/v1", api_key="x",
                               max_retries=0) as client:
            with pytest.raises(openai.RateLimitError) as info:
                await client.completions.create(model=MODEL, prompt="x", max_tokens=1)
            assert info.value.response.headers["Retry-After"] == "1"

        running.close()
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    await asyncio.to_thread(server.wait_until,
                            lambda s: s.num_running == 0 and s.num_waiting == 0)
