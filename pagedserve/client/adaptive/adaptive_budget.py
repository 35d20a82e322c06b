"""Adaptive in-flight budget: run a server at its throughput peak, short of its memory limit.

Two limits move, per endpoint:

- the **window**, the requests in flight (``TokenBudget.max_concurrency``), is where the
  throughput is: ``PeakSearch`` (``peak_search.py``) names it from the step times the
  server publishes, starting where the server says it measured its best (``plan_budget``).
  Each growth waits until the server runs the new window and the curve has samples there.
  The curve takes only steady samples: none while the requests a growth let in still queue
  or prefill on the server (a burst of prefills makes slow steps that the running count's
  steady state lacks), nor for a few steps after (the server smooths its step time over its
  last few). In the start-up, the next doubling follows as soon as the curve has steady
  samples at the window, without waiting for the decision interval to end.
- the **token capacity** (``TokenBudget.capacity``) keeps KV memory safe: reservations count
  every prompt token and ``max_tokens``, so reserving at most the server's KV size can never
  preempt. The capacity grows past the KV size only on evidence that reservations overstate
  what the cache will hold (``Overcommit``), while the reservations bind and the cache stays
  under ``kv_usage_low``. Above ``kv_usage_high`` it shrinks back *before* the cache runs
  out. A server that publishes the peak its held work will need settles it at once
  (``projected_capacity``: requests on their way there count at their whole reservation);
  a usage above ``kv_usage_high`` is then no danger while that projection fits.

A rise in the server's preemption count or a 429 cuts the window by ``decrease_factor``, once
per interval (requests sent before a cut keep reporting the old congestion). With a
``LatencyTarget`` the window also stays under the cap of a ``LatencyGuard``. Without load hints
(another server) only 429s move the window, and successes grow it back by one request per
window's worth of answers, up to where it started.
"""

from __future__ import annotations

import logging
import math
from collections import deque

from pagedserve.client.adaptive.adaptive_plan import (
    KV_SAFE_SHARE,
    AdaptiveConfig,
    BudgetPlan,
    plan_budget,
)
from pagedserve.client.adaptive.hint_interval import HintInterval
from pagedserve.client.adaptive.latency_target import LatencyGuard, estimate_latency_ms
from pagedserve.client.adaptive.overcommit import Overcommit, projected_capacity, projection_fits
from pagedserve.client.adaptive.peak_search import REACHED, PeakSearch
from pagedserve.client.budget.token_budget import TokenBudget
from pagedserve.common.load_hints import LoadHints

__all__ = ["AdaptiveBudget", "AdaptiveConfig", "BudgetPlan", "plan_budget"]

logger = logging.getLogger(__name__)
_HISTORY = 1024
_KV_BACKOFF = 0.85
_SETTLE_STEPS = 8  # after a growth, steps before samples count again


