"""A latency target for the adaptive budget: most throughput while a percentile stays under it.

A batch sends non-streaming requests, so the client sees each request's end-to-end time and
its token counts, not its first token. It estimates, per finished request:

- time per output token: the end-to-end time spread over the output tokens (an upper bound:
  it includes the request's share of queueing and prefill);
- time to first token: the end-to-end time less the decode steps after the first token, at
  the server's published step time.

``LatencyGuard`` caps the concurrency the throughput search may choose. Only requests sent
after the cap last moved are evidence about it (as with TCP's one cut per window): when their
chosen percentile is over the target the cap drops below what was running; when it is well
under, the cap rises. A target still missed with one request in flight cannot be met at any
budget, and the guard says so.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

LatencyMetric = Literal["tpot", "ttft"]
_MIN_SAMPLES = 8
_SAMPLES = 256
_DECREASE = 0.8  # at least this cut; far over the target, down to half
_INCREASE = 1.15
_SLACK = 0.8  # under this share of the target the cap may rise


@dataclass(slots=True, frozen=True)
class LatencyTarget:
    """Keep the ``percentile`` of ``metric`` (milliseconds) at or under ``target_ms``."""

    metric: LatencyMetric
    target_ms: float
    percentile: float = 90.0

    def __post_init__(self) -> None:
        if self.metric not in ("tpot", "ttft"):
            raise ValueError(f"metric must be 'tpot' or 'ttft', got {self.metric!r}")
        if not self.target_ms > 0:
            raise ValueError(f"target_ms must be positive, got {self.target_ms}")
        if not 0 < self.percentile <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile}")


def estimate_latency_ms(
    metric: LatencyMetric, e2e_s: float, completion_tokens: int, step_ms: float | None
) -> float | None:
    """One request's TPOT or TTFT estimate (see the module's docstring); None if unknown."""
    if metric == "tpot":
        return e2e_s * 1000.0 / completion_tokens if completion_tokens > 0 else None
    if step_ms is None:
        return None
    return max(0.0, e2e_s * 1000.0 - max(0, completion_tokens - 1) * step_ms)


class LatencyGuard:
    def __init__(self, target: LatencyTarget) -> None:
        self.target = target
        self.cap: float = math.inf
        self.changed_at = -math.inf
        self.unreachable = False
        self.observed_ms: float | None = None  # the percentile at the latest decision
        self._samples: deque[float] = deque(maxlen=_SAMPLES)

    def record(self, sent_at: float, latency_ms: float | None) -> None:
        if latency_ms is not None and sent_at >= self.changed_at:
            self._samples.append(latency_ms)

    def update(self, running: float, floor: int, now: float) -> None:
        """Move the cap from the samples gathered since it last moved."""
        # A small window answers slowly: ask it for fewer samples, or it would never move.
        if len(self._samples) < max(3, min(_MIN_SAMPLES, round(running))):
            return
        observed = float(np.percentile(np.array(self._samples), self.target.percentile))
        self.observed_ms = observed
        if observed > self.target.target_ms:
            at_floor = min(self.cap, running) <= floor
            self.unreachable = at_floor
            factor = max(0.5, min(_DECREASE, self.target.target_ms / observed))
            self.cap = max(float(floor), min(self.cap, max(running, 1.0)) * factor)
        elif observed < _SLACK * self.target.target_ms and math.isfinite(self.cap):
            self.unreachable = False
            self.cap *= _INCREASE
        else:
            self.unreachable = False
            return
        self.changed_at = now
        self._samples.clear()

    def describe(self) -> str:
        name = {"tpot": "time per output token", "ttft": "time to first token"}
        target = self.target
        observed = "n/a" if self.observed_ms is None else f"{self.observed_ms:.1f} ms"
        return (f"p{target.percentile:g} {name[target.metric]} {observed} against a target of "
                f"{target.target_ms:g} ms")
