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

from pagedserve.client.adaptive.adaptive_budget import AdaptiveBudget, AdaptiveConfig, plan_budget
from pagedserve.client.api.client import AsyncClient, Timeout
from pagedserve.client.api.client_errors import APIError
from pagedserve.client.api.retry import RetryPolicy
from pagedserve.client.api.types import ServerLoad
from pagedserve.client.batch.pool import Endpoint, EndpointPool
from pagedserve.client.budget.token_budget import TokenBudget

FALLBACK_INFLIGHT_TOKENS = 32_768
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(slots=True)
class PoolConfig:
    """Where a batch goes and how much of it may be in flight at once.

    ``base_urls`` is a list of server URLs (root or ``.../v1``), one per replica of the same
    model. Every limit applies per endpoint: each replica has its own capacity.

    The token budget. Each request *reserves* tokens on the endpoint it is sent to before it
    goes out, and gives them back when its answer arrives:

        reservation = prompt tokens + n × max_tokens

    per prompt, where ``n`` is the larger of ``n`` and ``best_of`` (beams for beam search)
    and the prompt is counted with tiktoken's cl100k_base or the server's ``/tokenize``
    (``RunOptions.counter``). ``max_completion_tokens`` counts as ``max_tokens``, and so does
    ``max_output_tokens`` on ``/v1/responses``. A request without ``max_tokens`` reserves
    OpenAI's default of 16 on ``/v1/completions``, and on ``/v1/chat/completions`` and
    ``/v1/responses`` the rest of the model's context (``max_model_len`` − prompt) when the
    server reports it, else 1024. A request is sent only when its reservation fits
    in the endpoint's free budget, so the server never holds more than
    ``max_inflight_tokens`` of worst-case work from this client; a request larger than the
    whole budget fails at once with ``BudgetExceededError`` instead of waiting forever.

    ``max_inflight_tokens``: a fixed number of tokens per endpoint, or ``"auto"`` (the
    default). With ``"auto"`` each endpoint is asked for ``GET /load`` at start: a
    pagedserve server answers with its KV cache size, the budget starts there and then
    adapts to the load hints the server sends with every answer, growing while its KV
    cache has room and its queue is short, and shrinking on a 429, on preemptions or when
    requests start to queue. A server without ``/load`` (vLLM, OpenAI, or one that is down
    at start) gets a fixed ``fallback_inflight_tokens`` (32,768) that only a 429 lowers.

    ``max_concurrency`` caps requests in flight per endpoint on top of the tokens;
    ``requests_per_minute`` and ``tokens_per_minute`` are rate limits per endpoint (a request
    is charged its reservation, corrected to the tokens it really used when it ends);
    ``timeout`` bounds each request; ``cooldown`` is the backoff an endpoint waits after a
    failure worth retrying. ``api_key`` is sent as a bearer token (None: $OPENAI_API_KEY).
    """

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
        if isinstance(self.base_urls, str | bytes):
            raise TypeError(
                "base_urls must be a list of URLs, got the string "
                f"{self.base_urls!r}; write base_urls=[{self.base_urls!r}]"
            )
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
