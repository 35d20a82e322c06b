"""Where this server's throughput peaks, measured from its own steps.

A client that starts an adaptive in-flight budget knows nothing of the server yet, and
searching for the batch of most tokens per second costs it seconds of a half-empty batch.
The server has measured every step it ran: ``ThroughputCurve`` keeps, per running count
(bucketed as ``running_bucket`` does), the tokens it sampled and the wall time it took,
faded over ``memory_s``, and ``GET /load`` publishes the running count that made the most
tokens per second (``best_running``), where a client's search can start.

A step's wall time is its duration plus the pause before it, as long as the pause is shorter
than the step (the engine loop's own work between steps is part of what a batch costs; a
longer pause is the engine idling for work). Steps that sampled nothing (a prefill chunk of a
long prompt) are left out: they belong to no running count.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagedserve.common.running_buckets import running_bucket

if TYPE_CHECKING:
    from pagedserve.server.engine.engine_stats import StepStats

MEMORY_S = 60.0  # a bucket's sums fade by e over this many seconds
MIN_STEPS = 16.0  # a bucket with fewer (faded) steps says nothing yet
MIN_SECONDS = 0.5  # ... or measured over less wall time
# Running counts making within this share of the best count as just as good; the largest of
# them is the best, since a batch of equal speed finishes its work with fewer stragglers.
FLAT = 0.03


@dataclass(slots=True)
class _Bucket:
    steps: float = 0.0
    running: float = 0.0  # the sum of the running counts of its steps
    tokens: float = 0.0
    seconds: float = 0.0
    seen_at: float = 0.0

    def fade(self, now: float, memory_s: float) -> None:
        factor = math.exp(-max(0.0, now - self.seen_at) / memory_s)
        self.steps *= factor
        self.running *= factor
        self.tokens *= factor
        self.seconds *= factor
        self.seen_at = now


@dataclass(slots=True, frozen=True)
class BestRunning:
    running: int  # the mean running count of the best bucket
    tokens_per_s: float


class ThroughputCurve:
    """Tokens per second against running count (an observer of the engine loop)."""

    def __init__(self, memory_s: float = MEMORY_S,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not memory_s > 0:
            raise ValueError(f"memory_s must be positive, got {memory_s}")
        self.memory_s = memory_s
        self._clock = clock
        self._buckets: dict[int, _Bucket] = {}
        self._last_end: float | None = None
        self._lock = threading.Lock()  # written by the engine thread, read by handlers

    def __call__(self, step: StepStats) -> None:
        end = self._clock()
        start = end - step.duration_s
        pause = 0.0 if self._last_end is None else start - self._last_end
        self._last_end = end
        if step.num_decode_tokens == 0:
            return
        wall = step.duration_s + (pause if 0.0 <= pause <= step.duration_s else 0.0)
        # Requests, as a client counts what it has in flight: those still running after the
        # step and those it finished.
        running = step.num_running + len(step.finished)
        self.add(running, step.num_decode_tokens, wall, end)

    def add(self, num_running: int, tokens: int, seconds: float, now: float) -> None:
        """One step of ``num_running`` requests that sampled ``tokens`` in ``seconds``."""
        with self._lock:
            bucket = self._buckets.setdefault(running_bucket(num_running), _Bucket(seen_at=now))
            bucket.fade(now, self.memory_s)
            bucket.steps += 1.0
            bucket.running += num_running
            bucket.tokens += tokens
            bucket.seconds += seconds

    def best(self, now: float | None = None) -> BestRunning | None:
        """The running count of most tokens per second among the buckets measured enough
        (the largest within ``FLAT`` of the most); None before any is."""
        now = self._clock() if now is None else now
        with self._lock:
            measured = []
            for bucket in self._buckets.values():
                bucket.fade(now, self.memory_s)
                if bucket.steps >= MIN_STEPS and bucket.seconds >= MIN_SECONDS:
                    measured.append((bucket.running / bucket.steps,
                                     bucket.tokens / bucket.seconds))
        if not measured:
            return None
        most = max(rate for _, rate in measured)
        running, rate = max((n, rate) for n, rate in measured if rate >= (1.0 - FLAT) * most)
        return BestRunning(round(running), rate)
