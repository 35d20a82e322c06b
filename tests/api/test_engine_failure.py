"""When the engine's loop stops: /health turns 503, a stream in flight ends with an error
event (not a dropped connection), and new requests get 503."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from pagedserve.client.sse import iter_sse
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config


def engine_dead(detail: str) -> dict[str, object]:
    return {"error": {"message": f"The engine is not running: {detail}",
                      "type": "service_unavailable_error", "param": None,
                      "code": "engine_dead"}}


@pytest.fixture
def doomed_server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir))).start()
    yield live
    live.stop()


async def test_engine_stop_mid_stream(doomed_server: LiveServer) -> None:
    server = doomed_server
    body = {"model": MODEL, "prompt": "x", "max_tokens": 1000, "ignore_eos": True,
            "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.get(server.base_url + "/health") as health:
            assert health.status == 200
        stream = await session.post(server.base_url + "/v1/completions", json=body)
        events = iter_sse(stream.content)
        assert "choices" in (await anext(events)).json()

        server.call(server.engine.shutdown)
        rest = [event async for event in events]
        assert rest[-1].is_done
        assert rest[-2].json() == engine_dead("the engine has shut down")

        async with session.get(server.base_url + "/health") as health:
            assert health.status == 503
            assert await health.json() == engine_dead("the step loop has stopped")
        async with session.post(server.base_url + "/v1/completions",
                                json={**body, "stream": False}) as refused:
            assert refused.status == 503
            assert await refused.json() == engine_dead("the engine is not running")