class AdaptiveBudget:
    """Moves one ``TokenBudget``'s window and token capacity between the plan's bounds."""

    def __init__(
        self,
        budget: TokenBudget,
        plan: BudgetPlan,
        config: AdaptiveConfig,
        now: float = 0.0,
    ) -> None:
        self.budget = budget
        self.plan = plan
        self.config = config
        self.epoch = 0
        self.window = float(plan.initial_concurrency)
        self.kv_factor = budget.capacity / plan.kv_tokens if plan.kv_tokens else 1.0
        self.search = PeakSearch(config.memory_s, plan.max_concurrency, plan.waiting_high)
        self.latency = LatencyGuard(config.target) if config.target is not None else None
        self.history: deque[tuple[str, int, int]] = deque(maxlen=_HISTORY)
        self.history.append(("start", self.concurrency, budget.capacity))
        self._interval = HintInterval()
        self.observed_at = -math.inf  # when the latest load sample came
        self._next_decision = now + config.interval_s
        self._cut_until = -math.inf
        self._preemptions: int | None = None
        self.overcommit = Overcommit(config.interval_s, config.kv_usage_low, now)
        self._settle_until = now
        self._ramping = False  # the window grew and the server has yet to run what it let in
        self._startup_top_ready = False
        budget.max_concurrency = self.concurrency

    @property
    def capacity(self) -> int:
        return self.budget.capacity

    @property
    def concurrency(self) -> int:
        return max(1, int(self.window))

    # -- signals -------------------------------------------------------------------------

    def observe(self, hints: LoadHints, now: float) -> None:
        """A load sample (a response's headers or a ``GET /load``) taken at ``now``."""
        self.observed_at = now
        if self._steady(hints, now) and hints.step_ms is not None and self.search.observe(
                hints.num_running, hints.step_ms, now):
            self.history.append(("shift", self.concurrency, self.budget.capacity))
        budget = self.budget
        held = hints.kv_cache_usage * (self.plan.kv_tokens or 0)
        self._interval.add(
            hints,
            window_full=budget.in_flight_requests >= self.concurrency,
            tokens_full=budget.in_flight_tokens >= 0.85 * budget.capacity,
            kv_per_reserved=held / budget.in_flight_tokens if budget.in_flight_tokens else 0.0,
        )
        previous, self._preemptions = self._preemptions, hints.num_preemptions
        if previous is not None and hints.num_preemptions > previous:
            self._cut(now, "preemption")
        elif (hints.kv_cache_usage >= self.config.kv_usage_high
              and self.kv_factor > KV_SAFE_SHARE and not projection_fits(hints)):
            self._kv_backoff(hints, now)
        else:
            self._fill_projection(hints, now)
        if now >= self._next_decision or self._startup_can_grow(now):
            self._decide(now)

    def _steady(self, hints: LoadHints, now: float) -> bool:
        """Whether a sample says what its running count costs in a steady state: not while
        the requests a growth (of the window or the token capacity) let in still queue or
        prefill on the server, nor for an interval after. A burst of arrivals makes slower
        steps than that many running sequences make once the batch has mixed ages."""
        if self._ramping:
            if hints.num_running < REACHED * self.budget.in_flight_requests:
                return False
            self._ramping = False
            settle = self.config.interval_s
            if hints.step_ms is not None:
                # The server's step time is smoothed over its last few steps: a burst shows
                # for as many steps, however long each one takes.
                settle = _SETTLE_STEPS * hints.step_ms / 1000.0
            self._settle_until = now + settle
        return now >= self._settle_until

    def _startup_can_grow(self, now: float) -> bool:
        """In the start-up, whether the curve just got its first steady samples at the
        window: the start-up's next step needs no wait for the decision interval to end."""
        if not self.search.in_startup or self._ramping or now < self._settle_until:
            return False
        ready = self.search.top(now) >= REACHED * self.window
        fresh, self._startup_top_ready = ready and not self._startup_top_ready, ready
        return fresh

    def on_success(
        self,
        sent_epoch: int,
        tokens: int,
        hints: LoadHints | None,
        *,
        now: float | None = None,
        sent_at: float | None = None,
        completion_tokens: int | None = None,
        used_tokens: int | None = None,
    ) -> None:
        """A request sent in ``sent_epoch`` (at ``sent_at``) finished, holding ``tokens`` and
        using ``used_tokens``; ``hints`` came with its answer (None from servers that send
        none)."""
        self.overcommit.on_answer(tokens, used_tokens, now, sent_at)
        if hints is None:
            if sent_epoch == self.epoch and self.window < self.plan.initial_concurrency:
                self._set(self.window + 1.0 / max(self.window, 1.0), "increase")
            return
        if now is None:
            return
        if self.latency is not None and sent_at is not None and completion_tokens:
            metric = self.latency.target.metric
            self.latency.record(sent_at, estimate_latency_ms(
                metric, now - sent_at, completion_tokens, hints.step_ms))
        self.observe(hints, now)

    def on_rate_limited(self, sent_epoch: int, now: float | None = None) -> None:
        """The server answered 429 to a request sent in ``sent_epoch``."""
        if sent_epoch < self.epoch:
            return
        self._cut(now, "rate-limited", force=True)

    @property
    def target_unreachable(self) -> bool:
        return self.latency is not None and self.latency.unreachable

    # -- decisions -----------------------------------------------------------------------

    def _decide(self, now: float) -> None:
        interval, self._interval = self._interval, HintInterval()
        self._next_decision = now + self.config.interval_s
        if interval.samples == 0:
            return
        running = interval.running / interval.samples
        self._tune_tokens(interval, now)
        window, reason = self.search.window_for(self.window, interval, now)
        if reason == "shift":
            self.history.append(("shift", self.concurrency, self.budget.capacity))
        if self.latency is not None:
            was_unreachable = self.latency.unreachable
            self.latency.update(running, 1, now)
            if self.latency.unreachable and not was_unreachable:
                logger.warning("latency target cannot be met at any budget: %s with one "
                               "request in flight", self.latency.describe())
            if window > self.latency.cap:
                window, reason = self.latency.cap, "latency"
        if now >= self._cut_until or window < self.window:
            if int(window) != self.concurrency:
                self._ramping = int(window) > self.concurrency
            self._set(window, reason)

    def _tune_tokens(self, interval: HintInterval, now: float) -> None:
        """Grow the token capacity past the KV size where reservations overstate the cache
        (a server's projection, where it publishes one, says so better)."""
        if interval.projected:
            return
        growth = self.overcommit.growth(interval.kv_per_reserved, interval.kv_peak,
                                        interval.tokens_full, now)
        if growth is not None and self.plan.kv_tokens is not None:
            self._set_tokens(self.kv_factor * growth, "overcommit")

    def _fill_projection(self, hints: LoadHints, now: float) -> None:
        """Move the token capacity to what the server's projection allows: down at once
        when the projected peak is over target, up whenever it has room (requests the
        server has yet to receive count against the room, at their full reservation)."""
        if self.plan.kv_tokens is None or now < self._cut_until:
            return
        budget = self.budget
        tokens = projected_capacity(hints, budget.in_flight_tokens, budget.in_flight_requests,
                                    self.plan.kv_tokens)
        if tokens is None:
            return
        # A raise that lets no more requests in would only mark a growth (and pause the
        # curve's samples): raise by a mean reservation at least.
        step = budget.in_flight_tokens / max(1, budget.in_flight_requests)
        if (tokens < budget.capacity and not projection_fits(hints)) or (
                tokens >= budget.capacity + step):
            self._set_tokens(tokens / self.plan.kv_tokens, "projected")

    def _kv_backoff(self, hints: LoadHints, now: float) -> None:
        if now < self._cut_until:
            return
        self._cut_until = now + self.config.interval_s
        self._set_tokens(max(KV_SAFE_SHARE, self.kv_factor * _KV_BACKOFF), "kv-headroom")
        self._set(min(self.window, max(1.0, float(hints.num_running))), "kv-headroom")

    def _cut(self, now: float | None, reason: str, force: bool = False) -> None:
        if now is not None and now < self._cut_until and not force:
            return
        self.epoch += 1
        if now is not None:
            self._cut_until = now + 2 * self.config.interval_s
        self._set(self.window * self.config.decrease_factor, reason)
        if reason == "preemption" and self.plan.kv_tokens is not None:
            self._set_tokens(min(self.kv_factor, 1.0) * KV_SAFE_SHARE, reason)

    def _set(self, window: float, reason: str) -> None:
        window = max(1.0, min(window, float(self.plan.max_concurrency)))
        before = self.concurrency
        self.window = window
        if self.concurrency != before:
            self.budget.max_concurrency = self.concurrency
            self.budget.resize(self.budget.capacity)  # wakes waiters for the new window
            self.history.append((reason, self.concurrency, self.budget.capacity))

    def _set_tokens(self, factor: float, reason: str) -> None:
        assert self.plan.kv_tokens is not None
        tokens = int(factor * self.plan.kv_tokens)
        tokens = max(self.plan.min_tokens, min(tokens, self.plan.max_tokens))
        self.kv_factor = tokens / self.plan.kv_tokens
        if tokens != self.budget.capacity:
            # More room lets a burst in, as a wider window does.
            self._ramping |= tokens > self.budget.capacity
            self.budget.resize(tokens)
            self.history.append((reason, self.concurrency, tokens))

