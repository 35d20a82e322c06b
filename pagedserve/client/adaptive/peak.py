"""Where a server's throughput peaks, from the step times it publishes.

In one engine step every running sequence gets one token, so with ``n`` sequences running
the server makes ``n / step_time(n)`` tokens per second. The step time is the delay signal
(as round-trip time is to TCP Vegas and BBR): flat while the batch is small and the weights'
memory traffic dominates, growing once compute or attention over long contexts does. Past the
concurrency where the step time grows faster than ``n``, more requests in flight only add
latency (and, later, preemption).

``StepCurve`` keeps a smoothed step time per running count, forgets what it has not seen
lately, and fits
``step(n) = a + b·n + c·n²`` by weighted least squares. The quadratic term is what makes an
interior peak at ``n* = sqrt(a / c)``; without one, throughput still rises at the largest
``n`` observed, and the answer is "more".

A change of workload (longer prompts, another client) moves the whole curve, while the
samples only come from the running count of the moment. So when new samples keep landing far
off the fitted curve, in the same direction, the old samples are dropped at once rather than
left to fade: a fit through old and new points at once would name a peak that is neither.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagedserve.common.running_buckets import running_bucket

# How many samples a bucket's average behaves like at most: a new sample moves it by at least
# 1/_MAX_WEIGHT, so a bucket follows a changed workload instead of averaging over it forever.
_MAX_WEIGHT = 16.0
_MIN_WEIGHT = 0.05  # a bucket this faded is forgotten
_FIT_WEIGHT = 2.0  # a bucket with less (one sample, or faded) is too thin to fit through
# Nor one sampled over less time than this: a moment at some running count (a burst of
# prefills after a growth, a batch passing through on its way down) is no steady state.
_FIT_SPAN_S = 0.25
_SHIFT = 0.3  # a sample this far off the fit (as a share of it) counts towards a shift
_SHIFT_SAMPLES = 40  # so many in a row (2 s of polling), all above or all below: it moved


@dataclass(slots=True)
class _Bucket:
    running: float  # the mean running count of its samples
    step_ms: float
    weight: float
    seen_at: float
    first_seen: float


@dataclass(slots=True, frozen=True)
class Peak:
    """The fitted curve's best concurrency within the range explored so far."""

    concurrency: int
    tokens_per_s: float
    step_ms: float
    at_edge: bool  # the best is at the top of what was observed: the peak may lie beyond
    decline: float  # how much less the fit makes at the top observed than at the best, 0..1


