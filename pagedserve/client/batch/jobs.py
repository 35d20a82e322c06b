"""Whole jobs in one call: ``run_batch`` (requests in memory, results in input order) and
``run_batch_file`` (JSONL to JSONL, resumable)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pagedserve.client.api.client import AsyncClient
from pagedserve.client.batch.batch_file import (
    ResultWriter,
    drop_results,
    iter_requests,
    load_previous_results,
    scan_input,
)
from pagedserve.client.batch.items import BatchRequest, BatchResult, BatchSummary
from pagedserve.client.batch.pool import EndpointPool
from pagedserve.client.batch.pool_config import PoolConfig, build_pool
from pagedserve.client.batch.runner import DEFAULT_MAX_ATTEMPTS, DEFAULT_NUM_WORKERS, BatchRunner
from pagedserve.client.budget.tokens import (
    CallableCounter,
    EndpointKind,
    ServerTokenCounter,
    TiktokenCounter,
    TokenCounter,
)

CounterFn = Callable[[EndpointKind, Mapping[str, Any]], int | Awaitable[int]]
CounterSpec = Literal["tiktoken", "server"] | TokenCounter | CounterFn


@dataclass(slots=True)
class RunOptions:
    """How the runner works, apart from where it sends requests (``PoolConfig``)."""

    counter: CounterSpec = "tiktoken"
    num_workers: int = DEFAULT_NUM_WORKERS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    progress: bool = False
    fsync: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # more BatchRunner keyword arguments


def _counter(
    spec: CounterSpec, pool_config: PoolConfig
) -> tuple[TokenCounter, AsyncClient | None]:
    """The counter, and the client it owns (to be closed) when it asks a server."""
    if spec == "tiktoken":
        return TiktokenCounter(), None
    if spec == "server":
        client = AsyncClient(
            pool_config.base_urls[0], pool_config.api_key, timeout=pool_config.timeout
        )
        return ServerTokenCounter(client), client
    if isinstance(spec, TokenCounter):
        return spec, None
    if callable(spec):
        return CallableCounter(spec), None
    raise ValueError(
        f"counter must be 'tiktoken', 'server', a TokenCounter or a function, got {spec!r}"
    )


async def _drive(
    pool_config: PoolConfig,
    options: RunOptions,
    requests: Iterable[BatchRequest] | AsyncIterable[BatchRequest],
    **runner_args: Any,
) -> tuple[list[BatchResult], BatchSummary]:
    counter, counter_client = _counter(options.counter, pool_config)
    pool: EndpointPool | None = None
    try:
        pool = await build_pool(pool_config)
        runner = BatchRunner(
            pool,
            counter=counter,
            num_workers=options.num_workers,
            max_attempts=options.max_attempts,
            progress=options.progress,
            **options.extra,
            **runner_args,
        )
        # With a result sink (the JSONL writer) nothing needs keeping or ordering here.
        keep = runner_args.get("on_result") is None
        results: list[BatchResult] = []
        async with contextlib.aclosing(runner.results(requests, ordered=keep)) as stream:
            async for result in stream:
                if keep:
                    results.append(result)
        return results, runner.summary
    finally:
        if pool is not None:
            await pool.close()
        if counter_client is not None:
            await counter_client.close()


async def run_batch(
    requests: Iterable[BatchRequest] | AsyncIterable[BatchRequest],
    pool_config: PoolConfig,
    options: RunOptions | None = None,
) -> tuple[list[BatchResult], BatchSummary]:
    """Every request through the pool; results in input order, failures included.

    ``requests`` are ``BatchRequest(custom_id, kind, body)`` with ``kind`` "completions" or
    "chat"; ``pool_config`` names the servers and the limits, ``options`` how the work is done
    (token counter, retries, progress bar). Nothing raises for one item's failure: each
    ``BatchResult`` has ``ok``, the response body or an ``error``, and the summary counts.

    How much is in flight: every request reserves ``prompt tokens + n × max_tokens`` (per
    prompt; ``n`` is the larger of ``n`` and ``best_of``) on the endpoint it goes to, and is
    sent only when that fits the endpoint's free budget. Without ``max_tokens`` a
    completion reserves 16 (OpenAI's default) and a chat request the rest of the model's
    context when the server reports ``max_model_len``, else 1024. ``max_inflight_tokens=
    "auto"`` (the default) starts each pagedserve endpoint's budget at its KV cache size,
    read from ``GET /load``, and adapts it to the server's load hints; other servers get a
    fixed 32,768 tokens that a 429 lowers. See ``help(PoolConfig)`` for every limit.

    Example::

        requests = [BatchRequest(f"q{i}", "chat", {"model": "tiny", "max_tokens": 64,
                    "messages": [{"role": "user", "content": q}]}) for i, q in enumerate(qs)]
        results, summary = await run_batch(
            requests, PoolConfig(["http://127.0.0.1:8000"], max_inflight_tokens="auto"))
    """
    return await _drive(pool_config, options or RunOptions(), requests)


async def _default_model(pool_config: PoolConfig) -> str | None:
    async with AsyncClient(pool_config.base_urls[0], pool_config.api_key) as client:
        models = await client.models.list()
    return models.data[0].id if models.data else None


async def run_batch_file(
    input_path: str | Path,
    output_path: str | Path,
    pool_config: PoolConfig,
    options: RunOptions | None = None,
    *,
    default_kind: EndpointKind | None = None,
    model: str | None = None,
    retry_failed: bool = True,
) -> BatchSummary:
    """Run the JSONL ``input_path`` into ``output_path``, skipping ids already done there.

    Every line is validated before the first request. Bodies without a model get ``model``,
    or else the first model the first endpoint lists. Interrupting (Ctrl-C, a cancelled task,
    a crash) loses nothing: rerun with the same arguments to finish. A rerun also sends again
    every item whose earlier result is a failure, replacing that result line, unless
    ``retry_failed`` is False; ``summary.unresolved`` counts the items still without a
    successful result either way.
    """
    source, target = Path(input_path), Path(output_path)
    options = options or RunOptions()
    previous = load_previous_results(target)
    if retry_failed:
        drop_results(target, previous.failed)
        done = previous.succeeded
    else:
        done = previous.succeeded | previous.failed
    scan = scan_input(source, done, default_kind, model, failed=previous.failed)
    if scan.without_model and model is None:
        model = await _default_model(pool_config)
    with ResultWriter(target, fsync=options.fsync) as writer:
        _, summary = await _drive(
            pool_config,
            options,
            iter_requests(source, done, default_kind, model),
            on_result=writer.write,
            total=scan.remaining,
        )
    summary.skipped = scan.total - scan.remaining
    summary.previously_failed = scan.kept_failures
    return summary
