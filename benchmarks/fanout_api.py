"""Part 2 of ``client_fanout.py``: the batch runner against an API-like server (see there)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.api_like_server import ApiLikeServer
from pagedserve.client import AsyncClient, BatchRequest, BatchRunner, PoolConfig, build_pool
from pagedserve.client.api.client_errors import APIError


@dataclass
class ApiResult:
    requests: int
    wall_s: float
    tokens: int  # prompt + completion tokens of the answered requests
    failed: int
    lost: int
    rate_limited: int  # 429s the server sent

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def api_requests(count: int) -> list[BatchRequest]:
    """Deterministic token-id prompts of 40 to 119 tokens asking for 20 to 79 tokens."""
    return [
        BatchRequest(f"api-{i}", "completions", {
            "model": "api-like",
            "prompt": [(i * 31 + j) % 50_000 + 1 for j in range(40 + (i * 37) % 80)],
            "max_tokens": 20 + (i * 13) % 60,
        })
        for i in range(count)
    ]


async def sequential(server: ApiLikeServer, requests: list[BatchRequest]) -> ApiResult:
    before = server.rate_limited
    tokens = failed = 0
    start = time.perf_counter()
    async with AsyncClient(server.base_url, max_retries=6) as client:
        for request in requests:
            try:
                answer = await client.completions.create(**request.body)
            except APIError:
                failed += 1
                continue
            tokens += answer.usage.total_tokens if answer.usage else 0
    wall = time.perf_counter() - start
    return ApiResult(len(requests), wall, tokens, failed, 0, server.rate_limited - before)


async def through_runner(server: ApiLikeServer, requests: list[BatchRequest],
                         tell_tpm: bool) -> ApiResult:
    before = server.rate_limited
    config = PoolConfig(base_urls=[server.base_url], max_inflight_tokens="auto",
                        tokens_per_minute=server.tokens_per_minute if tell_tpm else None)
    start = time.perf_counter()
    async with await build_pool(config) as pool:
        results = await BatchRunner(pool, max_attempts=20).run(requests)
    wall = time.perf_counter() - start
    answers = Counter(r.custom_id for r in results)
    return ApiResult(
        requests=len(requests), wall_s=wall,
        tokens=sum(r.usage.total_tokens for r in results if r.ok and r.usage),
        failed=sum(not r.ok for r in results),
        lost=sum(answers[q.custom_id] != 1 for q in requests),
        rate_limited=server.rate_limited - before,
    )


def tpm_share(server: ApiLikeServer, result: ApiResult) -> float:
    """Tokens sent over the most the limit admits in the run's wall time (burst included)."""
    admissible = server.tokens_per_minute / 60.0 * result.wall_s + server.burst_tokens
    return result.tokens / admissible


async def run_api(latency_s: float, tpm: float, count: int, sequential_count: int
                  ) -> dict[str, Any]:
    requests = api_requests(count)
    with ApiLikeServer(latency_s, tpm) as server:
        print(f"API-like server: {latency_s * 1000:.0f} ms a request, {tpm:.0f} tokens/min",
              flush=True)
        runs = {"sequential": await sequential(server, requests[:sequential_count])}
        runs["runner_tpm"] = await through_runner(server, requests, tell_tpm=True)
        runs["runner_429"] = await through_runner(server, requests, tell_tpm=False)
        base = runs["sequential"].tokens_per_s
        for name, r in runs.items():
            print(f"{name:>13}: {r.requests:5d} requests {r.wall_s:7.2f} s "
                  f"{r.tokens_per_s:8.0f} tok/s  x{r.tokens_per_s / base:5.1f}  "
                  f"TPM share {tpm_share(server, r):5.2f}  429s {r.rate_limited:4d}  "
                  f"failed {r.failed}  lost {r.lost}", flush=True)
        headline = runs["runner_tpm"]
        return {
            "latency_s": latency_s,
            "tokens_per_minute": tpm,
            "runs": {k: {**asdict(v), "tokens_per_s": v.tokens_per_s,
                         "tpm_share": tpm_share(server, v)} for k, v in runs.items()},
            "speedup_vs_sequential": headline.tokens_per_s / base,
            "tpm_share": tpm_share(server, headline),
            "failed": headline.failed,
            "lost": headline.lost,
            "speedup_vs_sequential_429_only": runs["runner_429"].tokens_per_s / base,
            "tpm_share_429_only": tpm_share(server, runs["runner_429"]),
        }
