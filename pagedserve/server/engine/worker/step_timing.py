"""Where one engine step's wall time goes, phase by phase.

``schedule`` (the scheduler's decisions and block allocation), ``prepare`` (block copies and
swaps, and packing the step's tensors), ``forward`` (the model, logits included), ``sample``
(the sampler) and ``output`` (appending tokens, forks, detokenizing, stop checks, freeing
finished requests, building the RequestOutputs). The phases add up to the step's duration.
The server exports them as the ``pagedserve:step_phase_seconds`` histogram; the benchmarks
print their totals.
"""

from __future__ import annotations

import time

STEP_PHASES = ("schedule", "prepare", "forward", "sample", "output")


class StepTimer:
    """Stopwatch for one step: ``mark(phase)`` books the time since the previous mark."""

    __slots__ = ("_last", "phases", "start")

    def __init__(self) -> None:
        self.start = self._last = time.perf_counter()
        self.phases: dict[str, float] = dict.fromkeys(STEP_PHASES, 0.0)

    def mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] += now - self._last
        self._last = now

    @property
    def elapsed(self) -> float:
        return self._last - self.start


def add_phases(totals: dict[str, float], phases: dict[str, float]) -> None:
    """Accumulates one step's phases into ``totals`` (for a run's summary)."""
    for name, seconds in phases.items():
        totals[name] = totals.get(name, 0.0) + seconds
