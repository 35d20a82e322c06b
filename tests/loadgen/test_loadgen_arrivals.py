"""Arrival schedules: rate and burstiness as asked, reproducible for a seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagedserve.loadgen.arrivals import arrivals_rng, ramp_up_rates, schedule
from pagedserve.loadgen.bench_config import LoadShape
from pagedserve.loadgen.bench_errors import BenchConfigError


def _gaps(shape: LoadShape, seed: int = 0) -> np.ndarray:
    offsets = schedule(shape, arrivals_rng(seed))
    assert offsets[0] == 0.0 and np.all(np.diff(offsets) >= 0)
    return np.diff(offsets)


@pytest.mark.parametrize(("burstiness", "cv"), [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_gamma_gaps_match_rate_and_cv(burstiness: float, cv: float) -> None:
    gaps = _gaps(LoadShape(num_prompts=20001, request_rate=50.0, burstiness=burstiness))
    assert 1.0 / gaps.mean() == pytest.approx(50.0, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)


def test_constant_arrivals_are_evenly_spaced() -> None:
    offsets = schedule(LoadShape(num_prompts=5, request_rate=4.0, arrival="constant"),
                       arrivals_rng(0))
    assert offsets.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_infinite_rate_sends_everything_at_once() -> None:
    assert schedule(LoadShape(num_prompts=3), arrivals_rng(0)).tolist() == [0.0, 0.0, 0.0]


def test_seed_reproduces_schedule() -> None:
    shape = LoadShape(num_prompts=100, request_rate=10.0)
    a, b = schedule(shape, arrivals_rng(7)), schedule(shape, arrivals_rng(7))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, schedule(shape, arrivals_rng(8)))


def test_duration_bounds_arrivals() -> None:
    offsets = schedule(LoadShape(request_rate=200.0, duration=30.0), arrivals_rng(0))
    assert offsets.max() < 30.0
    assert len(offsets) == pytest.approx(200 * 30, rel=0.03)


def test_ramp_up_rates_by_request_index() -> None:
    assert ramp_up_rates("linear", 1.0, 5.0, 5).tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert ramp_up_rates("exponential", 1.0, 16.0, 5).tolist() == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_ramp_up_schedule_speeds_up() -> None:
    gaps = _gaps(LoadShape(num_prompts=20001, ramp_up_strategy="linear", ramp_up_start_rps=10.0,
                           ramp_up_end_rps=100.0))
    assert 1.0 / gaps[:1000].mean() == pytest.approx(12.2, rel=0.08)  # mean rate of the span
    assert 1.0 / gaps[-1000:].mean() == pytest.approx(97.8, rel=0.08)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"request_rate": 0.0}, "--request-rate must be positive (inf sends every request at "
                            "once), got 0.0"),
    ({"burstiness": math.inf}, "--burstiness must be positive and finite, got inf"),
    ({"burstiness": 2.0, "arrival": "constant", "request_rate": 1.0},
     "--burstiness must be 1.0 with --arrival constant, got 2.0"),
    ({"duration": 5.0}, "--max-concurrency must be set when --duration runs at an infinite "
                        "--request-rate, got None"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1.0},
     "--ramp-up-end-rps must be positive and finite with --ramp-up-strategy, got None"),
    ({"ramp_up_strategy": "linear", "ramp_up_start_rps": 1.0, "ramp_up_end_rps": 2.0,
      "request_rate": 3.0},
     "--request-rate must be unset with --ramp-up-strategy (the ramp sets the rate), got 3.0"),
    ({"max_concurrency": 0}, "--max-concurrency must be at least 1, got 0"),
])
def test_bad_load_shapes_name_value_and_limit(kwargs: dict, message: str) -> None:
    with pytest.raises(BenchConfigError) as info:
        LoadShape(**kwargs)
    assert str(info.value) == message
