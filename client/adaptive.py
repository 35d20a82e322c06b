"""Adaptive in-flight budget: run a server at its throughput peak, short of its memory limit.

Two limits move, per endpoint:

- the **window**, the requests in flight (``TokenBudget.max_concurrency``), is where the
  throughput is: ``StepCurve`` fits the server's step time against its running count and names
  the concurrency of most tokens per second. The window doubles while doubling pays (a
  start-up, left after two doublings that gained under a quarter, as BBR leaves its own), then
  grows a quarter at a time; a doubling that lost a quarter of the throughput (at three
  decisions in a row) ends the start-up, with a step as far under the window before it as the
  doubling went over it, and the fit through both sides names the peak. Each growth waits
  until the server runs the new window and the curve has samples there. It settles at the
  fitted peak only once both the fit and the samples themselves show the throughput a quarter
  lower well past it (noise fits false summits, and stopping short costs more than going a
  little past), descending in steps when the peak lies below what was measured lately. Samples
  alone showing such a fall stop any growth. A confirmed peak stands until the throughput
  measured at it drifts well off what the fit named (the workload changed); then the curve is
  forgotten and searched again. A queue on the server (its own batch limit) pulls the window
  back to what runs plus a small refill margin. The curve takes only steady samples: none
  while the requests a growth let in still queue or prefill on the server (a burst of prefills
  makes slow steps that the running count's steady state lacks), nor for a few steps after. In
  the start-up, the next doubling follows as soon as the curve has steady samples at the
  window, without waiting for the decision interval to end.
- the **token capacity** (``TokenBudget.capacity``) keeps KV memory safe: reservations count
  every prompt token and ``max_tokens``, so reserving at most the server's KV size can never
  preempt. The capacity grows past the KV size only on evidence that reservations overstate
  what the cache will hold (``Overcommit``), while the reservations bind and the cache stays
  under ``kv_usage_low``. Above ``kv_usage_high`` it shrinks back *before* the cache runs
  out. A server that publishes the peak its held work will need settles it at once
  (``projected_capacity``), once each growth has reached the server; a usage above
  ``kv_usage_high`` is then no danger while that projection fits.

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

from pagedserve.client.adaptive_plan import (
    KV_SAFE_SHARE,
    AdaptiveConfig,
    BudgetPlan,
    plan_budget,
)
from pagedserve.client.budget import TokenBudget
from pagedserve.client.hint_interval import HintInterval
from pagedserve.client.latency_target import LatencyGuard, estimate_latency_ms
from pagedserve.client.overcommit import Overcommit, projected_capacity, projection_fits
from pagedserve.client.peak import StepCurve
from pagedserve.common.load_hints import LoadHints

__all__ = ["AdaptiveBudget", "AdaptiveConfig", "BudgetPlan", "plan_budget"]

logger = logging.getLogger(__name__)
_HISTORY = 1024
_STARTUP_GROWTH = 2.0
_PROBE_GROWTH = 1.25
_PROBE_PAID = 1.02  # a probe that gained this much throughput: the next one goes further
# The window above the peak: answers on their way back and requests on their way out leave
# the batch short for a moment, and a few queued requests refill it at once.
_PEAK_MARGIN = 0.05
_PEAK_MARGIN_MIN = 2
_PEAK_DECLINE = 0.25
_REACHED = 0.9
_BOTH_SIDES = 1.1
_STARTUP_EXIT = 2
_DOUBLING_LOST = 0.75  # a doubling that made this share of the throughput before it, or less
_LOST_DECISIONS = 3  # ... at so many decisions in a row (one can be a burst's noise)
_DOUBLING_PAYS = 1.25  # a doubling that made less than this share more paid little
_DESCENT = 0.85  # a descent goes at most this far below the least measured, per decision
_KV_BACKOFF = 0.85
_SHIFT = 0.3  # a throughput this far off the verdict's, at its running count: the curve moved
_NEAR = 0.15  # samples within this share of the verdict's running count speak for it
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
        self.curve = StepCurve(config.memory_s)
        self.latency = LatencyGuard(config.target) if config.target is not None else None
        self.history: deque[tuple[str, int, int]] = deque(maxlen=_HISTORY)
        self.history.append(("start", self.concurrency, budget.capacity))
        self._interval = HintInterval()
        self._next_decision = now + config.interval_s
        self._cut_until = -math.inf
        self._preemptions: int | None = None
        self._found_peak = False
        self._small_gains = 0
        self.overcommit = Overcommit(config.interval_s, config.kv_usage_low, now)
        self._settle_until = now
        self._ramping = False  # the window grew and the server has yet to run what it let in
        self._verdict: float | None = None  # the window at the peak, once one was confirmed
        # The tokens per second first measured at the verdict (a fit's interpolation there
        # can be off by more than a shift, and would call one at once).
        self._verdict_rate: float | None = None
        self._probe_growth = _PROBE_GROWTH
        # The window whose start-up doubling lost throughput, until the curve is forgotten.
        self._lost_at: float | None = None
        self._lost_seen = 0  # decisions in a row that measured the last doubling lost
        self._in_startup = True  # until a decision other than to double or hold
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
        if self._steady(hints, now) and hints.step_ms is not None and self.curve.observe(
                hints.num_running, hints.step_ms, now):
            # Explore the moved curve from where it now runs, in probing steps: a start-up's
            # doubling from a window already sized for a server is too coarse.
            self._found_peak = True
            self._verdict = None
            self._lost_at = None
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
            if hints.num_running < _REACHED * self.budget.in_flight_requests:
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
        if not self._in_startup or self._ramping or now < self._settle_until:
            return False
        top = max((n for n, _, _ in self.curve.fit_points(now)), default=0.0)
        ready = top >= _REACHED * self.window
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
        waiting = interval.waiting / interval.samples
        self._tune_tokens(interval, now)
        window, reason = self._window_for(interval, running, waiting, now)
        self._in_startup &= reason in ("startup", "hold")
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

    def _window_for(
        self, interval: HintInterval, running: float, waiting: float, now: float
    ) -> tuple[float, str]:
        admitting = interval.last_running > interval.first_running
        if waiting > self.plan.waiting_high and not admitting:
            # The server runs what it can (its batch or KV limit); more only queues there.
            # (Not while its running count still climbs: a burst of arrivals queues for its
            # prefills a few steps, whatever the server's limits.)
            return running + self.plan.waiting_high, "queue"
        peak = self.curve.peak(now, self.plan.max_concurrency)
        top = max((n for n, _, _ in self.curve.fit_points(now)), default=0)
        # A peak counts once the curve has been seen well past it and falling there: noise
        # over a few running counts fits a false summit, and stopping short of the real one
        # costs far more throughput than going a little past it.
        explored = (peak is not None and not peak.at_edge and top >= 1.5 * peak.concurrency
                    and peak.decline >= _PEAK_DECLINE
                    and self.curve.measured_decline(now, _PEAK_DECLINE))
        # A start-up doubling that lost throughput measured the fall itself: a fit through
        # points on both sides of the window before it is evidence enough.
        explored |= (self._lost_at is not None and peak is not None and not peak.at_edge
                     and top >= _REACHED * self._lost_at)
        self._found_peak |= explored
        if self._verdict is not None and not self._verdict_holds(now):
            # The verdict stands until the curve moves, which shows as the throughput at the
            # peak itself drifting off what it was when the peak was confirmed (a fit still
            # through the old points past the peak would keep naming the old one).
            self._verdict = None
            self._lost_at = None
            self.curve.forget()
            self.history.append(("shift", self.concurrency, self.budget.capacity))
            return self.window, "shift"
        if not explored and self._verdict is not None:
            # The points past the peak fade once the window stays at it (samples come only
            # from where the server runs): the verdict stands.
            return self._verdict, "peak"
        collapse = self.curve.best_before_collapse(now, _PEAK_DECLINE)
        if collapse is not None:
            collapse += max(_PEAK_MARGIN_MIN, _PEAK_MARGIN * collapse)
        if not explored and collapse is not None:
            # Too few points for a fit to confirm, but the measurements alone show the top
            # making a quarter less than a smaller batch did: never grow into that.
            return min(self.window, collapse), "descend"
        if not explored:
            if not interval.window_full or top < _REACHED * self.window or not (
                    _REACHED * self.window <= running <= self.window + 1):
                # The window did not limit the load, the server has yet to run what it
                # allows (or the curve to see it), or it still drains from a larger window:
                # nothing to learn by growing.
                return self.window, "hold"
            # The last doubling of the running count: measured throughput after over before.
            doubling = self.curve.measured_gain(now, top, 0.5)
            lost = self._in_startup and doubling is not None and doubling < _DOUBLING_LOST
            self._lost_seen = self._lost_seen + 1 if lost else 0
            if lost and self._lost_seen < _LOST_DECISIONS:
                return self.window, "hold"  # measure the new window a little longer
            if lost:
                # The last doubling made less than the window before it: the peak lies
                # below the window, and another doubling would only sink deeper (where steps
                # are slowest, and what was let in drains slowest). Measure as far under the
                # better window as the doubling went over it, so that the fit has the curve
                # on both sides of that window and names the peak from there.
                self._found_peak = True
                self._lost_at = self.window
                return self.window / (_STARTUP_GROWTH * _STARTUP_GROWTH), "descend"
            # BBR leaves its start-up after three rounds without a quarter more bandwidth;
            # on a noisy machine two doublings that paid little are evidence enough, once
            # the fit bends down short of the window. A curve whose best is still its top
            # saturates rather than peaks (each sequence added costs less than the one
            # before): probing it a quarter at a time would spend the batch getting there.
            pays_little = (doubling is not None and doubling < _DOUBLING_PAYS
                           and (peak is None or not peak.at_edge))
            self._small_gains = self._small_gains + 1 if pays_little else 0
            self._found_peak |= self._small_gains >= _STARTUP_EXIT
            if not self._found_peak:
                return self.window * _STARTUP_GROWTH, "startup"
            return self.window * self._next_probe_growth(now, top), "probe"
        assert peak is not None
        bottom = min(n for n, _, _ in self.curve.fit_points(now))
        if peak.concurrency <= _BOTH_SIDES * bottom:
            # The fit puts the peak at or below the least measured lately, where it is an
            # extrapolation: step under both, so that the running count drops and the fit
            # gets data on both sides of the peak.
            step_down = min(float(peak.concurrency), _DESCENT * bottom, bottom - 1)
            self._verdict = None  # the next one is named, and measured, afresh
            return min(self.window, max(step_down, _DESCENT * _DESCENT * bottom)), "descend"
        margin = max(_PEAK_MARGIN_MIN, _PEAK_MARGIN * peak.concurrency)
        if self._verdict is None:
            self._verdict_rate = None
        self._verdict = peak.concurrency + margin
        return self._verdict, "peak"

    def _verdict_holds(self, now: float) -> bool:
        """False once the samples at the verdict's running count make a throughput
        ``_SHIFT`` off what they first made there."""
        assert self._verdict is not None
        measured = self.curve.measured_tokens_per_s(now, self._verdict)
        if measured is None or abs(measured[0] - self._verdict) > _NEAR * self._verdict:
            return True
        if self._verdict_rate is None:
            self._verdict_rate = measured[1]
            return True
        return abs(measured[1] / self._verdict_rate - 1.0) <= _SHIFT

    def _next_probe_growth(self, now: float, top: float) -> float:
        """A quarter more, and more after each probe that still paid: past the knee a
        curve may keep rising gently up to the server's limit, and probing it a quarter at a
        time would spend a whole batch getting there."""
        gain = self.curve.measured_gain(now, top, 1.0 / self._probe_growth)
        if gain is not None and gain >= _PROBE_PAID:
            self._probe_growth = min(_STARTUP_GROWTH, self._probe_growth * _PROBE_GROWTH)
        else:
            self._probe_growth = _PROBE_GROWTH
        return self._probe_growth

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
        tokens = projected_capacity(hints, self.budget.in_flight_tokens,
                                    self.budget.in_flight_requests, self.plan.kv_tokens)
        if tokens is None:
            return
        budget = self.budget
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

