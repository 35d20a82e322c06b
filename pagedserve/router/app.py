"""The router's application factory: routes, the replica session, the health loop, and the
guarded sites every launcher must listen on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from pagedserve.common.http.connection_guard import GuardedTCPSite, expect_continue
from pagedserve.router import error_responses
from pagedserve.router.client_gate import GATE_KEY, ClientGate, gate_middleware, read_body
from pagedserve.router.page import add_router_page
from pagedserve.router.policies import Route
from pagedserve.router.prefix_key import routing_key
from pagedserve.router.proxy import forward
from pagedserve.router.replicas import resolve
from pagedserve.router.router_config import RouterConfig
from pagedserve.router.state import STATE_KEY, RouterState
from pagedserve.router.tracing import Tracing

logger = logging.getLogger(__name__)

# The routes whose prompt picks the replica; the others go to the least loaded one.
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
OTHER_POST_PATHS = ("/tokenize", "/detokenize")
_SHUTDOWN_TIMEOUT_S = 5.0


def create_app(config: RouterConfig, tracing: Tracing | None = None) -> web.Application:
    app = web.Application(middlewares=[gate_middleware],
                          client_max_size=config.max_request_body_bytes)
    state = RouterState.build(config, tracing or Tracing())
    app[STATE_KEY] = state
    app[GATE_KEY] = ClientGate(state)
    app.cleanup_ctx.append(_session_context)
    app.cleanup_ctx.append(_discovery_context)
    for path in GENERATION_PATHS:
        app.router.add_post(path, _generate, expect_handler=expect_continue)
    for path in OTHER_POST_PATHS:
        app.router.add_post(path, _pass, expect_handler=expect_continue)
    app.router.add_get("/v1/models", _pass)
    app.router.add_get("/v1/models/{model}", _pass)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    if config.web_ui:
        add_router_page(app.router)
    return app


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner every launcher must use: ``handler_cancellation`` turns a client's
    disconnect into a cancelled handler, which closes the request to the replica."""
    kwargs.setdefault("shutdown_timeout", _SHUTDOWN_TIMEOUT_S)
    kwargs.setdefault("keepalive_timeout", app[STATE_KEY].config.timeout_keep_alive)
    return web.AppRunner(app, handler_cancellation=True, **kwargs)


def make_site(runner: web.AppRunner, host: str, port: int) -> GuardedTCPSite:
    """The site every launcher must use: it caps connections (in all and per client) and
    the time a new one gets for its request head."""
    return GuardedTCPSite(runner, host, port, runner.app[GATE_KEY].guard(runner))


def make_health_site(runner: web.AppRunner, host: str, port: int) -> GuardedTCPSite:
    """A second site for /health and /metrics only (``--health-port``), with its own few
    connections, so that probes never queue behind clients."""
    return GuardedTCPSite(runner, host, port,
                          runner.app[GATE_KEY].guard(runner, max_connections=0))


async def _generate(request: web.Request) -> web.StreamResponse:
    state = RouterState.of(request)
    body = await read_body(request)
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        return error_responses.invalid_json(str(exc))
    if not isinstance(parsed, dict):
        return error_responses.not_an_object()
    config = state.config
    key = routing_key(request.path, parsed, config.prefix_blocks, config.block_chars,
                      config.block_size)
    route = state.policy.route(state.replicas, key)
    if route.affinity:
        state.metrics.affinity[route.affinity].inc()
    return await _traced(request, state, body, route, parsed.get("stream") is True)


async def _pass(request: web.Request) -> web.StreamResponse:
    state = RouterState.of(request)
    body = await read_body(request) if request.can_read_body else None
    return await _traced(request, state, body, state.any_replica.route(state.replicas, None))


async def _traced(request: web.Request, state: RouterState, body: bytes | None, route: Route,
                  streamed: bool = False) -> web.StreamResponse:
    if state.in_flight >= state.config.max_in_flight:
        state.metrics.failures.labels("503").inc()
        return error_responses.overloaded(state.config.max_in_flight)
    state.in_flight += 1
    try:
        with state.tracing.span(request, route):
            return await forward(request, body, route, streamed)
    finally:
        state.in_flight -= 1


async def _health(request: web.Request) -> web.Response:
    healthy = RouterState.of(request).replicas.healthy()
    if not healthy:
        return error_responses.no_replica()
    return web.json_response({"status": "ok", "healthy_replicas": len(healthy)})


async def _metrics(request: web.Request) -> web.Response:
    body = RouterState.of(request).metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _session_context(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    # No pool limit: the router's own in-flight bound is the limit.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    state.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
    try:
        yield
    finally:
        await state.session.close()
        # Exports the spans still batched; blocking I/O, so off the loop.
        await asyncio.to_thread(state.tracing.shutdown)


async def _discovery_context(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE_KEY]
    if state.config.replica_dns:
        await _discover(state)
    await state.replicas.check_all(state.session)  # serve knowing which replicas are up
    task = asyncio.create_task(_health_loop(state))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _discover(state: RouterState) -> None:
    name = state.config.replica_dns
    assert name is not None
    try:
        urls = await resolve(name)
    except OSError as exc:
        logger.warning("router: cannot resolve %s: %s", name, exc)
        return
    if state.replicas.replace(state.config.replicas + urls):
        logger.info("router: replicas are now %s", ", ".join(state.replicas.replicas))


async def _health_loop(state: RouterState) -> None:
    """Health checks every ``health_interval``; DNS every ``dns_interval``."""
    loop = asyncio.get_running_loop()
    next_dns = loop.time() + state.config.dns_interval
    while True:
        await asyncio.sleep(state.config.health_interval)
        if state.config.replica_dns and loop.time() >= next_dns:
            await _discover(state)
            next_dns = loop.time() + state.config.dns_interval
        await state.replicas.check_all(state.session)
