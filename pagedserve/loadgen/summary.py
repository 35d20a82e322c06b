"""The plain-text summary of a result, read back from the result dict so the table and the
JSON can never disagree."""

from __future__ import annotations

from collections.abc import Sequence

from pagedserve.loadgen.report import (
    CLIENT_METRICS,
    MAX_LISTED_FAILURES,
    METRIC_TITLES,
    SCHEDULE_METRICS,
    percentile_key,
)

WIDTH = 64
_LABEL = 46


def _title(text: str, fill: str = "=") -> str:
    return f" {text} ".center(WIDTH, fill)


def _row(label: str, value: object) -> str:
    if value is None:
        shown = "-"
    elif isinstance(value, float):
        shown = f"{value:.2f}"
    else:
        shown = str(value)
    return f"{label + ':':<{_LABEL}}{shown:>{WIDTH - _LABEL}}"


def _metric_rows(result: dict, name: str, short: str, percentiles: Sequence[float],
                 with_max: bool) -> list[str]:
    rows = [_row(f"Mean {short} (ms)", result.get(f"mean_{name}_ms")),
            _row(f"Median {short} (ms)", result.get(f"median_{name}_ms")),
            _row(f"Std {short} (ms)", result.get(f"std_{name}_ms"))]
    for p in percentiles:
        key = percentile_key(p)
        rows.append(_row(f"{key.upper()} {short} (ms)", result.get(f"{key}_{name}_ms")))
    if with_max:
        rows.append(_row(f"Max {short} (ms)", result.get(f"max_{name}_ms")))
    return rows


def format_summary(result: dict, percentile_metrics: Sequence[str],
                   percentiles: Sequence[float]) -> str:
    lines = [_title("Serving Benchmark Result")]
    lines += [
        _row("Successful requests", result["completed"]),
        _row("Failed requests", result["failed"]),
        _row("Request rate (req/s)", result.get("request_rate")),
        _row("Maximum request concurrency", result.get("max_concurrency")),
        _row("Benchmark duration (s)", result["duration"]),
        _row("Total input tokens", result["total_input_tokens"]),
        _row("Total generated tokens", result["total_output_tokens"]),
        _row("Request throughput (req/s)", result["request_throughput"]),
    ]
    if result.get("request_goodput") is not None:
        lines.append(_row("Request goodput (req/s)", result["request_goodput"]))
    lines += [
        _row("Output token throughput (tok/s)", result["output_throughput"]),
        _row("Peak output token throughput (tok/s)", result["max_output_tokens_per_s"]),
        _row("Peak running requests", result["peak_running_requests"]),
        _row("Total token throughput (tok/s)", result["total_token_throughput"]),
    ]
    if result.get("streamed") is False:
        lines.append(_row("TTFT, TPOT, ITL (requests not streamed)", "n/a"))
    for name in percentile_metrics:
        if result.get("streamed") is False and name != "e2el":
            continue
        lines.append(_title(METRIC_TITLES[name], "-"))
        lines += _metric_rows(result, name, name.upper(), percentiles, with_max=False)
    lines.append(_title("From scheduled send time (incl. client queueing)", "-"))
    for name in SCHEDULE_METRICS:
        short = name.removeprefix("sched_").upper() + " sched"
        lines += _metric_rows(result, name, short, percentiles[-1:], with_max=True)
    lines.append(_title("Load generator", "-"))
    for name in CLIENT_METRICS:
        lines += [_row(f"Mean {METRIC_TITLES[name].lower()} (ms)", result.get(f"mean_{name}_ms")),
                  _row(f"Max {METRIC_TITLES[name].lower()} (ms)", result.get(f"max_{name}_ms"))]
    lines += _failure_lines(result)
    lines.append("=" * WIDTH)
    return "\n".join(lines)


def _failure_lines(result: dict) -> list[str]:
    failures = result.get("failures") or []
    if not failures:
        return []
    lines = [_title("Failed requests", "-")]
    lines += [_row(f"  {kind}", count) for kind, count in result["error_counts"].items()]
    for failure in failures[:MAX_LISTED_FAILURES]:
        lines.append(f"  #{failure['request_id']}: {failure['error'][:WIDTH * 2]}")
    if len(failures) > MAX_LISTED_FAILURES:
        lines.append(f"  ... and {len(failures) - MAX_LISTED_FAILURES} more in the result JSON")
    return lines
