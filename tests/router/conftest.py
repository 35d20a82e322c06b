"""Two fake replicas and a router over them, all on the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest_asyncio
from aiohttp.test_utils import TestServer

from pagedserve.router import RouterConfig, create_app
from pagedserve.router.state import STATE_KEY, RouterState
from tests.router.fake_replica import FakeReplica


class Router:
    def __init__(self, server: TestServer) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    @property
    def state(self) -> RouterState:
        return self.server.app[STATE_KEY]

    async def check_health(self) -> None:
        await self.state.replicas.check_all(self.state.session)


async def start_router(replicas: list[str], **overrides: Any) -> Router:
    # Health checks only when a test asks for them, so each test decides what the router saw.
    config = RouterConfig(replicas=replicas, health_interval=3600.0, **overrides)
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    return Router(server)


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
        await router.server.close()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
