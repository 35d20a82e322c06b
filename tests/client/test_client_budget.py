from __future__ import annotations

import asyncio

import pytest

from pagedserve.client import BudgetExceededError, TokenBudget
from pagedserve.client.budget.rate_limit import RateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _started(coro) -> asyncio.Task:
    task = asyncio.ensure_future(coro)
    await asyncio.sleep(0)
    return task


async def test_admits_up_to_capacity_and_releases_at_once():
    budget = TokenBudget(100)
    a = await budget.acquire(40)
    b = await budget.acquire(60)
    assert (budget.in_flight_tokens, budget.free_tokens) == (100, 0)
    waiting = await _started(budget.acquire(1))
    assert not waiting.done()
    a.settle(used_tokens=12)  # the whole reservation comes back, whatever was used
    c = await waiting
    assert (budget.in_flight_tokens, budget.in_flight_requests) == (61, 2)
    for r in (b, c, c):
        r.settle()
    assert (budget.in_flight_tokens, budget.in_flight_requests) == (0, 0)


async def test_too_large_request_fails_at_once():
    budget = TokenBudget(100)
    with pytest.raises(BudgetExceededError) as info:
        await budget.acquire(101)
    assert str(info.value) == "request needs 101 tokens but the in-flight token budget is 100"
    assert (info.value.tokens, info.value.limit) == (101, 100)


async def test_too_large_for_tokens_per_minute():
    budget = TokenBudget(1000, tokens_per_minute=500)
    with pytest.raises(BudgetExceededError) as info:
        await budget.acquire(600)
    assert str(info.value) == "request needs 600 tokens but the tokens-per-minute limit is 500"


async def test_large_request_is_not_starved_by_small_ones():
    budget = TokenBudget(100)
    held = await budget.acquire(60)
    large = await _started(budget.acquire(80))
    smalls = [await _started(budget.acquire(10)) for _ in range(4)]
    # Each small one would fit next to the 60 held, but the large one came first.
    assert not large.done() and not any(s.done() for s in smalls)
    held.settle()
    await asyncio.sleep(0)
    assert large.done()
    assert [s.done() for s in smalls] == [True, True, False, False]
    large.result().settle()
    await asyncio.sleep(0)
    assert all(s.done() for s in smalls)


async def test_max_concurrency():
    budget = TokenBudget(1000, max_concurrency=2)
    first, _ = await budget.acquire(1), await budget.acquire(1)
    third = await _started(budget.acquire(1))
    assert not third.done() and budget.admission_delay(1) is None
    first.settle()
    await third
    assert budget.in_flight_requests == 2


async def test_resize_and_a_large_request_running_alone():
    budget = TokenBudget(100, hard_limit=400)
    big = await budget.acquire(300)  # above capacity, within the hard limit: runs alone
    small = await _started(budget.acquire(1))
    assert not small.done()
    big.settle()
    await small
    budget.resize(1000)
    assert budget.capacity == 400
    budget.resize(0)
    assert budget.capacity == 1
    with pytest.raises(BudgetExceededError):
        await budget.acquire(401)


async def test_cancelled_waiter_leaves_the_line():
    budget = TokenBudget(100)
    held = await budget.acquire(100)
    first = await _started(budget.acquire(50))
    second = await _started(budget.acquire(50))
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    held.settle()
    reservation = await second
    assert (budget.in_flight_tokens, reservation.tokens) == (50, 50)


async def test_grant_to_a_cancelled_waiter_is_given_back():
    budget = TokenBudget(100)
    held = await budget.acquire(100)
    waiter = await _started(budget.acquire(30))
    held.settle()  # grants the waiter; it is cancelled before it runs
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert waiter.cancelled()
    assert (budget.in_flight_tokens, budget.in_flight_requests) == (0, 0)


def test_rate_limiter_arithmetic():
    limiter = RateLimiter(per_minute=60, now=0.0)  # one a second, burst of one
    assert limiter.wait_time(1, 0.0) == 0.0
    limiter.take(1, 0.0)
    assert limiter.wait_time(1, 0.0) == 1.0
    assert limiter.wait_time(1, 0.25) == 0.75
    big = RateLimiter(per_minute=600, now=0.0)  # ten a second, burst of ten
    big.take(25, 0.0)  # larger than the burst: allowed from a full bucket, into debt
    assert big.wait_time(5, 0.0) == 2.0  # from -15 up to 5 at 10/s
    big.give_back(100, 0.0)
    assert big.level == 10.0
    with pytest.raises(ValueError) as info:
        RateLimiter(per_minute=0, now=0.0)
    assert str(info.value) == "rate must be a positive number per minute, got 0"


def test_requests_per_minute_paces_admission():
    clock = FakeClock()
    budget = TokenBudget(1000, requests_per_minute=120, clock=clock)  # 2/s, burst of 2
    assert budget.try_acquire(1) is not None
    assert budget.try_acquire(1) is not None
    assert budget.try_acquire(1) is None
    assert budget.admission_delay(1) == 0.5
    clock.now += 0.5
    assert budget.try_acquire(1) is not None


def test_tokens_per_minute_is_settled_to_real_usage():
    clock = FakeClock()
    budget = TokenBudget(1000, tokens_per_minute=600, clock=clock)  # 10 tokens/s, burst 10
    reservation = budget.try_acquire(10)
    assert budget.admission_delay(6) == 0.6
    reservation.settle(used_tokens=4)  # 6 tokens reserved but never used come back
    assert budget.admission_delay(6) == 0.0
    assert budget.admission_delay(7) == pytest.approx(0.1)
    failed = budget.try_acquire(6)
    failed.settle(None)  # a failed request is refunded in full
    assert budget.admission_delay(6) == 0.0


async def test_rate_limited_waiters_are_woken_by_a_timer():
    budget = TokenBudget(1000, requests_per_minute=6000)  # 100/s, burst of 100
    order: list[int] = []

    async def one(i: int) -> None:
        (await budget.acquire(1)).settle(1)
        order.append(i)

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(105))), timeout=10)
    assert order == list(range(105))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be positive, got 0"),
        ({"max_tokens": 10, "max_concurrency": 0}, "max_concurrency must be positive, got 0"),
        ({"max_tokens": 10, "hard_limit": -5}, "hard_limit must be positive, got -5"),
    ],
)
def test_budget_rejects_bad_limits(kwargs, message):
    with pytest.raises(ValueError) as info:
        TokenBudget(**kwargs)
    assert str(info.value) == message
