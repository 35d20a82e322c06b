"""Arrival schedules: when each request is due, as offsets in seconds from the run's start.

The whole schedule is drawn before the run, so the send loop only compares clocks. The first
request is due at 0. Gaps between requests are gamma-distributed with shape ``burstiness``
and mean ``1 / rate`` (vLLM's model): burstiness 1 is a Poisson process (exponential gaps,
coefficient of variation 1); smaller is burstier, larger is smoother, the CV being
``1 / sqrt(burstiness)``. ``constant`` spaces requests exactly ``1 / rate`` apart.
"""

from __future__ import annotations

import math

import numpy as np

from pagedserve.loadgen.bench_config import LoadShape

_DURATION_CHUNK = 4096


def arrivals_rng(seed: int) -> np.random.Generator:
    """The schedule's own stream, independent of the dataset's."""
    return np.random.default_rng([seed, 1])


def _gaps(rates: np.ndarray, burstiness: float, arrival: str,
          rng: np.random.Generator) -> np.ndarray:
    if arrival == "constant":
        return 1.0 / rates
    return rng.gamma(shape=burstiness, scale=1.0 / (rates * burstiness))


def _offsets_from_gaps(gaps: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(gaps) + 1)
    np.cumsum(gaps, out=offsets[1:])
    return offsets


def ramp_up_rates(strategy: str, start_rps: float, end_rps: float, count: int) -> np.ndarray:
    """The rate in force before each of ``count`` requests; progress is by request index."""
    progress = np.arange(count) / max(count - 1, 1)
    if strategy == "linear":
        return start_rps + (end_rps - start_rps) * progress
    return start_rps * (end_rps / start_rps) ** progress


def schedule(shape: LoadShape, rng: np.random.Generator) -> np.ndarray:
    """Due offsets (seconds, non-decreasing) of every request the open loop sends.

    With ``duration`` the schedule holds every arrival before it; otherwise ``num_prompts``
    arrivals. An infinite rate without ramp-up puts every request at 0.
    """
    if shape.ramp_up_strategy is not None:
        rates = ramp_up_rates(shape.ramp_up_strategy, shape.ramp_up_start_rps or 1.0,
                              shape.ramp_up_end_rps or 1.0, shape.num_prompts)
        return _offsets_from_gaps(_gaps(rates[1:], shape.burstiness, shape.arrival, rng))
    if math.isinf(shape.request_rate):
        return np.zeros(shape.num_prompts)
    if shape.duration is None:
        rates = np.full(shape.num_prompts - 1, shape.request_rate)
        return _offsets_from_gaps(_gaps(rates, shape.burstiness, shape.arrival, rng))
    return _until(shape, shape.duration, rng)


def _until(shape: LoadShape, duration: float, rng: np.random.Generator) -> np.ndarray:
    pieces = [np.zeros(1)]
    last = 0.0
    while last < duration:
        rates = np.full(_DURATION_CHUNK, shape.request_rate)
        piece = last + np.cumsum(_gaps(rates, shape.burstiness, shape.arrival, rng))
        pieces.append(piece)
        last = float(piece[-1])
    offsets = np.concatenate(pieces)
    return offsets[offsets < duration]
