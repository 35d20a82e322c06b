"""One batch through a pool of replicas and what it measured (``cotuning.py``): the workload
shapes, the requests of a run, per-POST latency and in-flight samples, preemptions, and one
configuration's rounds merged into one result."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from pagedserve.client import (
    AdaptiveConfig,
    AsyncClient,
    BatchRequest,
    BatchRunner,
    PoolConfig,
    build_pool,
)
from pagedserve.client.adaptive.adaptive_plan import DEFAULT_INITIAL_CONCURRENCY
from pagedserve.client.api.client_errors import APIStatusError
from pagedserve.loadgen.lengths import LengthDistribution

VOCAB = 8192
SHOTS, SHOT_TOKENS = 5, 64
VERBOSE = False
AUTOS = ("auto", "cold")  # the adaptive configurations: warm (the default) and cold start


@dataclass(frozen=True)
class Shape:
    name: str
    requests: int
    input: LengthDistribution
    output: LengthDistribution
    prefix_tokens: int = 0


SHAPES = {
    "sharegpt": Shape("sharegpt", 200, LengthDistribution(80.0, 0.8, 4, 512),
                      LengthDistribution(170.0, 0.8, 4, 512)),
    "alpaca": Shape("alpaca", 640, LengthDistribution(19.0, 0.6, 2, 128),
                    LengthDistribution(58.0, 0.8, 2, 256)),
    "prefix": Shape("prefix", 480, LengthDistribution(24.0, 0.5, 4, 96),
                    LengthDistribution(48.0, 0.6, 4, 192), prefix_tokens=SHOTS * SHOT_TOKENS),
}


@dataclass
class RunResult:
    budget: str
    wall_s: float
    completion_tokens: int
    errors: int
    p50_ms: float
    p99_ms: float
    preemptions: int
    rate_limited: int
    mean_inflight_tokens: float
    mean_inflight_requests: float
    # CPU seconds of this benchmark's own process (the client) during the run; runs made at
    # the same time each count all of it.
    client_cpu_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.wall_s


def make_requests(shape: Shape, model: str, seed: int, salt: int) -> list[BatchRequest]:
    """The shape's lengths come from ``seed`` (the same in every run); token ids from ``salt``
    (fresh per run, so no run hits another's prompts in the prefix cache)."""
    lengths = np.random.default_rng(seed)
    inputs = shape.input.sample(lengths, shape.requests)
    outputs = shape.output.sample(lengths, shape.requests)
    prefix = np.random.default_rng(seed + 1).integers(1, VOCAB, shape.prefix_tokens).tolist()
    tokens = np.random.default_rng(salt)
    return [
        BatchRequest(f"{shape.name}-{i}", "completions", {
            "model": model,
            "prompt": prefix + tokens.integers(1, VOCAB, int(n_in)).tolist(),
            "max_tokens": int(n_out), "ignore_eos": True, "temperature": 0.0,
        })
        for i, (n_in, n_out) in enumerate(zip(inputs, outputs, strict=True))
    ]


class Recorder:
    """Times every POST of a pool's clients and samples what the pool holds in flight."""

    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.rate_limited = 0
        self.samples: list[tuple[int, int]] = []

    def wrap(self, client: AsyncClient) -> None:
        original = client.request_json

        async def timed(method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                response = await original(method, path, *args, **kwargs)
            except APIStatusError as exc:
                self.rate_limited += exc.status_code == 429
                raise
            if method == "POST":
                self.latencies_ms.append((time.perf_counter() - start) * 1000.0)
            return response

        client.request_json = timed  # type: ignore[method-assign]

    async def sample(self, pool: Any, every_s: float = 0.1) -> None:
        while True:
            budgets = [e.budget for e in pool.endpoints]
            self.samples.append((sum(b.in_flight_tokens for b in budgets),
                                 sum(b.in_flight_requests for b in budgets)))
            await asyncio.sleep(every_s)


async def total_preemptions(urls: list[str]) -> int:
    total = 0
    for url in urls:
        async with AsyncClient(url, max_retries=2) as client:
            load = await client.load()
        total += load.num_preemptions if load is not None else 0
    return total


async def run_once(urls: list[str], budget: int | str, requests: list[BatchRequest],
                   label: str | None = None) -> RunResult:
    before = await total_preemptions(urls)
    recorder = Recorder()
    if budget == "cold":  # auto, started as on a server that has measured nothing yet
        config = PoolConfig(base_urls=urls, max_inflight_tokens="auto", adaptive=AdaptiveConfig(
            initial_concurrency=DEFAULT_INITIAL_CONCURRENCY))
    else:
        config = PoolConfig(base_urls=urls, max_inflight_tokens=budget)
    async with await build_pool(config) as pool:
        for endpoint in pool.endpoints:
            recorder.wrap(endpoint.client)
        sampler = asyncio.create_task(recorder.sample(pool))
        start, cpu_start = time.perf_counter(), time.process_time()
        results = await BatchRunner(pool).run(requests)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        sampler.cancel()
        if VERBOSE and budget in AUTOS:
            for endpoint in pool.endpoints:
                if endpoint.adaptive is not None:
                    print(f"    {endpoint.name}: {list(endpoint.adaptive.history)}")
            print(f"    requests in flight, each second: {[s[1] for s in recorder.samples[::10]]}")
    after = await total_preemptions(urls)
    ok = [r for r in results if r.ok]
    lat = np.array(recorder.latencies_ms or [0.0])
    busy = [s for s in recorder.samples if s[1] > 0] or [(0, 0)]
    return RunResult(
        budget=label or str(budget), wall_s=wall,
        completion_tokens=sum(r.usage.completion_tokens for r in ok if r.usage),
        errors=len(results) - len(ok), p50_ms=float(np.percentile(lat, 50)),
        p99_ms=float(np.percentile(lat, 99)), preemptions=after - before,
        rate_limited=recorder.rate_limited,
        mean_inflight_tokens=float(np.mean([s[0] for s in busy])),
        mean_inflight_requests=float(np.mean([s[1] for s in busy])),
        client_cpu_s=cpu,
    )


def print_row(r: RunResult) -> None:
    print(f"  {r.budget:>8}  {r.tokens_per_s:8.1f} tok/s  p50 {r.p50_ms:8.0f} ms  "
          f"p99 {r.p99_ms:8.0f} ms  preempt {r.preemptions:4d}  429s {r.rate_limited:3d}  "
          f"errors {r.errors}  in flight {r.mean_inflight_tokens:7.0f} tok "
          f"/ {r.mean_inflight_requests:5.1f} req  client CPU {r.client_cpu_s / r.wall_s:4.0%}",
          flush=True)


def merge(runs: list[RunResult]) -> RunResult:
    """One configuration's rounds as one result: throughput over the summed wall time,
    latency percentiles and in-flight means averaged, counts summed."""
    return RunResult(
        budget=runs[0].budget,
        wall_s=sum(r.wall_s for r in runs),
        completion_tokens=sum(r.completion_tokens for r in runs),
        errors=sum(r.errors for r in runs),
        p50_ms=float(np.mean([r.p50_ms for r in runs])),
        p99_ms=float(np.mean([r.p99_ms for r in runs])),
        preemptions=sum(r.preemptions for r in runs),
        rate_limited=sum(r.rate_limited for r in runs),
        mean_inflight_tokens=float(np.mean([r.mean_inflight_tokens for r in runs])),
        mean_inflight_requests=float(np.mean([r.mean_inflight_requests for r in runs])),
        client_cpu_s=sum(r.client_cpu_s for r in runs),
    )


def rounds(configs: list[Any], count: int) -> list[Any]:
    """Forward, then backward, and so on: a drift in the machine's load over the run hits
    every configuration about equally."""
    order: list[Any] = []
    for i in range(count):
        order += configs if i % 2 == 0 else configs[::-1]
    return order
