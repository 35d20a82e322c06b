"""``pagedserve router``: the gateway in front of replicas, until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from pagedserve.common.http.forwarded import parse_allow_ips
from pagedserve.router.router_config import POLICIES, RouterConfig

# The variable the servers read their API key from; the router sends it to them for /load.
API_KEY_ENV = "PAGEDSERVE_API_KEY"


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
                        help="seconds a replica may stay silent on a request that is not "
                        "streamed (its whole generation) before it counts as failed")
    parser.add_argument("--stream-idle-timeout", type=float, default=30.0,
                        help="seconds a replica may stay silent on a streamed request, before "
                        "its first byte and between chunks (pagedserve replicas, asked by "
                        "the router, send a keep-alive comment every 10 s through long "
                        "prefills): before the "
                        "first byte the request is retried elsewhere, after it the client "
                        "gets an error event and [DONE]; either counts toward ejection")
    parser.add_argument("--failures-to-eject", type=int, default=2,
                        help="failures in a row (a 5xx, a reset, a timeout, a stalled or cut "
                        "stream) that take a replica out of rotation until /health answers "
                        "200; one that cannot be connected to is out at once")
    parser.add_argument("--replica-api-key", default=None, metavar="KEY",
                        help="the bearer token the replicas require, for the router's own "
                        f"GET /load (requests carry their clients' own); None: the first of "
                        f"${API_KEY_ENV}'s comma-separated keys, if set")
    g = parser.add_argument_group("the router's own front (as the server's)")
    g.add_argument("--health-port", type=int, default=None,
                   help="a second port that serves only /health and /metrics, outside the "
                   "connection caps (for orchestrators' probes)")
    g.add_argument("--max-connections", type=int, default=4096,
                   help="open connections; more are answered 503 and closed (a few more are "
                   "kept for /health and /metrics)")
    g.add_argument("--max-connections-per-client", type=int, default=1024,
                   help="open connections from one source address (a trusted proxy's are "
                   "bounded by --max-connections only); more are answered 429")
    g.add_argument("--max-requests-per-client", type=int, default=512,
                   help="requests in flight from one client: its address, or the one a "
                   "trusted proxy names; more are answered 429")
    g.add_argument("--forwarded-allow-ips", default=None, metavar="IPS",
                   help="comma list of the proxies in front of the router (addresses, CIDR "
                   "networks, '*') whose X-Forwarded-For names the client; from any other "
                   "peer the header is dropped and the peer is the client. Replicas get the "
                   "client appended to X-Forwarded-For: give them --forwarded-allow-ips with "
                   "the router's address")
    g.add_argument("--timeout-header-read", type=float, default=10.0,
                   help="seconds a new connection gets to send its first request's headers")
    g.add_argument("--timeout-body-read", type=float, default=60.0,
                   help="seconds a request gets to send its body (more: 408)")
    g.add_argument("--timeout-keep-alive", type=float, default=5.0,
                   help="seconds an idle connection stays open after a response")
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
        stream_idle_timeout=args.stream_idle_timeout,
        failures_to_eject=args.failures_to_eject,
        replica_api_key=args.replica_api_key or _first_key(os.environ.get(API_KEY_ENV, "")),
        health_port=args.health_port, max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
        max_requests_per_client=args.max_requests_per_client,
        forwarded_allow_ips=parse_allow_ips(args.forwarded_allow_ips),
        timeout_header_read=args.timeout_header_read,
        timeout_body_read=args.timeout_body_read,
        timeout_keep_alive=args.timeout_keep_alive,
        otlp_traces_endpoint=args.otlp_traces_endpoint, web_ui=not args.disable_web_ui)


def _first_key(keys: str) -> str | None:
    return next((key.strip() for key in keys.split(",") if key.strip()), None)


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
    from pagedserve.router.app import create_app, make_health_site, make_runner, make_site
    from pagedserve.router.tracing import tracing_for

    runner = make_runner(create_app(config, tracing_for(config, "pagedserve-router")),
                         access_log=None)
    await runner.setup()
    try:
        site = make_site(runner, config.host, config.port)
        await site.start()
        host, port = runner.addresses[0][:2]
        if config.health_port is not None:
            await make_health_site(runner, config.host, config.health_port).start()
            print(f"pagedserve: /health and /metrics also on "
                  f"http://{config.host}:{config.health_port}", flush=True)
        print(f"pagedserve: routing on http://{host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
    return 0
