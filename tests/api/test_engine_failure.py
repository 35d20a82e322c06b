"""When the engine's loop stops: /health turns 503, a stream in flight ends with an error
event (not a dropped connection), and new requests get 503. When its step fails, the
``pagedserve serve`` process exits non-zero within seconds, for a supervisor to restart it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from pagedserve.cli.serve import EXIT_ENGINE_FAILED
from pagedserve.client.api.sse import iter_sse
from pagedserve.server.engine.async_engine import FAIL_STEP_ENV
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config, start_serve_process


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


# The failure comes a few steps into the generations below; exiting takes the handlers' grace
# (2 s) and the runner's cleanup, well within this.
EXIT_BOUND_S = 15


async def test_a_failed_step_ends_the_process_with_errors_for_everyone(model_dir: Path) -> None:
    process, base_url = await start_serve_process(model_dir, env={FAIL_STEP_ENV: "8"})
    body = {"model": MODEL, "prompt": "x", "max_tokens": 500, "ignore_eos": True}
    failed = ("the engine loop failed: InjectedStepFailure('step 8 failed on purpose "
              f"({FAIL_STEP_ENV}=8)')")
    try:
        async with aiohttp.ClientSession() as session:
            stream = await session.post(base_url + "/v1/completions",
                                        json={**body, "stream": True})
            plain = asyncio.ensure_future(session.post(base_url + "/v1/completions",
                                                       json=body))
            events = [event async for event in iter_sse(stream.content)]
            failed_at = time.monotonic()
            assert "choices" in events[0].json()
            assert events[-2].json() == engine_dead(failed)
            assert events[-1].is_done
            async with await plain as response:
                assert response.status == 503
                assert await response.json() == engine_dead(failed)
            try:
                async with session.get(base_url + "/health") as health:
                    assert health.status == 503
            except aiohttp.ClientConnectionError:
                pass  # already gone: as good as a 503 to a load balancer
        status = await asyncio.wait_for(process.wait(), EXIT_BOUND_S)
        assert status == EXIT_ENGINE_FAILED
        assert time.monotonic() - failed_at < EXIT_BOUND_S
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
