"""The application factory: routes, middlewares, and the engine's life in ``cleanup_ctx``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from pagedserve.common.http.connection_guard import (
    ConnectionGuard,
    GuardedTCPSite,
    expect_continue,
)
from pagedserve.common.http.parse_errors import json_parse_errors
from pagedserve.server.api import routes_info
from pagedserve.server.api.config.app_keys import (
    CONFIG_KEY,
    ENGINE_KEY,
    MODEL_NAMES_KEY,
    STARTED_KEY,
)
from pagedserve.server.api.config.server_config import ServerConfig
from pagedserve.server.api.http.admission import ADMISSION_KEY, Admission
from pagedserve.server.api.http.api_errors import error_middleware, shutting_down
from pagedserve.server.api.http.jsonio import TOKENIZER_POOL_KEY
from pagedserve.server.api.serving.chat import create_chat_completion
from pagedserve.server.api.serving.completions import create_completion
from pagedserve.server.api.serving.generation import BATCHES_KEY
from pagedserve.server.api.serving.responses import create_response
from pagedserve.server.api.serving.tokenize import detokenize, tokenize
from pagedserve.server.api.telemetry.hints import add_load_hints, get_load, track_steps
from pagedserve.server.api.telemetry.metrics import METRICS_KEY, ServerMetrics
from pagedserve.server.api.telemetry.server_log import SERVER_LOG_KEY, ServerLog
from pagedserve.server.api.telemetry.tracing import TRACING_KEY, ServerTracing
from pagedserve.server.api.web.access_log import PageQuietAccessLogger
from pagedserve.server.api.web.page import add_web_ui

# Once the engine is gone, how long a handler may keep its connection open.
_SHUTDOWN_TIMEOUT_S = 5.0


def create_app(config: ServerConfig, tracing: ServerTracing | None = None) -> web.Application:
    """A ready-to-run application; the engine loads when the app starts up. ``tracing``
    (else one for ``config.otlp_traces_endpoint``, if set) traces generation requests."""
    admission = Admission(config.api_key, config.limits, config.trusted_proxies())
    if tracing is None and config.otlp_traces_endpoint:
        tracing = ServerTracing.from_endpoint(config.otlp_traces_endpoint)
    middlewares = [error_middleware, admission.middleware()]
    if tracing is not None:  # outermost: the span sees the status the client gets
        middlewares.insert(0, tracing.middleware())
    app = web.Application(middlewares=middlewares, client_max_size=config.max_request_body_bytes)
    if tracing is not None:
        app[TRACING_KEY] = tracing
        app.on_cleanup.append(_flush_traces)
    names = config.served_model_names or [config.engine_args.model]
    app[CONFIG_KEY] = config
    app[MODEL_NAMES_KEY] = names
    app[ADMISSION_KEY] = admission
    app[BATCHES_KEY] = set()
    app[SERVER_LOG_KEY] = ServerLog()
    app[METRICS_KEY] = ServerMetrics(names[0], lambda: app.get(ENGINE_KEY))
    app.cleanup_ctx.append(_tokenizer_pool_context)
    app.cleanup_ctx.append(_engine_context)
    app.on_startup.append(_attach_metrics)  # runs after _engine_context has started it
    app.on_response_prepare.append(add_load_hints)
    app.on_response_prepare.append(_count_response)
    _add_routes(app.router)
    if config.web_ui:
        add_web_ui(app.router, lambda: app[ENGINE_KEY].snapshot(), names[0])
    return app


def make_runner(app: web.Application, **kwargs: Any) -> web.AppRunner:
    """The runner every launcher must use: with ``handler_cancellation`` a client that
    disconnects cancels its handler, which is what aborts a non-streaming generation."""
    kwargs.setdefault("shutdown_timeout", _SHUTDOWN_TIMEOUT_S)
    kwargs.setdefault("keepalive_timeout", app[CONFIG_KEY].limits.timeout_keep_alive)
    kwargs.setdefault("logger", app[SERVER_LOG_KEY])
    kwargs.setdefault("access_log_class", PageQuietAccessLogger)
    return web.AppRunner(app, handler_cancellation=True, **kwargs)


def make_site(runner: web.AppRunner, host: str, port: int) -> GuardedTCPSite:
    """The TCP site every launcher must use: it caps connections (in all and per client) and
    header-read time."""
    return GuardedTCPSite(runner, host, port, _guard(runner))


def make_health_site(runner: web.AppRunner, host: str, port: int) -> GuardedTCPSite:
    """A second site that answers only /health and /metrics (``--health-port``), with its own
    few connections, so that orchestrators' probes never queue behind clients."""
    return GuardedTCPSite(runner, host, port, _guard(runner, max_connections=0))


def _guard(runner: web.AppRunner, max_connections: int | None = None) -> ConnectionGuard:
    assert runner.server is not None, "set the runner up first"
    admission = runner.app[ADMISSION_KEY]
    return ConnectionGuard(json_parse_errors(runner.server), runner.app[CONFIG_KEY].limits,
                           admission.probe_only, max_connections, proxies=admission.proxies,
                           on_close=admission.key_connections.closed)


def _add_routes(router: web.UrlDispatcher) -> None:
    for path, handler in (("/v1/completions", create_completion),
                          ("/v1/chat/completions", create_chat_completion),
                          ("/v1/responses", create_response),
                          ("/tokenize", tokenize), ("/detokenize", detokenize)):
        router.add_post(path, handler, expect_handler=expect_continue)
    router.add_get("/v1/models", routes_info.list_models)
    router.add_get("/v1/models/{model}", routes_info.retrieve_model)
    router.add_get("/health", routes_info.health)
    router.add_get("/metrics", routes_info.metrics)
    router.add_get("/version", routes_info.version)
    router.add_get("/load", get_load)


async def _attach_metrics(app: web.Application) -> None:
    app[METRICS_KEY].attach(app[ENGINE_KEY])


async def _flush_traces(app: web.Application) -> None:
    # Exports what the batch processor still holds; blocking I/O, so off the loop.
    await asyncio.to_thread(app[TRACING_KEY].provider.shutdown)


async def _count_response(request: web.Request, response: web.StreamResponse) -> None:
    request.app[METRICS_KEY].count_response(request, response)


async def _tokenizer_pool_context(app: web.Application) -> AsyncIterator[None]:
    threads = app[CONFIG_KEY].limits.tokenizer_threads
    pool = ThreadPoolExecutor(threads, thread_name_prefix="pagedserve-tokenizer")
    app[TOKENIZER_POOL_KEY] = pool
    try:
        yield
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


async def _engine_context(app: web.Application) -> AsyncIterator[None]:
    # Imported here: torch loads with the engine, not with the API's modules.
    from pagedserve.server.engine.async_engine import AsyncEngine

    engine_args = app[CONFIG_KEY].engine_args
    engine = await AsyncEngine.launch(engine_args)  # built in the thread that steps it
    track_steps(app, engine)
    app[ENGINE_KEY] = engine
    app[STARTED_KEY] = int(time.time())
    try:
        yield
    finally:
        active = app[BATCHES_KEY]
        for batch in list(active):
            batch.interrupt(shutting_down())
        await engine.shutdown()
