"""``pagedserve batch INPUT.jsonl OUTPUT.jsonl --base-url URL ...``

Runs every request of INPUT against one or more OpenAI-compatible servers under a budget of
in-flight tokens and appends one result line per request to OUTPUT, in the OpenAI Batch
API's output format. Rerunning the same command finishes the job: requests that already
succeeded are not sent again, and those that failed are retried (--no-retry-failed keeps
their failures). Exit status: 0 when every item has a successful result, 1 while some have
none (the summary says how many; see OUTPUT), 2 for bad input or arguments, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

from pagedserve.client.adaptive.adaptive_budget import AdaptiveConfig
from pagedserve.client.adaptive.latency_target import LatencyTarget
from pagedserve.client.api.client import Timeout
from pagedserve.client.api.client_errors import APIError
from pagedserve.client.batch.items import BatchSummary
from pagedserve.client.batch.jobs import RunOptions, run_batch_file
from pagedserve.client.batch.pool_config import FALLBACK_INFLIGHT_TOKENS, PoolConfig
from pagedserve.client.batch.runner import DEFAULT_MAX_ATTEMPTS, DEFAULT_NUM_WORKERS

N = TypeVar("N", int, float)


def _positive(value: str, parse: Callable[[str], N], expected: str) -> N:
    try:
        number: N | None = parse(value)
    except ValueError:
        number = None
    # ``not > 0`` rather than ``<= 0`` so that a NaN float is refused too.
    if number is None or not number > 0:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value!r}")
    return number


def _inflight_tokens(value: str) -> int | Literal["auto"]:
    return "auto" if value == "auto" else _positive(value, int, "'auto' or a positive integer")


def _positive_int(value: str) -> int:
    return _positive(value, int, "a positive integer")


def _positive_float(value: str) -> float:
    return _positive(value, float, "a positive number")


def split_base_urls(values: list[str]) -> list[str]:
    """``--base-url`` values, each possibly a comma-separated list, flattened in order."""
    return [url.strip() for value in values for url in value.split(",") if url.strip()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.split("\n\n")[1] if __doc__ else None
    parser.add_argument("input", help="JSONL requests (OpenAI batch lines or {id, ...body})")
    parser.add_argument("output", help="JSONL results; appended to, and resumed from")
    parser.add_argument(
        "--base-url",
        action="append",
        required=True,
        help="server root or .../v1; repeat it or give a comma list for replicas",
    )
    parser.add_argument("--otlp-traces-endpoint", default=None, metavar="URL",
                        help="export a CLIENT span per request to this OTLP/HTTP endpoint and "
                        "send its traceparent to the server (default: no tracing)")
    parser.add_argument("--endpoint", choices=["chat", "completions", "responses"], default=None,
                        help="endpoint for lines without a url (default: inferred per line)")
    parser.add_argument("--model", default=None,
                        help="model for bodies without one (default: the server's first)")
    parser.add_argument("--max-inflight-tokens", type=_inflight_tokens, default="auto",
                        help="tokens in flight per endpoint, or 'auto' to follow the server's "
                        f"load hints (fixed {FALLBACK_INFLIGHT_TOKENS} without them)")
    parser.add_argument("--max-concurrency", type=_positive_int, default=None,
                        help="requests in flight per endpoint")
    parser.add_argument("--rpm", type=_positive_float, default=None,
                        help="requests per minute per endpoint")
    parser.add_argument("--tpm", type=_positive_float, default=None,
                        help="tokens per minute per endpoint")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument("--token-counter", choices=["tiktoken", "server"], default="tiktoken",
                        help="count prompts with tiktoken cl100k_base or the server's /tokenize")
    parser.add_argument("--workers", type=_positive_int, default=DEFAULT_NUM_WORKERS,
                        help="worker tasks; the budget, not this, limits the load")
    parser.add_argument("--max-attempts", type=_positive_int, default=DEFAULT_MAX_ATTEMPTS,
                        help="requests sent per item before its failure is final")
    parser.add_argument("--timeout", type=_positive_float, default=600.0,
                        help="seconds allowed for one request")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("--target-tpot-ms", type=_positive_float, default=None,
                        help="with auto: keep time per output token under this (ms)")
    target.add_argument("--target-ttft-ms", type=_positive_float, default=None,
                        help="with auto: keep time to first token under this (ms)")
    parser.add_argument("--target-percentile", type=_positive_float, default=90.0,
                        help="the percentile the latency target holds for (default 90)")
    parser.add_argument("--retry-failed", action=argparse.BooleanOptionalAction, default=True,
                        help="on a rerun into the same OUTPUT, send again the items whose "
                        "earlier result is a failure and replace that line "
                        "(default: %(default)s; --no-retry-failed keeps the failures)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("--fsync", action="store_true",
                        help="fsync after every result line (survives power loss, slower)")


def latency_target(args: argparse.Namespace) -> LatencyTarget | None:
    if args.target_tpot_ms is not None:
        return LatencyTarget("tpot", args.target_tpot_ms, args.target_percentile)
    if args.target_ttft_ms is not None:
        return LatencyTarget("ttft", args.target_ttft_ms, args.target_percentile)
    return None


def configs_from_args(args: argparse.Namespace) -> tuple[PoolConfig, RunOptions]:
    pool = PoolConfig(
        base_urls=split_base_urls(args.base_url),
        api_key=args.api_key,
        max_inflight_tokens=args.max_inflight_tokens,
        max_concurrency=args.max_concurrency,
        requests_per_minute=args.rpm,
        tokens_per_minute=args.tpm,
        timeout=Timeout(total=args.timeout),
        adaptive=AdaptiveConfig(target=latency_target(args)),
    )
    options = RunOptions(
        counter=args.token_counter,
        num_workers=args.workers,
        max_attempts=args.max_attempts,
        progress=not args.no_progress and sys.stderr.isatty(),
        fsync=args.fsync,
    )
    return pool, options


def _run_loop(coroutine: Coroutine[Any, Any, BatchSummary]) -> BatchSummary:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def _start_tracing(endpoint: str | None) -> Callable[[], None]:
    """Installs the global tracer provider the client's spans use; returns its shutdown."""
    if endpoint is None:
        return lambda: None
    from opentelemetry import trace

    from pagedserve.common import otel

    provider = otel.tracer_provider("pagedserve-client", endpoint)
    trace.set_tracer_provider(provider)
    return provider.shutdown


def run(args: argparse.Namespace) -> int:
    stop_tracing = _start_tracing(args.otlp_traces_endpoint)
    try:
        pool, options = configs_from_args(args)
        summary = _run_loop(
            run_batch_file(
                args.input,
                args.output,
                pool,
                options,
                default_kind=args.endpoint,
                model=args.model,
                retry_failed=args.retry_failed,
            )
        )
    except (ValueError, OSError) as exc:  # BatchInputError, bad limits, unreadable files
        print(f"pagedserve batch: {exc}", file=sys.stderr)
        return 2
    except APIError as exc:
        print(f"pagedserve batch: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("pagedserve batch: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    finally:
        stop_tracing()
    print(summary.describe(), file=sys.stderr)
    return 0 if summary.unresolved == 0 else 1
