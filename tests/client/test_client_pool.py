from __future__ import annotations

import asyncio

import pytest

from pagedserve.client import (
    AsyncClient,
    BudgetExceededError,
    Endpoint,
    EndpointPool,
    RetryPolicy,
    TokenBudget,
)
from pagedserve.client.api.client_errors import APIConnectionError, make_status_error


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def endpoint(i: int, tokens: int, hard_limit: int | None = None) -> Endpoint:
    budget = TokenBudget(tokens, hard_limit=hard_limit)
    return Endpoint(AsyncClient(f"http://replica{i}:8000"), budget)


async def test_routes_to_the_most_free_budget():
    pool = EndpointPool([endpoint(0, 100), endpoint(1, 200)])
    names = []
    for tokens in (50, 120, 60, 20):
        grant = await pool.acquire(tokens)
        names.append((grant.endpoint.name, grant.endpoint.budget.free_tokens))
    # free before each: (100, 200) -> r1; (100, 150) and 120 > r0's whole budget -> r1;
    # (100, 30) -> r0; (40, 30) -> r0
    assert names == [
        ("http://replica1:8000", 150),
        ("http://replica1:8000", 30),
        ("http://replica0:8000", 40),
        ("http://replica0:8000", 20),
    ]
    assert pool.in_flight_tokens == 250


async def test_ties_go_to_fewer_requests_then_list_order():
    pool = EndpointPool([endpoint(0, 100), endpoint(1, 100)])
    a = await pool.acquire(10)
    b = await pool.acquire(10)
    assert (a.endpoint.name, b.endpoint.name) == ("http://replica0:8000", "http://replica1:8000")


async def test_failed_endpoint_cools_down_for_retry_after():
    clock = FakeClock()
    pool = EndpointPool([endpoint(0, 1000), endpoint(1, 100)], clock=clock)
    grant = await pool.acquire(10)
    assert grant.endpoint.name == "http://replica0:8000"
    error = make_status_error(503, {}, {"Retry-After": "5"})
    pool.report_failure(grant, error, retryable=True)
    assert grant.reservation.settled and grant.endpoint.available_at == 5.0
    assert (await pool.acquire(10)).endpoint.name == "http://replica1:8000"
    clock.now = 5.0
    assert (await pool.acquire(10)).endpoint.name == "http://replica0:8000"


async def test_cooldown_without_retry_after_backs_off_exponentially():
    clock = FakeClock()
    policy = RetryPolicy(initial_backoff=1.0, max_backoff=8.0, jitter=0.0)
    pool = EndpointPool([endpoint(0, 1000)], clock=clock, cooldown=policy)
    ends = []
    for _ in range(3):
        grant = pool._try_grant(1)[0]
        pool.report_failure(grant, APIConnectionError("down"), retryable=True)
        ends.append(pool.endpoints[0].available_at)
        clock.now = ends[-1]
    assert ends == [1.0, 3.0, 7.0]
    pool.report_success(pool._try_grant(1)[0], 1, None)
    assert pool.endpoints[0].consecutive_failures == 0


async def test_non_retryable_failure_does_not_cool_down():
    pool = EndpointPool([endpoint(0, 1000)])
    grant = await pool.acquire(1)
    pool.report_failure(grant, make_status_error(400, {}, {}), retryable=False)
    assert pool.endpoints[0].available_at == 0.0
    assert pool.endpoints[0].failed == 1


async def test_waiters_resume_when_the_cooldown_ends():
    pool = EndpointPool([endpoint(0, 1000)])
    grant = await pool.acquire(1)
    pool.report_failure(grant, make_status_error(429, {}, {"retry-after-ms": "50"}), True)
    assert pool._try_grant(1) == (None, pytest.approx(0.05, abs=0.01))
    later = await asyncio.wait_for(pool.acquire(1), timeout=5)
    assert later.endpoint is pool.endpoints[0]


async def test_size_checks_across_endpoints():
    pool = EndpointPool([endpoint(0, 100), endpoint(1, 300)])
    grant = await pool.acquire(200)
    assert grant.endpoint.name == "http://replica1:8000"
    with pytest.raises(BudgetExceededError) as info:
        await pool.acquire(301)
    assert str(info.value) == "request needs 301 tokens but the in-flight token budget is 300"


def test_empty_pool_is_rejected():
    with pytest.raises(ValueError) as info:
        EndpointPool([])
    assert str(info.value) == "an endpoint pool needs at least one endpoint"
