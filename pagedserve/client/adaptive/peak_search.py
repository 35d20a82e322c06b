"""Where a server's throughput peaks: the search that moves an adaptive budget's window.

``PeakSearch`` reads the ``StepCurve`` fitted through the server's step times and, at each
decision, names the window (the requests in flight) the curve calls for. The window doubles
while doubling pays (a start-up, as BBR's), then grows a quarter at a time, further after each
probe that still paid; a doubling that lost a quarter of the throughput (at three decisions
in a row) ends the start-up, with a step as far under the window before it as the doubling
went over it, so that the fit has the curve on both sides. Two doublings that paid under a
quarter end the start-up only once the fit bends down short of the window (a curve whose best
is its top saturates, and has no summit to stop short of). It settles at the fitted peak only
once both the fit and the samples themselves show the throughput a quarter lower well past it
(noise fits false summits, and stopping short costs more than going a little past),
descending in steps when the peak lies below what was measured lately. Samples alone showing
such a fall stop any growth. A confirmed peak stands until the throughput measured at it
drifts well off what was first measured there (the workload changed); then the curve is
forgotten and searched again. A queue on the server (its own batch limit) pulls the window
back to what runs plus a small refill margin, unless the running count still climbs.
"""

from __future__ import annotations

from pagedserve.client.adaptive.hint_interval import HintInterval
from pagedserve.client.adaptive.peak import StepCurve

STARTUP_GROWTH = 2.0
_PROBE_GROWTH = 1.25
_PROBE_PAID = 1.02  # a probe that gained this much throughput: the next one goes further
# The window above the peak: answers on their way back and requests on their way out leave
# the batch short for a moment, and a few queued requests refill it at once.
_PEAK_MARGIN = 0.05
_PEAK_MARGIN_MIN = 2
_PEAK_DECLINE = 0.25
REACHED = 0.9  # the server runs a window once it runs this share of it
_BOTH_SIDES = 1.1
_STARTUP_EXIT = 2
_DOUBLING_LOST = 0.75  # a doubling that made this share of the throughput before it, or less
_LOST_DECISIONS = 3  # ... at so many decisions in a row (one can be a burst's noise)
_DOUBLING_PAYS = 1.25  # a doubling that made less than this share more paid little
_DESCENT = 0.85  # a descent goes at most this far below the least measured, per decision
_SHIFT = 0.3  # a throughput this far off the verdict's, at its running count: the curve moved
_NEAR = 0.15  # samples within this share of the verdict's running count speak for it


