"""The result JSON (vLLM's field names where the meaning is the same), the per-request JSONL
and the summary table printed at the end of a run."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import orjson

from pagedserve.loadgen.metrics import BenchmarkMetrics, Distribution, request_tpot
from pagedserve.loadgen.request import RequestResult

# Metrics beyond vLLM's four, always reported: latency from the scheduled send time and
# the client's own delays.
SCHEDULE_METRICS = ("sched_ttft", "sched_e2el")
CLIENT_METRICS = ("client_lag", "queue_wait", "loop_lag")
METRIC_TITLES = {
    "ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency", "e2el": "End-to-end Latency",
    "sched_ttft": "TTFT from scheduled send", "sched_e2el": "E2EL from scheduled send",
    "client_lag": "Client lag behind schedule", "queue_wait": "Wait for a concurrency slot",
    "loop_lag": "Event-loop backlog",
}
MAX_LISTED_FAILURES = 10


def percentile_key(p: float) -> str:
    """vLLM's spelling: 99 → ``p99``, 99.9 → ``p99.9``."""
    return "p" + (str(int(p)) if int(p) == p else str(p))


def distribution_fields(name: str, dist: Distribution | None,
                        percentiles: Sequence[float], with_max: bool = False) -> dict:
    fields: dict[str, float | None] = {
        f"mean_{name}_ms": dist.mean if dist else None,
        f"median_{name}_ms": dist.median if dist else None,
        f"std_{name}_ms": dist.std if dist else None,
    }
    for p in percentiles:
        fields[f"{percentile_key(p)}_{name}_ms"] = dist.percentiles[float(p)] if dist else None
    if with_max:
        fields[f"max_{name}_ms"] = dist.max if dist else None
    return fields


def metrics_fields(metrics: BenchmarkMetrics, percentile_metrics: Sequence[str],
                   percentiles: Sequence[float]) -> dict:
    """Totals, throughputs and the latency statistics of one run."""
    fields: dict[str, object] = {
        "duration": metrics.duration,
        "completed": metrics.completed,
        "failed": metrics.failed,
        "total_input_tokens": metrics.total_input,
        "total_output_tokens": metrics.total_output,
        "request_throughput": metrics.request_throughput,
        "request_goodput": metrics.request_goodput,
        "output_throughput": metrics.output_throughput,
        "total_token_throughput": metrics.total_token_throughput,
        "max_output_tokens_per_s": metrics.max_output_tokens_per_s,
        "peak_running_requests": metrics.peak_running_requests,
    }
    for name in percentile_metrics:
        fields.update(distribution_fields(name, metrics.distributions[name], percentiles))
    for name in SCHEDULE_METRICS + CLIENT_METRICS:
        fields.update(distribution_fields(name, metrics.distributions[name], percentiles,
                                          with_max=True))
    return fields


def failure_fields(results: Sequence[RequestResult]) -> dict:
    failed = [r for r in results if not r.success]
    return {
        "failures": [{"request_id": r.request_id, "error": r.error} for r in failed],
        "error_counts": dict(Counter(error_kind(r.error) for r in failed).most_common()),
    }


def error_kind(error: str) -> str:
    """The error's class without request-specific detail: ``HTTP 500``, ``ClientPayloadError``."""
    head = error.split(":", 1)[0]
    return head if head else "unknown"


def detailed_fields(results: Sequence[RequestResult], n: int) -> dict:
    """vLLM's per-request lists (``--save-detailed``); None where a request failed."""
    return {
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [(r.output_tokens or 0) if r.success else 0 for r in results],
        "ttfts": [r.ttft if r.success else None for r in results],  # None: unstreamed
        "tpots": [request_tpot(r, n) if r.success else None for r in results],
        "itls": [np.diff(r.chunk_times).tolist() for r in results],
        "e2els": [r.e2el if r.success else None for r in results],
        "generated_texts": [r.text for r in results],
        "errors": [r.error for r in results],
    }


def request_record(r: RequestResult, start: float, n: int) -> dict:
    """One JSONL line: times in seconds from the run's start, latencies in ms."""
    first = r.chunk_times[0] if r.chunk_times else None
    tpot = request_tpot(r, n) if r.success else None
    return {
        "request_id": r.request_id,
        "success": r.success,
        "error": r.error,
        "prompt_len": r.prompt_len,
        "max_tokens": r.max_tokens,
        "usage_prompt_tokens": r.usage_prompt_tokens,
        "output_tokens": r.output_tokens,
        "output_tokens_source": r.output_tokens_source,
        "scheduled_s": r.scheduled - start,
        "started_s": r.started - start,
        "sent_s": r.sent - start,
        "first_chunk_s": None if first is None else first - start,
        "finished_s": r.finished - start,
        "ttft_ms": r.ttft * 1000.0 if r.success and r.ttft is not None else None,
        "tpot_ms": None if tpot is None else tpot * 1000.0,
        "e2el_ms": r.e2el * 1000.0 if r.success else None,
        "itl_ms": (np.diff(r.chunk_times) * 1000.0).tolist(),
    }


def write_json(path: str | Path, data: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(_finite(data), option=orjson.OPT_INDENT_2) + b"\n")
    return path


def write_request_jsonl(path: str | Path, results: Sequence[RequestResult], start: float,
                        n: int) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for r in results:
            out.write(orjson.dumps(request_record(r, start, n)) + b"\n")
    return path


def _finite(value: object) -> object:
    """JSON has no infinity: an infinite rate is written as the string "inf", as vLLM does."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def timestamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")
