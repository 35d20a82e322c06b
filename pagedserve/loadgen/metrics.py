"""Benchmark metrics from per-request results (definitions in loadgen/README.md).

Where vLLM's ``bench serve`` defines a metric the arithmetic is the same: TTFT from send to
the first chunk with a token; TPOT = (E2EL − TTFT) / (output tokens − 1) over requests with more
than one output token; ITL = gaps between consecutive text chunks; population std; linear
percentiles; goodput counts a request good when every chosen metric is within its SLO (a
request of one output token has TPOT 0 there). Throughputs divide by the run's duration.
Unstreamed requests (best_of, beam search) have no TTFT, TPOT or ITL: they count in E2EL,
throughput and goodput only (an SLO on TTFT or TPOT cannot be judged for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from pagedserve.loadgen.request import RequestResult
from pagedserve.loadgen.runner import RunOutcome

MS_PER_S = 1000.0


@dataclass(frozen=True, slots=True)
class Distribution:
    """Summary statistics of one metric, in milliseconds."""

    mean: float
    median: float
    std: float
    percentiles: dict[float, float]
    max: float


def summarize(values_s: Sequence[float] | np.ndarray,
              percentiles: Sequence[float]) -> Distribution | None:
    """Statistics of ``values_s`` (seconds) in ms; None when there are no values."""
    values = np.asarray(values_s, dtype=np.float64) * MS_PER_S
    if values.size == 0:
        return None
    return Distribution(
        mean=float(np.mean(values)),
        median=float(np.median(values)),
        std=float(np.std(values)),
        percentiles={float(p): float(np.percentile(values, p)) for p in percentiles},
        max=float(np.max(values)),
    )


def tokens_per_choice(result: RequestResult, n: int) -> float:
    return (result.output_tokens or 0) / n


def request_tpot(result: RequestResult, n: int) -> float | None:
    """(E2EL − TTFT) / (output tokens per choice − 1); None with one token or fewer, or
    without a TTFT (an unstreamed request)."""
    per_choice = tokens_per_choice(result, n)
    ttft = result.ttft
    if per_choice <= 1 or ttft is None:
        return None
    return (result.e2el - ttft) / (per_choice - 1)


@dataclass(slots=True)
class RequestTimings:
    """Per-request values in seconds, successful requests only unless noted."""

    ttft: np.ndarray
    tpot: np.ndarray  # requests with more than one output token per choice
    itl: np.ndarray  # every gap of every request, concatenated
    e2el: np.ndarray
    sched_ttft: np.ndarray  # first text chunk − scheduled send time
    sched_e2el: np.ndarray  # end of stream − scheduled send time
    client_lag: np.ndarray  # all requests: coroutine start − scheduled send time
    queue_wait: np.ndarray  # all requests: wait for a --max-concurrency slot


def collect_timings(results: Sequence[RequestResult], n: int) -> RequestTimings:
    ok = [r for r in results if r.success]
    streamed = [r for r in ok if r.chunk_times]
    tpots = [t for r in ok if (t := request_tpot(r, n)) is not None]
    gaps = [np.diff(r.chunk_times) for r in streamed]
    return RequestTimings(
        ttft=np.array([r.chunk_times[0] - r.sent for r in streamed]),
        tpot=np.array(tpots),
        itl=np.concatenate(gaps) if gaps else np.array([]),
        e2el=np.array([r.e2el for r in ok]),
        sched_ttft=np.array([r.chunk_times[0] - r.scheduled for r in streamed]),
        sched_e2el=np.array([r.finished - r.scheduled for r in ok]),
        client_lag=np.array([r.started - r.scheduled for r in results]),
        queue_wait=np.array([r.sent - r.started for r in results]),
    )


def count_good(results: Sequence[RequestResult], n: int, slos_ms: dict[str, float]) -> int:
    """Successful requests whose every SLO'd metric is at or under its limit."""
    limits = {name: slo / MS_PER_S for name, slo in slos_ms.items()}
    good = 0
    for r in results:
        if not r.success:
            continue
        ttft = r.ttft
        values = {"ttft": ttft, "tpot": request_tpot(r, n) or 0.0, "e2el": r.e2el}
        if ttft is None:  # unstreamed: only the end-to-end latency is known
            values.update(ttft=0.0, tpot=0.0)
        good += all(values[name] <= limit for name, limit in limits.items())
    return good


def output_timeline(results: Sequence[RequestResult], start: float,
                    bin_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Output tokens per second in ``bin_s`` bins from ``start``: (bin starts, tokens/s).

    A request's output tokens are spread evenly over its text chunks, which is one token
    per chunk for servers that stream token by token.
    """
    times, weights = [], []
    for r in results:
        if r.success and r.chunk_times:
            times.extend(r.chunk_times)
            weights.extend([(r.output_tokens or 0) / len(r.chunk_times)] * len(r.chunk_times))
    if not times:
        return np.zeros(0), np.zeros(0)
    offsets = np.asarray(times) - start
    num_bins = int(np.floor(max(offsets.max(), 0.0) / bin_s)) + 1
    tokens = np.bincount(np.clip((offsets / bin_s).astype(np.int64), 0, None),
                         weights=weights, minlength=num_bins)
    return np.arange(num_bins) * bin_s, tokens / bin_s


def in_flight_at(results: Sequence[RequestResult], times: np.ndarray) -> np.ndarray:
    """How many requests had been sent and not yet finished at each of ``times``."""
    sent = np.sort([r.sent for r in results])
    finished = np.sort([r.finished for r in results])
    return (np.searchsorted(sent, times, side="right")
            - np.searchsorted(finished, times, side="right"))


def peak_in_flight(results: Sequence[RequestResult]) -> int:
    """The most requests in flight at once (a send and a finish at the same instant: the
    finish counts first)."""
    if not results:
        return 0
    sends = np.array([r.sent for r in results])
    return int(in_flight_at(results, sends).max())


@dataclass(slots=True)
class BenchmarkMetrics:
    completed: int
    failed: int
    total_input: int
    total_output: int
    duration: float
    request_throughput: float
    request_goodput: float | None
    output_throughput: float
    total_token_throughput: float
    max_output_tokens_per_s: float
    peak_running_requests: int
    distributions: dict[str, Distribution | None]


def calculate_metrics(outcome: RunOutcome, n: int, percentiles: Sequence[float],
                      goodput_ms: dict[str, float] | None = None) -> BenchmarkMetrics:
    results = outcome.results
    ok = [r for r in results if r.success]
    total_input = sum(r.usage_prompt_tokens if r.usage_prompt_tokens is not None
                      else r.prompt_len for r in ok)
    total_output = sum(r.output_tokens or 0 for r in ok)
    duration = outcome.duration
    timings = collect_timings(results, n)
    _, tokens_per_s = output_timeline(results, outcome.start)
    distributions = {name: summarize(getattr(timings, name), percentiles)
                     for name in (f.name for f in fields(RequestTimings))}
    distributions["loop_lag"] = summarize(outcome.loop_lag, percentiles)
    good = count_good(results, n, goodput_ms) if goodput_ms else None
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(results) - len(ok),
        total_input=total_input,
        total_output=total_output,
        duration=duration,
        request_throughput=len(ok) / duration,
        request_goodput=None if good is None else good / duration,
        output_throughput=total_output / duration,
        total_token_throughput=(total_input + total_output) / duration,
        max_output_tokens_per_s=float(tokens_per_s.max()) if tokens_per_s.size else 0.0,
        peak_running_requests=peak_in_flight(results),
        distributions=distributions,
    )
