"""``pagedserve router``: the gateway in front of replicas, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from aiohttp import web

from pagedserve.router.router_config import POLICIES, RouterConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replica", action="append", default=[], metavar="URL",
                        help="a replica's base URL (repeat for each)")
    parser.add_argument("--replica-dns", metavar="HOST:PORT",
                        help="a name resolving to every replica, re-resolved periodically "
                        "(a Kubernetes headless service)")
    parser.add_argument("--policy", choices=POLICIES, default="prefix")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--prefix-blocks", type=int, default=4,
                        help="leading blocks of the prompt that make the prefix key")
    parser.add_argument("--block-chars", type=int, default=64,
                        help="characters per block when hashing a text prompt")
    parser.add_argument("--block-size", type=int, default=16,
                        help="token ids per block when hashing a token-id prompt (the "
                        "replicas' --block-size)")
    parser.add_argument("--load-factor", type=float, default=1.25,
                        help="bounded load: most in-flight requests per replica, as a "
                        "multiple of the mean")
    parser.add_argument("--spill-threshold", type=int, default=8,
                        help="bounded load spares a replica until it holds this many requests "
                        "more than the least loaded one")
    parser.add_argument("--prefix-load-factor", type=float, default=1.0,
                        help="bounded load on new prefixes: most recent prefixes per replica, "
                        "as a multiple of the mean (1.0: as even as the count allows)")
    parser.add_argument("--max-tracked-prefixes", type=int, default=65536,
                        help="recent prefixes whose replica the router remembers")
    parser.add_argument("--max-waiting", type=int, default=4,
                        help="a replica with this many requests waiting is saturated")
    parser.add_argument("--max-kv-usage", type=float, default=0.95,
                        help="a replica using this share of its KV cache is saturated")
    parser.add_argument("--health-interval", type=float, default=2.0)
    parser.add_argument("--max-attempts", type=int, default=3,
                        help="replicas one request may try before the router answers 502")
    parser.add_argument("--max-in-flight", type=int, default=1024)
    parser.add_argument("--max-request-body-bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--upstream-timeout", type=float, default=600.0,
                        help="seconds a replica may stay silent before it counts as failed")
    parser.add_argument("--otlp-traces-endpoint", metavar="URL",
                        help="export OpenTelemetry traces to this OTLP endpoint (off without)")
    parser.add_argument("--disable-web-ui", action="store_true",
                        help="serve no page at / and no state at /router/state")


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    return RouterConfig(
        replicas=args.replica, replica_dns=args.replica_dns, policy=args.policy,
        host=args.host, port=args.port, prefix_blocks=args.prefix_blocks,
        block_chars=args.block_chars, block_size=args.block_size,
        load_factor=args.load_factor, spill_threshold=args.spill_threshold,
        prefix_load_factor=args.prefix_load_factor,
        max_tracked_prefixes=args.max_tracked_prefixes,
        max_waiting=args.max_waiting,
        max_kv_usage=args.max_kv_usage, health_interval=args.health_interval,
        max_attempts=args.max_attempts, max_in_flight=args.max_in_flight,
        max_request_body_bytes=args.max_request_body_bytes,
        upstream_timeout=args.upstream_timeout,
        otlp_traces_endpoint=args.otlp_traces_endpoint, web_ui=not args.disable_web_ui)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"pagedserve router: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop
    except ImportError:  # Windows
        return asyncio.run(_serve(config))
    return uvloop.run(_serve(config))


async def _serve(config: RouterConfig) -> int:
    from pagedserve.router.app import create_app, make_runner
    from pagedserve.router.tracing import tracing_for

    runner = make_runner(create_app(config, tracing_for(config, "pagedserve-router")),
                         access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        print(f"pagedserve: routing on http://{host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0
