"""Building an ``EndpointPool`` from base URLs and limits, fixed or adaptive.

With ``max_inflight_tokens="auto"`` each endpoint is asked for ``GET /load``: a pagedserve
server answers with its KV capacity and batch limits, and the budget starts there and adapts;
any other server (or one that is down at start) gets a fixed ``fallback_inflight_tokens``
that only 429s can lower.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from pagedserve.client.adaptive import AdaptiveBudget, AdaptiveConfig, plan_budget
from pagedserve.client.budget import TokenBudget
from pagedserve.client.client import AsyncClient, Timeout
from pagedserve.client.errors import APIError
from pagedserve.client.pool import Endpoint, EndpointPool
from pagedserve.client.retry import RetryPolicy
from pagedserve.client.types import ServerLoad

FALLBACK_INFLIGHT_TOKENS = 32_768
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(slots=True)
class PoolConfig:
    """Limits apply per endpoint: each replica has its own capacity."""

    base_urls: list[str]
    api_key: str | None = None
    max_inflight_tokens: int | Literal["auto"] = "auto"
    max_concurrency: int | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout: Timeout = field(default_factory=Timeout)
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    cooldown: RetryPolicy = field(default_factory=RetryPolicy)
    fallback_inflight_tokens: int = FALLBACK_INFLIGHT_TOKENS

    def __post_init__(self) -> None:
        if not self.base_urls:
            raise ValueError("at least one base URL is needed")
        limit = self.max_inflight_tokens
        if limit != "auto" and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"max_inflight_tokens must be 'auto' or at least 1, got {limit!r}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.fallback_inflight_tokens < 1:
            raise ValueError(
                f"fallback_inflight_tokens must be at least 1, got {self.fallback_inflight_tokens}"
            )


async def _probe_load(url: str, config: PoolConfig) -> ServerLoad | None:
    async with AsyncClient(url, config.api_key, timeout=config.timeout, max_retries=0) as probe:
        try:
            return await probe.load()
        except APIError:
            return None  # down or not pagedserve: start fixed; the cooldown handles "down"


def _client(url: str, config: PoolConfig, max_concurrency: int | None) -> AsyncClient:
    return AsyncClient(
        url,
        config.api_key,
        timeout=config.timeout,
        max_retries=0,  # the batch runner retries, possibly on another endpoint
        max_connections=max_concurrency or DEFAULT_MAX_CONNECTIONS,
    )


async def _build_endpoint(url: str, config: PoolConfig) -> Endpoint:
    rates = {
        "requests_per_minute": config.requests_per_minute,
        "tokens_per_minute": config.tokens_per_minute,
    }
    if config.max_inflight_tokens != "auto":
        budget = TokenBudget(
            config.max_inflight_tokens, max_concurrency=config.max_concurrency, **rates
        )
        return Endpoint(_client(url, config, config.max_concurrency), budget)
    load = await _probe_load(url, config)
    plan = plan_budget(
        config.adaptive, load, config.fallback_inflight_tokens, config.max_concurrency
    )
    budget = TokenBudget(
        plan.initial_tokens,
        max_concurrency=plan.max_concurrency,
        hard_limit=plan.max_tokens,
        **rates,
    )
    client = _client(url, config, plan.max_concurrency + 1)  # one more for GET /load
    adaptive = AdaptiveBudget(budget, plan, config.adaptive, now=time.monotonic())
    return Endpoint(client, budget, adaptive)


async def build_pool(config: PoolConfig) -> EndpointPool:
    """One endpoint per base URL; close the pool (``async with``) to close its sessions."""
    endpoints: list[Endpoint] = []
    try:
        for url in config.base_urls:
            endpoints.append(await _build_endpoint(url, config))
    except BaseException:
        for endpoint in endpoints:
            await endpoint.client.close()
        raise
    return EndpointPool(endpoints, cooldown=config.cooldown)
