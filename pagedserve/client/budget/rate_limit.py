"""A per-minute rate limit as a token bucket that may go into debt.

The bucket refills at ``per_minute / 60`` units a second up to ``burst`` (one second's worth
by default, so work is paced rather than released in minute-sized bursts). A cost that fits
the burst waits until the bucket holds it; a larger cost waits for a full bucket and then
leaves the bucket in debt, so the long-run rate still holds and nothing waits forever.
Time is passed in, which keeps the arithmetic testable without sleeping.
"""

from __future__ import annotations

import math


class RateLimiter:
    def __init__(self, per_minute: float, now: float, burst: float | None = None) -> None:
        if not (math.isfinite(per_minute) and per_minute > 0):
            raise ValueError(f"rate must be a positive number per minute, got {per_minute!r}")
        self.per_second = per_minute / 60.0
        self.burst = burst if burst is not None else max(1.0, self.per_second)
        if self.burst <= 0:
            raise ValueError(f"burst must be positive, got {self.burst!r}")
        self.level = self.burst
        self._updated = now

    def _refill(self, now: float) -> None:
        if now > self._updated:
            self.level = min(self.burst, self.level + (now - self._updated) * self.per_second)
            self._updated = now

    def wait_time(self, cost: float, now: float) -> float:
        """Seconds from ``now`` until ``cost`` may be taken; 0 when it may be taken now."""
        self._refill(now)
        need = min(cost, self.burst)
        return 0.0 if self.level >= need else (need - self.level) / self.per_second

    def take(self, cost: float, now: float) -> None:
        self._refill(now)
        self.level -= cost

    def give_back(self, amount: float, now: float) -> None:
        """Return units charged but not used (a request that used fewer tokens)."""
        self._refill(now)
        self.level = min(self.burst, self.level + amount)
