"""Several replicas of one model behind one fair waiting line.

Each endpoint has its own client and its own ``TokenBudget`` (and, in adaptive mode, its own
controller: replicas fill up independently). A request goes to the endpoint with the most
free budget among those that can admit it now. An endpoint whose request failed in a way
worth retrying cools down, for the server's ``Retry-After`` when it named one and otherwise
for an exponential backoff, and takes no new work meanwhile; the failed work is retried on
whichever endpoint is free.

An adaptive endpoint is also watched: while it has work in flight the pool reads its
``GET /load`` whenever ``load_poll_s`` passed without an answer bringing the same hints, so its
controller sees the server's step time and KV headroom several times a second, not only when
an answer comes back (a long answer can take many seconds), and a server answering many
requests a second is not asked for more. Between endpoints that can both admit a request, an
adaptive one with more of its window free is preferred: each replica's controller sized that
window from what the replica itself publishes, so a small replica gets a small share.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType

from pagedserve.client.adaptive.adaptive_budget import AdaptiveBudget
from pagedserve.client.api.client import AsyncClient
from pagedserve.client.api.client_errors import (
    APIError,
    APIStatusError,
    BudgetExceededError,
    RateLimitError,
)
from pagedserve.client.api.retry import RetryPolicy, retry_after_seconds
from pagedserve.client.budget.admission_queue import AdmissionQueue
from pagedserve.client.budget.token_budget import Reservation, TokenBudget
from pagedserve.common.load_hints import LoadHints

DEFAULT_LOAD_POLL_S = 0.05


@dataclass(slots=True, eq=False)
class Endpoint:
    client: AsyncClient
    budget: TokenBudget
    adaptive: AdaptiveBudget | None = None
    available_at: float = 0.0  # clock time until which the endpoint cools down
    consecutive_failures: int = 0
    succeeded: int = 0
    failed: int = 0

    @property
    def name(self) -> str:
        return self.client.base_url


@dataclass(slots=True, frozen=True)
class Grant:
    """An endpoint chosen for one attempt, with the tokens reserved there."""

    endpoint: Endpoint
    reservation: Reservation
    epoch: int  # the adaptive controller's epoch when the attempt was admitted
    sent_at: float = 0.0  # the pool's clock when the attempt was admitted


class EndpointPool:
    def __init__(
        self,
        endpoints: Sequence[Endpoint],
        *,
        cooldown: RetryPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        load_poll_s: float | None = DEFAULT_LOAD_POLL_S,
    ) -> None:
        """``load_poll_s`` None turns the ``GET /load`` watch off (hints then come only with
        answers)."""
        if not endpoints:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self.endpoints = list(endpoints)
        self.cooldown = cooldown or RetryPolicy()
        self._clock = clock
        self.load_poll_s = load_poll_s
        self._watchers: list[asyncio.Task[None]] = []
        self._queue: AdmissionQueue[Grant] = AdmissionQueue(
            self._try_grant, lambda grant: grant.reservation.settle(None)
        )
        for endpoint in self.endpoints:
            endpoint.budget.add_listener(self._queue.wake)

    async def __aenter__(self) -> EndpointPool:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        for endpoint in self.endpoints:
            await endpoint.client.close()

    @property
    def in_flight_tokens(self) -> int:
        return sum(e.budget.in_flight_tokens for e in self.endpoints)

    def next_ticket(self) -> int:
        return self._queue.next_ticket()

    def check_fits(self, tokens: int) -> None:
        """Raise ``BudgetExceededError`` unless some endpoint could ever admit ``tokens``."""
        errors: list[BudgetExceededError] = []
        for endpoint in self.endpoints:
            try:
                endpoint.budget.check_fits(tokens)
                return
            except BudgetExceededError as exc:
                errors.append(exc)
        raise max(errors, key=lambda e: e.limit)

    async def acquire(self, tokens: int, ticket: int | None = None) -> Grant:
        """Wait in ticket order for an endpoint that admits ``tokens``."""
        self.check_fits(tokens)
        if not self._watchers and self.load_poll_s is not None:
            self._watchers = [asyncio.create_task(self._watch(e))
                              for e in self.endpoints if e.adaptive is not None]
        return await self._queue.wait(tokens, ticket)

    async def _watch(self, endpoint: Endpoint) -> None:
        """Feed ``GET /load`` to the endpoint's controller while it has work in flight."""
        assert endpoint.adaptive is not None and self.load_poll_s is not None
        while True:
            await asyncio.sleep(self.load_poll_s)
            now = self._clock()
            if endpoint.budget.in_flight_requests == 0 or now < endpoint.available_at:
                continue
            if now - endpoint.adaptive.observed_at < self.load_poll_s:
                continue  # answers brought hints of their own since the last poll
            with contextlib.suppress(APIError):
                response = await endpoint.client.request_json("GET", "/load")
                hints = LoadHints.from_json(response.data)
                if hints is not None:
                    endpoint.adaptive.observe(hints, self._clock())

    def _try_grant(self, tokens: int) -> tuple[Grant | None, float | None]:
        now = self._clock()
        best: Endpoint | None = None
        soonest: float | None = None
        for endpoint in self.endpoints:
            budget = endpoint.budget
            if tokens > budget.hard_limit:
                continue
            delay = max(0.0, endpoint.available_at - now)
            if delay == 0.0:
                admission = budget.admission_delay(tokens)
                if admission is None:
                    continue
                delay = admission
            if delay > 0.0:
                soonest = delay if soonest is None else min(soonest, delay)
            elif best is None or _preferred(endpoint, best):
                best = endpoint
        if best is None:
            return None, soonest
        reservation, _ = best.budget.try_acquire_or_delay(tokens)
        if reservation is None:  # the budget said yes a moment ago, in this same call
            raise RuntimeError(f"endpoint {best.name} refused {tokens} tokens it had admitted")
        epoch = best.adaptive.epoch if best.adaptive is not None else 0
        return Grant(best, reservation, epoch, now), None

    def report_success(
        self,
        grant: Grant,
        used_tokens: int | None,
        hints: LoadHints | None,
        completion_tokens: int | None = None,
    ) -> None:
        """Settle a successful attempt and feed its load hints (and, for a latency target,
        its timing) to the controller."""
        endpoint = grant.endpoint
        endpoint.consecutive_failures = 0
        endpoint.succeeded += 1
        grant.reservation.settle(used_tokens)
        if endpoint.adaptive is not None:
            endpoint.adaptive.on_success(
                grant.epoch, grant.reservation.tokens, hints, now=self._clock(),
                sent_at=grant.sent_at, completion_tokens=completion_tokens,
                used_tokens=used_tokens)

    def report_failure(self, grant: Grant, error: BaseException, retryable: bool) -> None:
        """Settle a failed attempt; a retryable failure cools its endpoint down."""
        endpoint = grant.endpoint
        endpoint.failed += 1
        grant.reservation.settle(None)
        if isinstance(error, RateLimitError) and endpoint.adaptive is not None:
            endpoint.adaptive.on_rate_limited(grant.epoch, self._clock())
        if retryable:
            self._cool_down(endpoint, error)

    def _cool_down(self, endpoint: Endpoint, error: BaseException) -> None:
        hinted = None
        if isinstance(error, APIStatusError):
            hinted = retry_after_seconds(error.headers)
        if hinted is not None and hinted <= self.cooldown.max_retry_after:
            delay = hinted
        else:
            delay = self.cooldown.backoff(endpoint.consecutive_failures)
        endpoint.consecutive_failures += 1
        endpoint.available_at = max(endpoint.available_at, self._clock() + delay)
        self._queue.wake()  # re-plan: waiters may now need a timer for the cooldown's end


def _window_headroom(endpoint: Endpoint) -> float | None:
    """The free share of an adaptive endpoint's window; None for a fixed budget."""
    limit = endpoint.budget.max_concurrency
    if endpoint.adaptive is None or not limit:
        return None
    return (limit - endpoint.budget.in_flight_requests) / limit


def _preferred(candidate: Endpoint, current: Endpoint) -> bool:
    """More of an adaptive window free first; then more free tokens, then fewer requests in
    flight; ties keep list order."""
    a, b = candidate.budget, current.budget
    room_a, room_b = _window_headroom(candidate), _window_headroom(current)
    if room_a is not None and room_b is not None and room_a != room_b:
        return room_a > room_b
    if a.free_tokens != b.free_tokens:
        return a.free_tokens > b.free_tokens
    return a.in_flight_requests < b.in_flight_requests
