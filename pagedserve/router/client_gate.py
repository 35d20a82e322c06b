"""Who gets through the router, as through a replica's own front: the connection guard it
shares with the server (``common/http``: a cap on connections in all and per address, a
deadline for the first request head, 413 before ``100 Continue``), then per request the
probe-only rule, each client's share of the requests in flight and a deadline for the body
(the cap on all proxied requests is the handlers', ``app.py``).

A client is its connection's address, or behind a proxy named in ``--forwarded-allow-ips``
the client that proxy names in ``X-Forwarded-For``, as on the server; the router passes that
chain on (``proxy.forward_headers``) so that replicas trusting the router see the same client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web

from pagedserve.common.errors import APIError
from pagedserve.common.http.client_limits import ClientCounter, over_client_share
from pagedserve.common.http.connection_guard import OPEN_PATHS, ConnectionGuard, serve_probe
from pagedserve.common.http.json_errors import (
    body_read_timeout,
    error_response,
    from_http_exception,
)
from pagedserve.common.http.parse_errors import json_parse_errors
from pagedserve.router.state import RouterState

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ClientGate:
    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.per_client = ClientCounter(state.config.max_requests_per_client)
        # Connections that may ask only for OPEN_PATHS, each with the error for anything
        # else (filled by the connection guards).
        self.probe_only: dict[Any, Callable[[], APIError]] = {}

    def guard(self, runner: web.AppRunner, max_connections: int | None = None
              ) -> ConnectionGuard:
        assert runner.server is not None, "set the runner up first"
        return ConnectionGuard(json_parse_errors(runner.server), self.state.config,
                               self.probe_only, max_connections, proxies=self.state.proxies)

    async def admit(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = self.probe_only.get(request.transport)
        if refusal is not None:
            return await serve_probe(request, handler, refusal)
        if request.path in OPEN_PATHS:
            return await handler(request)
        with self._client_share(self.state.proxies.client_address(request)):
            return await handler(request)

    @contextlib.contextmanager
    def _client_share(self, client: str) -> Iterator[None]:
        if not self.per_client.try_acquire(client):
            self.state.metrics.failures.labels("429").inc()
            raise over_client_share("requests in flight", f"from {client or 'this client'}",
                                    self.per_client.limit, "--max-requests-per-client")
        try:
            yield
        finally:
            self.per_client.release(client)


async def read_body(request: web.Request) -> bytes:
    """The request's body, within ``timeout_body_read`` (a 408 after it)."""
    timeout = RouterState.of(request).config.timeout_body_read
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        # The rest is not wanted: close once answered instead of lingering to read it.
        request.content.feed_eof()
        raise body_read_timeout(timeout) from None


@web.middleware
async def gate_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The gate, and every refusal (the router's, aiohttp's) in OpenAI's shape."""
    try:
        return await request.app[GATE_KEY].admit(request, handler)
    except APIError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(from_http_exception(exc, request))


GATE_KEY = web.AppKey("router_gate", ClientGate)
