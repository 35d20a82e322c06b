"""``pagedserve serve``: the OpenAI-compatible HTTP server around the engine.

SIGTERM or SIGINT starts a graceful shutdown: new requests get 503 while those in flight
run to completion for up to ``--drain-timeout`` seconds; the rest are then aborted (their
clients get a 503 error) and the process exits 0.

If the engine's step itself fails, the requests in flight get an error at once, /health
turns 503, and the process exits with ``EXIT_ENGINE_FAILED`` within a few seconds, so that a
supervisor (Docker's restart policy, Kubernetes) starts a fresh one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from pagedserve.cli.startup_log import startup_lines
from pagedserve.common.engine_errors import PagedServeError
from pagedserve.common.http.forwarded import FORWARDED_HEADERS, X_FORWARDED_FOR, parse_allow_ips
from pagedserve.server.api.app import create_app, make_health_site, make_runner, make_site
from pagedserve.server.api.config.app_keys import ENGINE_KEY
from pagedserve.server.api.config.server_config import DEFAULT_MAX_REQUEST_BODY_BYTES, ServerConfig
from pagedserve.server.api.http.limits import (
    ServerConfigError,
    add_limit_arguments,
    limits_from_args,
)
from pagedserve.server.api.shutdown import (
    drain,
    engine_failure,
    settle_after_failure,
    wait_engine_failure,
)
from pagedserve.server.api.tools.formats import AUTO, TOOL_FORMATS
from pagedserve.server.engine.config.engine_args import EngineArgs
from pagedserve.server.models.model_path import SMOLLM2_NAME

logger = logging.getLogger("pagedserve.serve")

API_KEY_ENV = "PAGEDSERVE_API_KEY"
DEFAULT_MODEL = SMOLLM2_NAME

# Exit statuses: a signal's clean shutdown 0; the engine or the socket could not start 1;
# invalid settings 2; the engine failed while serving 3.
EXIT_OK, EXIT_START_FAILED, EXIT_BAD_CONFIG, EXIT_ENGINE_FAILED = 0, 1, 2, 3
# After an engine failure, how long handlers get to send their clients the error.
_FAILURE_GRACE_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Every flag shows its default in --help, as vLLM's do.
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.description = "Serve a model over the OpenAI-compatible HTTP API."
    parser.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                        help="the model to serve, as vLLM takes it (same as --model)")
    EngineArgs.add_cli_args(parser)
    g = parser.add_argument_group("server")
    g.add_argument("--host", default="0.0.0.0", help="address to listen on")
    g.add_argument("--port", type=int, default=8000, help="port to listen on (0: any free)")
    g.add_argument("--health-port", type=int, default=None,
                   help="a second port that serves only /health and /metrics, outside the "
                        "main port's connection caps (for orchestrators' probes and "
                        "Prometheus); None: only the main port")
    g.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="the model name(s) clients use; the first is the one responses carry; "
                        "None: the model's name")
    g.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every route but /health, "
                        f"/metrics and the web page's files; several keys: each is a tenant "
                        f"of its own for the per-client limits and the scheduler's fairness; "
                        f"None: ${API_KEY_ENV} if set (several keys separated by commas), "
                        f"else no key")
    g.add_argument("--max-request-body-bytes", type=int,
                   default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                   help="larger request bodies are refused with 413")
    g.add_argument("--allow-special-tokens-in-content", action="store_true",
                   help="let special-token text inside chat messages (say <|im_end|>) become "
                        "the model's special tokens; by default it stays text, so that no "
                        "message can end its turn and forge another")
    g.add_argument("--forwarded-allow-ips", default=None, metavar="IPS",
                   help="comma list of the proxies (addresses or CIDR networks; '*' for "
                        "every peer) whose forwarding header names the client for the "
                        "per-client limits and the tenant key: the right-most address in it "
                        "that is not a trusted proxy's; None: no proxy is trusted, the "
                        "header is ignored and every client is its connection's address "
                        "(unlike uvicorn, not even 127.0.0.1 is trusted unless named)")
    g.add_argument("--forwarded-header", default=X_FORWARDED_FOR, choices=FORWARDED_HEADERS,
                   help="the header the trusted proxies write: X-Forwarded-For, or RFC "
                        "7239's Forwarded (for=); the other one is ignored")
    g.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds in-flight requests get to finish after SIGTERM")
    g.add_argument("--stream-keepalive-interval", type=float, default=10.0,
                   help="seconds a stream may stay silent (a long queue wait or prefill) "
                        "before it gets an SSE comment, ': keep-alive', where its request "
                        "asks for them (header X-PagedServe-Keepalive, which the router "
                        "sends), so that proxies and the router see it alive")
    g.add_argument("--engine-stall-timeout", type=float, default=60.0,
                   help="seconds the engine may go without finishing a step while it holds "
                        "requests; past it /health answers 503 engine_stalled and streams "
                        "get no more keep-alive comments")
    g.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                   help="export OpenTelemetry traces of requests to this OTLP/HTTP endpoint "
                        "(e.g. http://collector:4318/v1/traces); None: no tracing")
    g.add_argument("--disable-access-log", action="store_true",
                   help="do not log one line per request")
    g.add_argument("--disable-web-ui", action="store_true",
                   help="serve no web page at / and no engine state at /engine/state")
    g.add_argument("--tool-call-parser", default=AUTO, choices=[AUTO, *TOOL_FORMATS],
                   help="the tool format: how tools reach the prompt and calls are read from "
                        "the model's text under tool_choice auto (hermes: <tool_call>{JSON}"
                        "</tool_call>, Hermes and Qwen; llama3_json: Llama 3.1-3.3; mistral: "
                        "[TOOL_CALLS][...]; generic: tools described in the system turn, for "
                        "templates without tool support; auto: read from the chat template)")
    add_limit_arguments(parser)


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    engine_args = EngineArgs.from_cli_args(args)
    if args.model_tag is not None:
        if args.model != DEFAULT_MODEL and args.model != args.model_tag:
            raise ServerConfigError(f"two models given: {args.model_tag!r} and --model "
                                    f"{args.model!r}; give one")
        engine_args.model = args.model_tag
    return ServerConfig(
        engine_args=engine_args,
        host=args.host,
        port=args.port,
        served_model_names=list(args.served_model_name or []),
        api_key=_api_key(args.api_key),
        max_request_body_bytes=args.max_request_body_bytes,
        drain_timeout=args.drain_timeout,
        limits=limits_from_args(args),
        tool_call_parser=args.tool_call_parser,
        health_port=args.health_port,
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
        forwarded_allow_ips=parse_allow_ips(args.forwarded_allow_ips),
        forwarded_header=args.forwarded_header,
        otlp_traces_endpoint=args.otlp_traces_endpoint,
        web_ui=not args.disable_web_ui,
        stream_keepalive_interval=args.stream_keepalive_interval,
        engine_stall_timeout=args.engine_stall_timeout,
    )


def _api_key(keys: list[str] | None) -> str | list[str] | None:
    if keys is None:  # the environment's: one key, or several separated by commas
        keys = [key.strip() for key in os.environ.get(API_KEY_ENV, "").split(",")
                if key.strip()] or None
    if keys is None:
        return None
    return keys[0] if len(keys) == 1 else keys


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    from pagedserve.server.engine.parallel.rendezvous import launched_rank

    if launched_rank():  # a rank > 0 under torchrun serves rank 0's steps, not HTTP
        from pagedserve.server.engine.parallel.worker import run_launched_worker

        return run_launched_worker()
    try:
        config = config_from_args(args)
    except ValueError as exc:  # ServerConfigError, or an engine argument out of range
        _fail(str(exc))
        return EXIT_BAD_CONFIG
    return _run_event_loop(serve(config, access_log=not args.disable_access_log,
                                 freeze_heap=True))


def freeze_startup_heap() -> float:
    """Takes every object alive after start-up (the imported modules, the model, the engine:
    about 200,000 objects for the embedded model) out of the collector's view; returns the
    seconds it took. Python runs a full collection whenever enough objects have survived since
    the last one, so a long-running server meets one now and then, and it would walk them all
    with the GIL held (0.11-0.18 s measured here), stalling the engine and every stream.
    Objects made later are collected as before. For a process that serves one engine (vLLM's
    engine core does the same). No collection runs first: at this point one found 25
    unreachable objects and took as long as the walk it saves, in the start-up's path."""
    start = time.perf_counter()
    gc.freeze()
    return time.perf_counter() - start