class StepCurve:
    """Step time against running count, as observed through the load hints."""

    def __init__(self, memory_s: float = 20.0) -> None:
        if not memory_s > 0:
            raise ValueError(f"memory_s must be positive, got {memory_s}")
        self.memory_s = memory_s
        self._buckets: dict[int, _Bucket] = {}
        self._off_fit = 0  # consecutive samples off the fit: positive above, negative below

    def observe(self, num_running: int, step_ms: float, now: float) -> bool:
        """One sample: ``step_ms`` per step while ``num_running`` sequences ran. True when it
        completed evidence that the curve moved, and the older samples were dropped."""
        if num_running < 1 or not step_ms > 0:
            return False
        shifted = self._track_shift(num_running, step_ms, now)
        if shifted:
            self._buckets.clear()
        self._add(num_running, step_ms, now)
        return shifted

    def forget(self) -> None:
        """Drop every sample: the curve moved, and what it was says nothing now."""
        self._buckets.clear()
        self._off_fit = 0

    def _track_shift(self, num_running: int, step_ms: float, now: float) -> bool:
        points = self.fit_points(now)
        if not points or not points[0][0] <= num_running <= points[-1][0]:
            return False  # outside the fitted range the fit guesses: no evidence either way
        expected = self.step_ms_at(now, num_running)
        if expected is None or expected <= 0:
            self._off_fit = 0
            return False
        off = (step_ms - expected) / expected
        if abs(off) < _SHIFT:
            self._off_fit = 0
        elif (off > 0) == (self._off_fit >= 0):
            self._off_fit += 1 if off > 0 else -1
        else:
            self._off_fit = 1 if off > 0 else -1
        if abs(self._off_fit) >= _SHIFT_SAMPLES:
            self._off_fit = 0
            return True
        return False

    def _add(self, num_running: int, step_ms: float, now: float) -> None:
        key = running_bucket(num_running)
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = _Bucket(float(num_running), step_ms, 1.0, now, now)
            return
        weight = min(self._faded(bucket, now) + 1.0, _MAX_WEIGHT)
        bucket.running += (num_running - bucket.running) / weight
        bucket.step_ms += (step_ms - bucket.step_ms) / weight
        bucket.weight, bucket.seen_at = weight, now

    def points(self, now: float, min_span_s: float = 0.0) -> list[tuple[float, float, float]]:
        """(mean running count, step ms, weight) of every bucket still remembered (and
        sampled over ``min_span_s`` at least)."""
        points = []
        for key, bucket in list(self._buckets.items()):
            weight = self._faded(bucket, now)
            if weight < _MIN_WEIGHT:
                del self._buckets[key]
            elif bucket.seen_at - bucket.first_seen >= min_span_s:
                points.append((bucket.running, bucket.step_ms, weight))
        return sorted(points)

    def peak(self, now: float, limit: int | None = None) -> Peak | None:
        """The fitted best concurrency up to the largest observed (or ``limit``); None until
        three well-sampled running counts are known."""
        points = self.fit_points(now)
        if len(points) < 3:
            return None
        n = np.array([p[0] for p in points], dtype=float)
        step = np.array([p[1] for p in points])
        coef = _fit(n, step, np.array([p[2] for p in points]))
        top = round(n.max()) if limit is None else min(round(n.max()), limit)
        grid = np.arange(1, top + 1, dtype=float)
        fitted = coef[0] + coef[1] * grid + coef[2] * grid * grid
        # A fit may dip below anything measured at the edges; such a point is no evidence.
        fitted = np.maximum(fitted, step.min())
        throughput = grid / fitted * 1000.0
        best = int(np.argmax(throughput))
        return Peak(
            concurrency=best + 1,
            tokens_per_s=float(throughput[best]),
            step_ms=float(fitted[best]),
            at_edge=best + 1 >= 0.9 * top,
            decline=1.0 - float(throughput[-1] / throughput[best]),
        )

    def fit_points(self, now: float) -> list[tuple[float, float, float]]:
        """The points with weight enough to fit through."""
        return [p for p in self.points(now, _FIT_SPAN_S) if p[2] >= _FIT_WEIGHT]

    def step_ms_at(self, now: float, concurrency: float) -> float | None:
        """The fitted step time at ``concurrency`` (None without enough samples)."""
        points = self.fit_points(now)
        if len(points) < 3:
            return None
        coef = _fit(np.array([p[0] for p in points], dtype=float),
                    np.array([p[1] for p in points]), np.array([p[2] for p in points]))
        return float(coef[0] + coef[1] * concurrency + coef[2] * concurrency**2)

    def measured_tokens_per_s(self, now: float, near: float) -> tuple[float, float] | None:
        """(running count, tokens per second) of the well-sampled bucket nearest ``near``,
        as measured rather than fitted (two buckets already say which way the curve goes)."""
        points = self.fit_points(now)
        if not points:
            return None
        n, step, _ = min(points, key=lambda p: abs(p[0] - near))
        return n, n / step * 1000.0

    def measured_gain(self, now: float, top: float, ratio: float) -> float | None:
        """Measured throughput at ``top`` over that at ``ratio × top``; None unless both are
        known and apart."""
        high = self.measured_tokens_per_s(now, top)
        low = self.measured_tokens_per_s(now, ratio * top)
        if high is None or low is None or not low[0] <= 1.2 * ratio * top < high[0]:
            return None  # nothing measured near enough to ``ratio × top``
        return high[1] / low[1]

    def best_before_collapse(self, now: float, decline: float) -> float | None:
        """The running count measured best, when the largest measured makes ``decline`` (a
        share) less than it; None otherwise, or with under three points."""
        points = self.fit_points(now)
        if len(points) < 3:
            return None
        rates = [(n / step, n) for n, step, _ in points]
        best_rate, best_n = max(rates)
        return best_n if rates[-1][0] <= (1.0 - decline) * best_rate else None

    def measured_decline(self, now: float, decline: float) -> bool:
        """The buckets themselves, not only the fit, make ``decline`` less at the largest
        count than somewhere below it: a fit through four or more points can still bend on
        noise."""
        points = self.fit_points(now)
        if len(points) < 4:
            return False
        rates = [n / step for n, step, _ in points]
        return rates[-1] <= (1.0 - decline) * max(rates)

    def _faded(self, bucket: _Bucket, now: float) -> float:
        return bucket.weight * math.exp(-max(0.0, now - bucket.seen_at) / self.memory_s)


def _fit(n: np.ndarray, step: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Weighted least squares of ``step ≈ a + b·n + c·n²``; (a, b, c)."""
    design = np.stack([np.ones_like(n), n, n * n], axis=1)
    root = np.sqrt(weight)[:, None]
    coef, *_ = np.linalg.lstsq(design * root, step * root[:, 0], rcond=None)
    return coef
