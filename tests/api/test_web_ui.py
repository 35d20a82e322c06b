"""The web page's routes: ``/`` and its files load without a key, ``/engine/state`` follows
the API's key rule and reports the engine's snapshot, ``web_ui=False`` (``--disable-web-ui``)
serves neither. The page itself is driven in a browser in tests/web."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from pagedserve.cli import serve
from pagedserve.server.api.web.engine_state import grid_cells
from tests.api.conftest import MODEL
from tests.api.live_server import LiveServer, server_config
from tests.api.test_auth import MISSING, unauthorized

KEY = "sk-web-test"
NUM_BLOCKS = 64  # server_config's KV cache
STATE_KEYS = {"object", "model", "num_steps", "num_running", "num_waiting", "num_swapped",
              "num_preemptions", "step_ms", "generation_tokens_per_s", "prompt_tokens_per_s",
              "prefix_cache_hit_rate", "kv_cache_usage", "blocks"}


@pytest.fixture(scope="module")
def keyed_server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir), api_key=KEY)).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def pageless_server(model_dir: Path) -> Iterator[LiveServer]:
    live = LiveServer(server_config(str(model_dir), web_ui=False)).start()
    yield live
    live.stop()


async def get(url: str, headers: dict[str, str] | None = None
              ) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as r:
        return r.status, dict(r.headers), await r.read()


async def state_when(server: LiveServer, predicate: Any, timeout: float = 30.0) -> Any:
    """Polls /engine/state (as the page does) until ``predicate(state)``."""
    deadline = time.monotonic() + timeout
    while True:
        status, _, body = await get(server.base_url + "/engine/state")
        assert status == 200
        state = orjson.loads(body)
        if predicate(state):
            return state
        assert time.monotonic() < deadline, f"never reached: {state}"
        await asyncio.sleep(0.02)


def not_found(path: str) -> bytes:
    return (b'{"error":{"message":"Invalid URL (GET ' + path.encode() + b')","type":'
            b'"invalid_request_error","param":null,"code":"unknown_url"}}')


@pytest.mark.parametrize(("path", "content_type", "needle"), [
    ("/", "text/html", b'<script type="module" src="/ui/app.js">'),
    ("/ui/app.js", "application/javascript", b"startEngineView"),
    ("/ui/style.css", "text/css", b"#grid"),
])
async def test_the_page_loads_without_a_key_and_tells_nothing_of_the_load(
        keyed_server: LiveServer, path: str, content_type: str, needle: bytes) -> None:
    status, headers, body = await get(keyed_server.base_url + path)
    assert (status, headers["Content-Type"].split(";")[0]) == (200, content_type)
    assert needle in body
    assert not [h for h in headers if h.lower().startswith("x-pagedserve-")]


async def test_an_unknown_page_file_is_the_apis_404(server: LiveServer) -> None:
    status, _, body = await get(server.base_url + "/ui/engine_state.py")
    assert (status, body) == (404, not_found("/ui/engine_state.py"))


async def test_the_engine_state_needs_the_key(keyed_server: LiveServer) -> None:
    url = keyed_server.base_url + "/engine/state"
    status, _, body = await get(url)
    assert (status, orjson.loads(body)) == (401, unauthorized(MISSING))
    status, _, body = await get(url, {"Authorization": f"Bearer {KEY}"})
    assert status == 200
    assert set(orjson.loads(body)) == STATE_KEYS


async def test_the_state_shows_a_request_s_blocks_while_it_runs_and_frees_them(
        server: LiveServer) -> None:
    body = {"model": MODEL, "prompt": "x" * 40, "max_tokens": 200, "ignore_eos": True,
            "n": 2, "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(server.base_url + "/v1/completions", json=body) as response:
            await response.content.readline()  # the first event: it runs
            running = await state_when(server, lambda s: s["num_running"] == 1)
        blocks = running["blocks"]
        # Two samples share the prompt's blocks; each has blocks of its own too.
        assert blocks["shared"] > 0 and blocks["used"] > 0
        assert blocks["cells"].count("3") == blocks["shared"]
        assert blocks["cells"].count("2") == blocks["used"]
        assert running["kv_cache_usage"] == (blocks["used"] + blocks["shared"]) / NUM_BLOCKS
    # The client hung up: the request is aborted and its blocks are free (no prefix cache).
    idle = await state_when(server, lambda s: s["num_running"] == 0)
    assert idle["model"] == MODEL and idle["num_steps"] > running["num_steps"]
    assert idle["blocks"] == {"block_size": 16, "num_blocks": NUM_BLOCKS, "free": NUM_BLOCKS,
                              "cached": 0, "used": 0, "shared": 0, "blocks_per_cell": 1,
                              "cells": "0" * NUM_BLOCKS}


@pytest.mark.parametrize("path", ["/", "/ui/app.js", "/engine/state"])
async def test_without_the_web_ui_its_routes_are_404(pageless_server: LiveServer,
                                                     path: str) -> None:
    status, _, body = await get(pageless_server.base_url + path)
    assert (status, body) == (404, not_found(path))


def test_a_large_pool_is_drawn_a_few_blocks_a_cell() -> None:
    # Each cell shows the largest state of its blocks; blocks past the states are free.
    states = bytes([0, 2, 1, 3, 0])
    assert grid_cells(states, 7, max_cells=3) == {"blocks_per_cell": 3, "cells": "230"}
    assert grid_cells(states, 7) == {"blocks_per_cell": 1, "cells": "0213000"}


def test_the_flag_turns_the_page_off() -> None:
    from tests.api.test_serve_cli import parse

    assert serve.config_from_args(parse([])).web_ui is True
    assert serve.config_from_args(parse(["--disable-web-ui"])).web_ui is False
