from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from client_fake_server import FakeOpenAIServer

StartServer = Callable[..., Awaitable[tuple[FakeOpenAIServer, str]]]


@pytest.fixture
async def serve() -> AsyncIterator[StartServer]:
    """Start fake OpenAI servers; each call returns (server, base_url)."""
    servers: list[FakeOpenAIServer] = []

    async def start(**kwargs: Any) -> tuple[FakeOpenAIServer, str]:
        server = FakeOpenAIServer(**kwargs)
        url = await server.start()
        servers.append(server)
        return server, url

    yield start
    for server in servers:
        await server.close()
