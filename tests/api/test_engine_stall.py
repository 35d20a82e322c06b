"""A step that does not return while the HTTP loop runs on: a silent stream gets SSE
keep-alive comments while the engine is live, /health turns 503 once the engine has not come
round for --engine-stall-timeout, and the comments stop then; when the step returns, all is
as before."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from pagedserve.client.api.sse import iter_sse
from pagedserve.common.load_hints import HEADER_KEEPALIVE
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config

KEEPALIVE_S = 0.2
STALL_S = 1.5
WAIT_S = 30.0


@pytest.fixture
def stalling_server(model_dir: Path) -> Iterator[tuple[LiveServer, threading.Event]]:
    live = LiveServer(server_config(str(model_dir), stream_keepalive_interval=KEEPALIVE_S,
                                    engine_stall_timeout=STALL_S)).start()
    engine = live.engine.engine
    step = engine.step
    release = threading.Event()

    def held_step(*args: Any, **kwargs: Any) -> Any:
        release.wait(WAIT_S)  # a step that hangs until the test lets it go
        return step(*args, **kwargs)

    engine.step = held_step
    yield live, release
    release.set()
    live.stop()


async def health(session: aiohttp.ClientSession, server: LiveServer) -> tuple[int, Any]:
    async with session.get(server.base_url + "/health") as response:
        return response.status, await response.json()


async def test_a_hung_step_stops_keepalives_and_fails_health(
        stalling_server: tuple[LiveServer, threading.Event]) -> None:
    server, release = stalling_server
    body = {"model": MODEL, "prompt": "x", "max_tokens": 3, "ignore_eos": True,
            "temperature": 0, "stream": True}
    async with aiohttp.ClientSession() as session:
        assert await health(session, server) == (200, {"status": "ok"})
        stream = await session.post(server.base_url + "/v1/completions", json=body,
                                    headers={HEADER_KEEPALIVE: "1"})
        plain = await session.post(server.base_url + "/v1/completions", json=body)
        assert (stream.status, plain.status) == (200, 200)
        # Before any token, the silent stream that asked for comments is kept alive.
        first = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), WAIT_S)
        assert first == b": keep-alive\n\n"
        assert plain.content.read_nowait() == b""  # the other one carries events only
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while (answer := await health(session, server))[0] == 200:
            assert loop.time() < deadline, "/health never turned 503"
            await asyncio.sleep(0.1)
        status, error = answer
        assert status == 503
        assert error["error"]["code"] == "engine_stalled"
        assert error["error"]["message"].startswith("The engine has not finished a step in ")
        assert error["error"]["message"].endswith(
            " s while it holds requests (--engine-stall-timeout 1.5 s).")
        await asyncio.sleep(KEEPALIVE_S)
        stream.content.read_nowait()  # comments written before /health turned
        with pytest.raises(TimeoutError):  # stalled: silence, no more comments
            await asyncio.wait_for(stream.content.readline(), 3 * KEEPALIVE_S)
        release.set()
        events = [event async for event in iter_sse(stream.content)]
        assert events[-1].is_done
        assert events[-2].json()["choices"][0]["finish_reason"] == "length"  # all 3 tokens
        raw = await plain.content.read()
        assert raw.startswith(b"data: ") and b"\n\n:" not in raw
        assert await health(session, server) == (200, {"status": "ok"})