class PeakSearch:
    """The window a server's step-time curve calls for, decision by decision."""

    def __init__(self, memory_s: float, max_concurrency: int, waiting_high: int) -> None:
        self.curve = StepCurve(memory_s)
        self.max_concurrency = max_concurrency
        self.waiting_high = waiting_high
        self.in_startup = True  # until a decision other than to double or hold
        self.found_peak = False
        self._small_gains = 0
        self._verdict: float | None = None  # the window at the peak, once one was confirmed
        # The tokens per second first measured at the verdict (a fit's interpolation there
        # can be off by more than a shift, and would call one at once).
        self._verdict_rate: float | None = None
        self._probe_growth = _PROBE_GROWTH
        # The window whose start-up doubling lost throughput, until the curve is forgotten.
        self._lost_at: float | None = None
        self._lost_seen = 0  # decisions in a row that measured the last doubling lost

    def observe(self, num_running: int, step_ms: float, now: float) -> bool:
        """A steady sample; True when it showed the curve moved (the search starts again,
        in probing steps from where the server runs: a start-up's doubling from a window
        already sized for a server is too coarse)."""
        if not self.curve.observe(num_running, step_ms, now):
            return False
        self.found_peak = True
        self._verdict = None
        self._lost_at = None
        return True

    def top(self, now: float) -> float:
        """The largest running count the curve has well sampled (0 before any)."""
        return max((n for n, _, _ in self.curve.fit_points(now)), default=0.0)

    def window_for(self, window: float, interval: HintInterval, now: float
                   ) -> tuple[float, str]:
        """The window the last interval's samples call for, from ``window``, and why."""
        running = interval.running / interval.samples
        waiting = interval.waiting / interval.samples
        target, reason = self._decide(window, interval, running, waiting, now)
        self.in_startup &= reason in ("startup", "hold")
        return target, reason

    def _decide(self, window: float, interval: HintInterval, running: float, waiting: float,
                now: float) -> tuple[float, str]:
        admitting = interval.last_running > interval.first_running
        if waiting > self.waiting_high and not admitting:
            # The server runs what it can (its batch or KV limit); more only queues there.
            # (Not while its running count still climbs: a burst of arrivals queues for its
            # prefills a few steps, whatever the server's limits.)
            return running + self.waiting_high, "queue"
        peak = self.curve.peak(now, self.max_concurrency)
        top = self.top(now)
        # A peak counts once the curve has been seen well past it and falling there: noise
        # over a few running counts fits a false summit, and stopping short of the real one
        # costs far more throughput than going a little past it.
        explored = (peak is not None and not peak.at_edge and top >= 1.5 * peak.concurrency
                    and peak.decline >= _PEAK_DECLINE
                    and self.curve.measured_decline(now, _PEAK_DECLINE))
        # A start-up doubling that lost throughput measured the fall itself: a fit through
        # points on both sides of the window before it is evidence enough.
        explored |= (self._lost_at is not None and peak is not None and not peak.at_edge
                     and top >= REACHED * self._lost_at)
        self.found_peak |= explored
        if self._verdict is not None and not self._verdict_holds(now):
            # The verdict stands until the curve moves, which shows as the throughput at the
            # peak itself drifting off what it was when the peak was confirmed (a fit still
            # through the old points past the peak would keep naming the old one).
            self._verdict = None
            self._lost_at = None
            self.curve.forget()
            return window, "shift"
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
            return min(window, collapse), "descend"
        if not explored:
            if not interval.window_full or top < REACHED * window or not (
                    REACHED * window <= running <= window + 1):
                # The window did not limit the load, the server has yet to run what it
                # allows (or the curve to see it), or it still drains from a larger window:
                # nothing to learn by growing.
                return window, "hold"
            # The last doubling of the running count: measured throughput after over before.
            doubling = self.curve.measured_gain(now, top, 0.5)
            lost = self.in_startup and doubling is not None and doubling < _DOUBLING_LOST
            self._lost_seen = self._lost_seen + 1 if lost else 0
            if lost and self._lost_seen < _LOST_DECISIONS:
                return window, "hold"  # measure the new window a little longer
            if lost:
                # The last doubling made less than the window before it: the peak lies
                # below the window, and another doubling would only sink deeper (where steps
                # are slowest, and what was let in drains slowest). Measure as far under the
                # better window as the doubling went over it, so that the fit has the curve
                # on both sides of that window and names the peak from there.
                self.found_peak = True
                self._lost_at = window
                return window / (STARTUP_GROWTH * STARTUP_GROWTH), "descend"
            # BBR leaves its start-up after three rounds without a quarter more bandwidth;
            # on a noisy machine two doublings that paid little are evidence enough, once
            # the fit bends down short of the window. A curve whose best is still its top
            # saturates rather than peaks (each sequence added costs less than the one
            # before): probing it a quarter at a time would spend the batch getting there.
            pays_little = (doubling is not None and doubling < _DOUBLING_PAYS
                           and (peak is None or not peak.at_edge))
            self._small_gains = self._small_gains + 1 if pays_little else 0
            self.found_peak |= self._small_gains >= _STARTUP_EXIT
            if not self.found_peak:
                return window * STARTUP_GROWTH, "startup"
            return window * self._next_probe_growth(now, top), "probe"
        assert peak is not None
        bottom = min(n for n, _, _ in self.curve.fit_points(now))
        if peak.concurrency <= _BOTH_SIDES * bottom:
            # The fit puts the peak at or below the least measured lately, where it is an
            # extrapolation: step under both, so that the running count drops and the fit
            # gets data on both sides of the peak.
            step_down = min(float(peak.concurrency), _DESCENT * bottom, bottom - 1)
            self._verdict = None  # the next one is named, and measured, afresh
            return min(window, max(step_down, _DESCENT * _DESCENT * bottom)), "descend"
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
            self._probe_growth = min(STARTUP_GROWTH, self._probe_growth * _PROBE_GROWTH)
        else:
            self._probe_growth = _PROBE_GROWTH
        return self._probe_growth
