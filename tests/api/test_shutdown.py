"""Graceful shutdown: SIGTERM drains a real ``pagedserve serve`` process (in-flight requests
finish, new ones get 503, exit status 0); past the drain timeout the stragglers are aborted
with an error event."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from pagedserve.client.api.sse import iter_sse
from pagedserve.server.api import drain
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config, start_serve_process

DRAINING = {"error": {"message": "The server is shutting down.",
                      "type": "service_unavailable_error", "param": None,
                      "code": "server_draining"}}
LONG = {"model": MODEL, "prompt": "keep going", "max_tokens": 1000, "ignore_eos": True,
        "temperature": 0, "stream": True}


async def start_process(model_dir: Path) -> tuple[asyncio.subprocess.Process, str]:
    return await start_serve_process(model_dir, "--drain-timeout", "60")


async def wait_for_status(session: aiohttp.ClientSession, url: str, status: int) -> dict:
    while True:
        async with session.get(url) as response:
            if response.status == status:
                return await response.json()
        await asyncio.sleep(0.01)


async def test_sigterm_drains_and_exits_zero(model_dir: Path) -> None:
    process, base_url = await start_process(model_dir)
    try:
        async with aiohttp.ClientSession() as session:
            stream = await session.post(base_url + "/v1/completions", json=LONG)
            events = iter_sse(stream.content)
            first = (await anext(events)).json()
            assert first["choices"][0]["finish_reason"] is None

            process.send_signal(signal.SIGTERM)
            health = await asyncio.wait_for(
                wait_for_status(session, base_url + "/health", 503), 30)
            assert health == DRAINING
            async with session.post(base_url + "/v1/completions",
                                    json={**LONG, "stream": False}) as refused:
                assert refused.status == 503
                assert refused.headers["Retry-After"] == "1"
                assert await refused.json() == DRAINING

            chunks = [event async for event in events]
            assert chunks[-1].is_done
            *tokens, _ = chunks
            assert len(tokens) + 1 == LONG["max_tokens"]
            assert tokens[-1].json()["choices"][0]["finish_reason"] == "length"
        assert await asyncio.wait_for(process.wait(), 60) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.fixture
def drained_server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir))).start()
    yield live
    live.stop()


async def test_drain_timeout_aborts_with_an_error_event(drained_server: LiveServer) -> None:
    server = drained_server
    free = server.engine.stats().free_token_capacity
    async with aiohttp.ClientSession() as session:
        stream = await session.post(server.base_url + "/v1/completions", json=LONG)
        events = iter_sse(stream.content)
        assert (await anext(events)).json()["choices"][0]["finish_reason"] is None
        finished = await asyncio.to_thread(server.call, lambda: drain(server.app, 0.05))
        assert finished is False
        rest = [event async for event in events]
        assert rest[-1].is_done
        assert rest[-2].json() == DRAINING
        assert all("choices" in e.json() for e in rest[:-2])
    server.wait_idle(free)
