"""Metric arithmetic on hand-made timestamps (binary fractions, so every value is exact)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagedserve.loadgen.metrics import (
    calculate_metrics,
    collect_timings,
    count_good,
    output_timeline,
    peak_in_flight,
    request_tpot,
    summarize,
)
from pagedserve.loadgen.report import metrics_fields, percentile_key
from pagedserve.loadgen.request import RequestResult
from pagedserve.loadgen.runner import RunOutcome


def _result(rid: int, sent: float, chunks: list[float], finished: float, out: int | None,
            prompt_len: int = 10, error: str = "", scheduled: float | None = None,
            started: float | None = None) -> RequestResult:
    return RequestResult(
        request_id=rid, prompt_len=prompt_len, max_tokens=8,
        scheduled=sent if scheduled is None else scheduled,
        started=sent if started is None else started, sent=sent, finished=finished,
        chunk_times=chunks, success=not error, error=error, output_tokens=out,
        output_tokens_source="usage" if out is not None else "")


@pytest.fixture
def outcome() -> RunOutcome:
    results = [
        # TTFT 0.25, E2EL 1.25, 5 tokens → TPOT (1.25 - 0.25) / 4 = 0.25; ITLs 0.25, 0.5.
        _result(0, 1.0, [1.25, 1.5, 2.0], 2.25, 5, prompt_len=10, scheduled=0.75,
                started=0.875),
        # One token: no TPOT (0 for goodput), no ITL.
        _result(1, 2.0, [2.5], 2.5, 1, prompt_len=20),
        # TTFT 0.125, E2EL 0.5, 3 tokens → TPOT 0.1875; ITLs 0.125, 0.125.
        _result(2, 3.0, [3.125, 3.25, 3.375], 3.5, 3, prompt_len=30),
        _result(3, 4.0, [], 4.5, None, prompt_len=40, error="HTTP 500: boom"),
    ]
    results[2].usage_prompt_tokens = 33  # the server's count wins over the dataset's
    return RunOutcome(results=results, start=1.0, duration=4.0, loop_lag=[0.001, 0.003])


def test_totals_and_throughputs(outcome: RunOutcome) -> None:
    m = calculate_metrics(outcome, n=1, percentiles=[50, 90, 99])
    assert (m.completed, m.failed) == (3, 1)
    assert m.total_input == 10 + 20 + 33
    assert m.total_output == 5 + 1 + 3
    assert m.request_throughput == 0.75
    assert m.output_throughput == 9 / 4
    assert m.total_token_throughput == (63 + 9) / 4
    assert m.request_goodput is None
    assert m.peak_running_requests == 2  # requests 0 and 1 overlap on [2.0, 2.25]


def test_latency_distributions_are_exact(outcome: RunOutcome) -> None:
    d = calculate_metrics(outcome, n=1, percentiles=[50, 90, 99]).distributions
    ttft = d["ttft"]
    assert ttft.mean == pytest.approx((250 + 500 + 125) / 3, abs=1e-9)
    assert ttft.median == 250.0
    mean = (250 + 500 + 125) / 3
    assert ttft.std == pytest.approx(
        math.sqrt(((250 - mean) ** 2 + (500 - mean) ** 2 + (125 - mean) ** 2) / 3), abs=1e-9)
    # Linear interpolation on [125, 250, 500]: rank 1.8 and 1.98.
    assert ttft.percentiles == {50.0: 250.0, 90.0: 450.0, 99.0: 495.0}
    assert d["tpot"].mean == 218.75 and d["tpot"].percentiles[90.0] == 243.75
    assert d["itl"].mean == 250.0 and d["itl"].median == 187.5 and d["itl"].max == 500.0
    assert d["e2el"].mean == 750.0 and d["e2el"].median == 500.0
    assert d["sched_ttft"].max == 500.0  # request 0: first chunk 1.25, scheduled 0.75
    assert d["client_lag"].max == 125.0  # request 0 started 0.125 s behind schedule
    assert d["queue_wait"].max == 125.0  # ... and waited 0.125 s for a slot
    assert d["loop_lag"].mean == pytest.approx(2.0) and d["loop_lag"].max == 3.0


def test_tpot_uses_tokens_per_choice_with_n() -> None:
    r = _result(0, 1.0, [1.25, 1.5, 2.0], 2.25, 10)
    assert request_tpot(r, n=2) == 0.25
    assert request_tpot(r, n=10) is None


@pytest.mark.parametrize(("slos", "good"), [
    ({"ttft": 300.0, "tpot": 200.0}, 1),  # only request 2
    ({"tpot": 0.0}, 1),  # a one-token request has TPOT 0 for goodput
    ({"e2el": 500.0}, 2),  # the limit itself is within the SLO
    ({"ttft": 1000.0}, 3),
])
def test_goodput_counts_requests_within_every_slo(outcome: RunOutcome, slos: dict,
                                                  good: int) -> None:
    assert count_good(outcome.results, 1, slos) == good
    m = calculate_metrics(outcome, n=1, percentiles=[99], goodput_ms=slos)
    assert m.request_goodput == good / 4


def test_output_timeline_spreads_tokens_over_chunks(outcome: RunOutcome) -> None:
    starts, rate = output_timeline(outcome.results, outcome.start, bin_s=1.0)
    assert starts.tolist() == [0.0, 1.0, 2.0]
    # Bin 0: two of request 0's chunks (5/3 tokens each); bin 1: its last chunk and request
    # 1's; bin 2: request 2's three chunks.
    assert rate == pytest.approx([10 / 3, 5 / 3 + 1, 3])
    assert calculate_metrics(outcome, 1, [99]).max_output_tokens_per_s == pytest.approx(10 / 3)


def test_empty_metrics_are_none_not_zero() -> None:
    assert summarize([], [50]) is None
    only_failures = RunOutcome([_result(0, 1.0, [], 2.0, None, error="HTTP 500: x")], 1.0,
                               1.0, [])
    m = calculate_metrics(only_failures, 1, [99])
    assert m.completed == 0 and m.distributions["ttft"] is None
    fields = metrics_fields(m, ["ttft"], [99])
    assert fields["mean_ttft_ms"] is None and fields["p99_ttft_ms"] is None
    assert peak_in_flight([]) == 0


def test_result_field_names_follow_vllm(outcome: RunOutcome) -> None:
    m = calculate_metrics(outcome, 1, [50, 99.9])
    fields = metrics_fields(m, ["ttft", "tpot", "itl", "e2el"], [50, 99.9])
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99.9"):
            assert f"{stat}_{name}_ms" in fields
    for key in ("completed", "total_input_tokens", "total_output_tokens", "request_throughput",
                "output_throughput", "total_token_throughput", "request_goodput", "duration",
                "max_output_tokens_per_s"):
        assert key in fields
    assert percentile_key(99.0) == "p99" and percentile_key(99.9) == "p99.9"


def test_itl_concatenates_every_gap(outcome: RunOutcome) -> None:
    timings = collect_timings(outcome.results, 1)
    assert np.array_equal(timings.itl, [0.25, 0.5, 0.125, 0.125])
    assert np.array_equal(timings.e2el, [1.25, 0.5, 0.5])