async def serve(config: ServerConfig, access_log: bool = True, freeze_heap: bool = False) -> int:
    """Runs until SIGTERM/SIGINT, then drains; returns the exit status. ``freeze_heap``
    (the CLI's choice) hides the start-up heap from the garbage collector once serving."""
    app = create_app(config)
    runner = make_runner(app) if access_log else make_runner(app, access_log=None)
    stop = _stop_on_signals()  # before loading: a signal during the load ends it cleanly
    try:
        await runner.setup()  # loads the model and starts the engine
    except (ValueError, PagedServeError) as exc:
        return _fail(f"cannot start the engine: {exc}")
    try:
        sites = [(make_site(runner, config.host, config.port), config.port)]
        if config.health_port is not None:
            sites.append((make_health_site(runner, config.host, config.health_port),
                          config.health_port))
        for site, port in sites:
            try:
                await site.start()
            except OSError as exc:
                return _fail(f"cannot listen on {config.host}:{port}: {exc}")
        if stop.is_set():
            return EXIT_OK
        urls = sites[0][0].urls
        health_urls = [url for site, _ in sites[1:] for url in site.urls]
        for line in startup_lines(app[ENGINE_KEY].engine, config, urls, health_urls):
            logger.info("%s", line)
        if freeze_heap:
            seconds = freeze_startup_heap()
            logger.info("start-up heap frozen: %s objects out of the garbage collector's "
                        "view (%.2f s)", f"{gc.get_freeze_count():,}", seconds)
        for url in urls:
            # A line on stdout that launchers (and tests, with --port 0) can wait for.
            print(f"pagedserve: serving on {url}", flush=True)
        for url in health_urls:
            print(f"pagedserve: health and metrics on {url}", flush=True)
        if await _stopped_or_failed(app, stop):
            finished = await drain(app, config.drain_timeout)
            logger.info("drained %s", "cleanly" if finished else "after aborting stragglers")
        else:
            await settle_after_failure(app, _FAILURE_GRACE_S)
    finally:
        await runner.cleanup()
    failure = engine_failure(app)
    if failure is not None:
        logger.error("exiting with status %d: the engine failed (%r); a supervisor should "
                     "restart the server", EXIT_ENGINE_FAILED, failure)
        return EXIT_ENGINE_FAILED
    return EXIT_OK


async def _stopped_or_failed(app: web.Application, stop: asyncio.Event) -> bool:
    """Waits for a signal (True) or an engine failure (False), whichever comes first."""
    signalled = asyncio.ensure_future(stop.wait())
    failed = asyncio.ensure_future(wait_engine_failure(app))
    await asyncio.wait({signalled, failed}, return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    failed.cancel()
    return engine_failure(app) is None


def _fail(message: str) -> int:
    print(f"pagedserve serve: {message}", file=sys.stderr)
    return EXIT_START_FAILED


def _stop_on_signals() -> asyncio.Event:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


def _run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:  # uvloop does not exist on Windows
        return asyncio.run(main)
    return uvloop.run(main)
