"""``TokenBudget``: how much work may be in flight against one server.

A request reserves ``prompt_tokens + n × max_tokens`` before it is sent and settles when it
ends: the whole reservation returns to the budget at once, and the per-minute token rate is
corrected to the tokens really used (a request that failed is refunded in full). The budget
also caps concurrent requests and, optionally, requests and tokens per minute.

``capacity`` may move (the adaptive controller resizes it); ``hard_limit`` does not, and a
request larger than it fails at once with ``BudgetExceededError``. A request larger than the
current capacity but within the hard limit is admitted once nothing else is in flight, so a
shrunken budget slows large requests down without locking them out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from pagedserve.client.api.client_errors import BudgetExceededError
from pagedserve.client.budget.admission_queue import AdmissionQueue
from pagedserve.client.budget.rate_limit import RateLimiter


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")


class Reservation:
    """Tokens held in a budget by one request until ``settle``."""

    __slots__ = ("budget", "settled", "tokens")

    def __init__(self, budget: TokenBudget, tokens: int) -> None:
        self.budget = budget
        self.tokens = tokens
        self.settled = False

    def settle(self, used_tokens: int | None = None) -> None:
        """Return the reservation; ``used_tokens`` is the request's real usage, None when it
        failed. Settling twice does nothing."""
        if not self.settled:
            self.settled = True
            self.budget._release(self, used_tokens)

    def __enter__(self) -> Reservation:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.settle(None)


class TokenBudget:
    def __init__(
        self,
        max_tokens: int,
        *,
        max_concurrency: int | None = None,
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
        hard_limit: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        _positive("max_tokens", max_tokens)
        _positive("max_concurrency", max_concurrency)
        _positive("hard_limit", hard_limit)
        self.capacity = int(max_tokens)
        self.hard_limit = max(self.capacity, int(hard_limit or 0))
        self.max_concurrency = max_concurrency
        self._clock = clock
        now = clock()
        self._rpm = RateLimiter(requests_per_minute, now) if requests_per_minute else None
        self._tpm = RateLimiter(tokens_per_minute, now) if tokens_per_minute else None
        self.tokens_per_minute = tokens_per_minute
        self.in_flight_tokens = 0
        self.in_flight_requests = 0
        self._listeners: list[Callable[[], None]] = []
        self._queue: AdmissionQueue[Reservation] = AdmissionQueue(
            self.try_acquire_or_delay, lambda r: r.settle(None)
        )
        self._listeners.append(self._queue.wake)

    @property
    def free_tokens(self) -> int:
        """Capacity not reserved; negative after the capacity shrank below what is held."""
        return self.capacity - self.in_flight_tokens

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` whenever capacity frees up (a release, a resize)."""
        self._listeners.append(listener)

    def check_fits(self, tokens: int) -> None:
        """Raise ``BudgetExceededError`` if ``tokens`` could never be admitted."""
        if tokens > self.hard_limit:
            raise BudgetExceededError(tokens, self.hard_limit)
        if self.tokens_per_minute is not None and tokens > self.tokens_per_minute:
            limit = int(self.tokens_per_minute)
            raise BudgetExceededError(tokens, limit, "tokens-per-minute limit")

    def admission_delay(self, tokens: int) -> float | None:
        """0 when ``tokens`` may be reserved now; seconds to wait when only a rate limit holds
        it back; None when it must wait for in-flight work to finish."""
        if self.max_concurrency is not None and self.in_flight_requests >= self.max_concurrency:
            return None
        if self.in_flight_requests and self.in_flight_tokens + tokens > self.capacity:
            return None
        now = self._clock()
        delay = 0.0
        if self._rpm is not None:
            delay = self._rpm.wait_time(1, now)
        if self._tpm is not None:
            delay = max(delay, self._tpm.wait_time(tokens, now))
        return delay

    def try_acquire(self, tokens: int) -> Reservation | None:
        """Reserve ``tokens`` now if the budget allows, ignoring anyone waiting."""
        self.check_fits(tokens)
        return self.try_acquire_or_delay(tokens)[0]

    def try_acquire_or_delay(self, tokens: int) -> tuple[Reservation | None, float | None]:
        """A reservation, or why not: see ``admission_delay``. The caller has already made
        sure with ``check_fits`` that ``tokens`` can ever fit."""
        delay = self.admission_delay(tokens)
        if delay != 0.0:
            return None, delay
        now = self._clock()
        if self._rpm is not None:
            self._rpm.take(1, now)
        if self._tpm is not None:
            self._tpm.take(tokens, now)
        self.in_flight_tokens += tokens
        self.in_flight_requests += 1
        return Reservation(self, tokens), None

    async def acquire(self, tokens: int) -> Reservation:
        """Wait, in arrival order, until ``tokens`` may be reserved."""
        self.check_fits(tokens)
        return await self._queue.wait(tokens)

    def resize(self, capacity: int) -> None:
        """Set the in-flight token capacity, within ``1..hard_limit``."""
        self.capacity = max(1, min(int(capacity), self.hard_limit))
        self._notify()

    def _release(self, reservation: Reservation, used_tokens: int | None) -> None:
        self.in_flight_tokens -= reservation.tokens
        self.in_flight_requests -= 1
        if self._tpm is not None:
            used = 0 if used_tokens is None else used_tokens
            now = self._clock()
            if used < reservation.tokens:
                self._tpm.give_back(reservation.tokens - used, now)
            else:
                self._tpm.take(used - reservation.tokens, now)
        self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()
