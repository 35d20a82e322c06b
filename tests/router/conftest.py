"""Two fake replicas and a router over them, all on the test's event loop; two real replicas
of the tiny checkpoint for the end-to-end tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from pagedserve.router import RouterConfig, create_app
from pagedserve.router.app import make_runner, make_site
from pagedserve.router.state import STATE_KEY, RouterState
from pagedserve.router.tracing import Tracing
from tests.api.live_server import LiveServer, server_config
from tests.live_model import write_live_model
from tests.router.fake_replica import FakeReplica


class Router:
    """A router on 127.0.0.1 as ``pagedserve router`` runs it: its runner, behind its guarded
    site."""

    def __init__(self, runner: web.AppRunner, port: int) -> None:
        self.runner = runner
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def state(self) -> RouterState:
        return self.runner.app[STATE_KEY]

    async def check_health(self) -> None:
        await self.state.replicas.check_all(self.state.session)

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_router(replicas: list[str], tracing: Tracing | None = None,
                       **overrides: Any) -> Router:
    # Health checks only when a test asks for them, so each test decides what the router saw.
    overrides.setdefault("health_interval", 3600.0)
    config = RouterConfig(replicas=replicas, **overrides)
    runner = make_runner(create_app(config, tracing), access_log=None)
    await runner.setup()
    site = make_site(runner, "127.0.0.1", 0)
    await site.start()
    return Router(runner, int(site.urls[0].rsplit(":", 1)[1]))


@pytest_asyncio.fixture
async def replicas() -> AsyncIterator[list[FakeReplica]]:
    fakes = [await FakeReplica(name).start() for name in ("a", "b")]
    yield fakes
    for fake in fakes:
        fake.release_stream.set()
        await fake.stop()


@pytest_asyncio.fixture
async def make_router() -> AsyncIterator[Callable[..., Any]]:
    started: list[Router] = []

    async def make(urls: list[str], **overrides: Any) -> Router:
        router = await start_router(urls, **overrides)
        started.append(router)
        return router

    yield make
    for router in started:
        await router.close()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_live_model(tmp_path_factory.mktemp("router-llama"))


@pytest.fixture(scope="module")
def live_replicas(model_dir: Path) -> Iterator[list[LiveServer]]:
    """Two real replicas of the tiny checkpoint, each in its own thread."""
    config = {"enable_prefix_caching": True}
    servers = [LiveServer(server_config(str(model_dir), engine=config)).start()
               for _ in range(2)]
    yield servers
    for server in servers:
        server.stop()
