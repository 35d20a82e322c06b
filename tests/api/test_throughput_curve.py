"""The server's own throughput curve: tokens per second per running count, from its steps."""

from __future__ import annotations

import math

import pytest

from pagedserve.server.api.telemetry.throughput_curve import BestRunning, ThroughputCurve
from pagedserve.server.engine.engine_stats import StepStats


def step(tokens: int, duration_s: float) -> StepStats:
    return StepStats(num_prefill_tokens=0, num_decode_tokens=tokens, duration_s=duration_s,
                     num_preempted=0, num_running=tokens, num_waiting=0, finished=[])


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(curve: ThroughputCurve, clock: Clock, tokens: int, step_s: float, steps: int,
        pause_s: float = 0.0) -> None:
    for _ in range(steps):
        clock.now += pause_s + step_s
        curve(step(tokens, step_s))


def test_names_nothing_until_a_count_is_measured_enough():
    clock = Clock()
    curve = ThroughputCurve(memory_s=math.inf, clock=clock)  # nothing fades
    run(curve, clock, 8, 0.05, 15)  # 0.75 s but 15 steps
    assert curve.best() is None
    run(curve, clock, 8, 0.05, 1)
    assert curve.best() == BestRunning(8, pytest.approx(160.0))
    run(curve, clock, 64, 0.01, 40)  # 40 steps but 0.4 s
    assert curve.best() == BestRunning(8, pytest.approx(160.0))


def test_the_largest_count_within_a_few_percent_of_the_most_is_best():
    clock = Clock()
    curve = ThroughputCurve(clock=clock)
    run(curve, clock, 16, 0.010, 100)  # 1,600 tok/s
    run(curve, clock, 64, 0.025, 100)  # 2,560 tok/s
    run(curve, clock, 128, 0.0512, 100)  # 2,500 tok/s: within 3% of the most
    run(curve, clock, 256, 0.128, 100)  # 2,000 tok/s
    best = curve.best()
    assert best is not None and best.running == 128
    assert best.tokens_per_s == pytest.approx(2500.0)


def test_a_pause_shorter_than_a_step_counts_and_an_idle_engine_does_not():
    clock = Clock()
    curve = ThroughputCurve(memory_s=math.inf, clock=clock)
    run(curve, clock, 10, 0.02, 50, pause_s=0.005)  # the loop's own work between steps
    # The first step has no step before it, so no pause: 500 tokens in 50 steps, 49 pauses.
    assert curve.best() == BestRunning(10, pytest.approx(500 / (50 * 0.02 + 49 * 0.005)))
    clock = Clock()
    curve = ThroughputCurve(memory_s=math.inf, clock=clock)
    run(curve, clock, 10, 0.02, 50, pause_s=1.0)  # waiting for work between steps
    assert curve.best() == BestRunning(10, pytest.approx(500.0))


def test_a_step_counts_the_requests_it_ran_and_the_tokens_it_sampled():
    # Two requests of n=4 each, one finishing in the step: 8 tokens from 2 requests.
    clock = Clock()
    curve = ThroughputCurve(memory_s=math.inf, clock=clock)
    for _ in range(20):
        clock.now += 0.04
        curve(StepStats(num_prefill_tokens=0, num_decode_tokens=8, duration_s=0.04,
                        num_preempted=0, num_running=1, num_waiting=3, finished=[object()]))
    assert curve.best() == BestRunning(2, pytest.approx(200.0))


def test_old_measurements_fade_and_steps_that_sampled_nothing_are_left_out():
    clock = Clock()
    curve = ThroughputCurve(memory_s=60.0, clock=clock)
    run(curve, clock, 32, 0.02, 100)
    run(curve, clock, 0, 0.5, 10)  # prefill chunks: no running count to charge
    assert curve.best() == BestRunning(32, pytest.approx(1600.0))
    clock.now += 60.0 * math.log(100 / 15)  # 100 steps faded to 15
    assert curve.best() is None
    with pytest.raises(ValueError, match="memory_s must be positive"):
        ThroughputCurve(memory_s=0.0)
