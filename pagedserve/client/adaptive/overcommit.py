"""When the adaptive budget may reserve more tokens than the server's KV cache holds.

A reservation counts every prompt token and ``max_tokens``, so reserving at most the cache
never preempts, but it overstates what the cache will hold: answers that stop well short of
``max_tokens``; answers in flight, half written on average; prompts sharing a cached prefix.
``Overcommit`` gathers that evidence from finished answers and from the load hints, and
names how far the token capacity may grow now: towards what would bring the cache to
``kv_usage_low``, a quarter at most per request round trip (the cache fills as answers grow,
and a batch's first answers, all young at once, hold little for a while), or up to a
doubling where the cache has held under ``SHARED_PREFIX_SHARE`` of the reservations for a
whole round trip (a shared prefix, which the answers' growth hardly changes).

A server that publishes the peak its held work will need (``kv_projected_usage``: every
request run to ``max_tokens``, blocks given back as requests end, a shared prefix counted
once) needs no such evidence: ``projected_capacity`` names the capacity at once.
"""

from __future__ import annotations

from pagedserve.client.adaptive.adaptive_plan import KV_SAFE_SHARE
from pagedserve.common.load_hints import LoadHints

GROWTH = 1.25
MAX_GROWTH = 2.0
EARLY_STOP_SHARE = 0.6  # answers using less than this of their reservation, on average
KV_SHARE = 0.7  # a cache holding less than this of what is reserved is overstated
SHARED_PREFIX_SHARE = 0.4
MIN_FINISHED = 8  # answers seen before reservations may be judged against real use
SMOOTHING = 0.1
# The share of the KV cache the server's projected peak may come to: the projection is an
# upper bound (every request held runs to max_tokens).
PROJECTED_TARGET = 0.95


def projection_fits(hints: LoadHints) -> bool:
    """Whether the server projects the work it holds to fit under ``PROJECTED_TARGET``."""
    return hints.kv_projected_usage is not None and (
        hints.kv_projected_usage <= PROJECTED_TARGET)


def projected_capacity(hints: LoadHints, in_flight_tokens: int, in_flight_requests: int,
                       kv_tokens: int) -> float | None:
    """The reserved tokens the server's projection allows: what it has seen of ours plus
    the room its projected peak leaves under target, less where the peak is over it (our
    reservations then lower to let it come back). Requests on their way (ours in flight
    past what it runs and queues) are not in its projection yet and count at our mean
    reservation. Never under ``KV_SAFE_SHARE`` of the cache, which no reservation can
    overfill. None without a projection."""
    if hints.kv_projected_usage is None:
        return None
    unseen = max(0, in_flight_requests - hints.num_running - hints.num_waiting)
    seen = in_flight_tokens - unseen * in_flight_tokens / max(1, in_flight_requests)
    room = (PROJECTED_TARGET - hints.kv_projected_usage) * kv_tokens
    return max(KV_SAFE_SHARE * kv_tokens, seen + room)


class Overcommit:
    """Evidence that reservations overstate the cache, and the growth it allows."""

    def __init__(self, interval_s: float, kv_usage_low: float, now: float = 0.0) -> None:
        self.interval_s = interval_s
        self.kv_usage_low = kv_usage_low
        self.used_share = 1.0  # smoothed used / reserved tokens of finished requests
        self.finished = 0
        self.round_trip_s = interval_s  # smoothed time from send to answer
        self._next_growth = now
        self._low_since: float | None = None  # the cache under SHARED_PREFIX_SHARE since

    def on_answer(self, tokens: int, used_tokens: int | None, now: float | None,
                  sent_at: float | None) -> None:
        """A request holding ``tokens`` finished, having used ``used_tokens``."""
        self.finished += 1
        if used_tokens is not None and tokens > 0:
            self.used_share += SMOOTHING * (min(1.0, used_tokens / tokens) - self.used_share)
        if now is not None and sent_at is not None:
            self.round_trip_s += SMOOTHING * (now - sent_at - self.round_trip_s)

    def growth(self, kv_per_reserved: float, kv_peak: float, tokens_full: bool,
               now: float) -> float | None:
        """The factor the capacity may grow by now, or None: ``kv_per_reserved`` is the most
        KV held per reserved token over the last interval, ``kv_peak`` the highest KV usage,
        ``tokens_full`` whether the reservations bound."""
        if kv_per_reserved >= SHARED_PREFIX_SHARE:
            self._low_since = None
        elif self._low_since is None:
            self._low_since = now
        if now < self._next_growth or self.finished < MIN_FINISHED:
            return None
        overstated = self.used_share < EARLY_STOP_SHARE or kv_per_reserved < KV_SHARE
        if not (overstated and tokens_full and kv_peak < self.kv_usage_low):
            return None
        self._next_growth = now + max(self.interval_s, self.round_trip_s)
        # The cache fills about in proportion to what is reserved.
        towards = self.kv_usage_low / max(kv_peak, 1e-3)
        low_for = now - self._low_since if self._low_since is not None else 0.0
        return min(MAX_GROWTH if low_for >= self.round_trip_s else GROWTH, towards)
