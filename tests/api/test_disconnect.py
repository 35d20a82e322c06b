"""A client that goes away aborts its request at once: the engine's KV blocks come back."""

from __future__ import annotations

import asyncio

import aiohttp

from pagedserve.server.engine.async_engine import EngineStats
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer

# Far more tokens than the test lets it produce: the request is surely still running when
# the client leaves.
LONG = {"model": MODEL, "prompt": "a long story", "max_tokens": 1000, "ignore_eos": True,
        "temperature": 0}


def idle_stats(server: LiveServer) -> EngineStats:
    stats = server.wait_until(lambda s: s.num_running == 0 and s.num_waiting == 0)
    assert stats.kv_cache_usage == 0.0
    return stats


def assert_aborted(before: EngineStats, after: EngineStats) -> None:
    """Blocks back, and the request stopped far short of its max_tokens: it was aborted,
    not run to completion."""
    assert after.free_token_capacity == before.free_token_capacity
    assert after.kv_cache_usage == 0.0
    assert after.generation_tokens_total - before.generation_tokens_total < LONG["max_tokens"]


async def test_disconnect_mid_stream_frees_blocks(server: LiveServer) -> None:
    before = idle_stats(server)
    free = before.free_token_capacity
    async with aiohttp.ClientSession() as session:
        response = await session.post(server.base_url + "/v1/completions",
                                      json={**LONG, "stream": True})
        assert response.status == 200
        for _ in range(3):
            assert (await response.content.readline()).startswith(b"data: {")
            await response.content.readline()  # the blank line after each event
        running = await asyncio.to_thread(server.wait_until, lambda s: s.num_running == 1)
        assert running.free_token_capacity < free
        response.close()  # drops the connection mid-stream
    assert_aborted(before, await asyncio.to_thread(server.wait_idle, free))


async def test_disconnect_mid_request_frees_blocks(server: LiveServer) -> None:
    before = idle_stats(server)
    free = before.free_token_capacity
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(session.post(server.base_url + "/v1/completions",
                                                   json=LONG))
        await asyncio.to_thread(server.wait_until,
                                lambda s: s.num_running == 1 and s.free_token_capacity < free)
        request.cancel()  # closes the connection before any response byte
        await asyncio.gather(request, return_exceptions=True)
    assert_aborted(before, await asyncio.to_thread(server.wait_idle, free))
