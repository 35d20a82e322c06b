"""``pagedserve bench compare A.json B.json``: what differs between two runs, then their
metrics side by side with B/A ratios.

A file is one run (``pagedserve bench`` or vLLM's ``bench serve``) or a sweep
(``pagedserve bench sweep``). Two sweeps are compared point by point at the sweep values they
share; a sweep against a single run compares each point with that run.
"""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from pagedserve.loadgen.bench_errors import ResultFileError

HEADLINE_KEYS = (
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "peak_running_requests",
)
# What was run, most telling first: a ratio means little when these differ.
SETTING_KEYS = (
    "model_id", "label", "dataset_name", "request_rate", "max_concurrency", "num_prompts",
    "backend", "endpoint_type", "burstiness", "arrival", "n", "best_of", "use_beam_search",
    "temperature", "ignore_eos", "tokenizer_id", "seed", "base_url",
)
REQUIRED_KEYS = ("completed", "duration", "request_throughput")

Run = tuple[str, dict]  # (name within its file: "" or "request_rate=4", result)


def _read(path: str | Path) -> object:
    try:
        return orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise ResultFileError(f"cannot read result file {str(path)!r}: {exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise ResultFileError(f"result file {str(path)!r} is not valid JSON: {exc}") from exc


def _check(path: str | Path, data: object) -> dict:
    missing = [key for key in REQUIRED_KEYS if not isinstance(data, dict) or key not in data]
    if missing:
        raise ResultFileError(f"result file {str(path)!r} is not a benchmark result: "
                              f"missing {', '.join(missing)}")
    assert isinstance(data, dict)
    return data


def load_result(path: str | Path) -> dict:
    """A single-run result JSON as ``pagedserve bench`` (or vLLM's ``bench serve``) writes it."""
    return _check(path, _read(path))


def load_runs(path: str | Path) -> list[Run]:
    """The runs of a result file: one, or one per point of a sweep file."""
    data = _read(path)
    if isinstance(data, dict) and isinstance(data.get("points"), list) and "sweep_key" in data:
        key = str(data["sweep_key"])
        return [(f"{key}={_short(point.get(key) if isinstance(point, dict) else None)}",
                 _check(path, point)) for point in data["points"]]
    return [("", _check(path, data))]


def _short(value: object) -> str:
    return f"{value:g}" if _is_number(value) else str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compared_keys(a: dict, b: dict) -> list[str]:
    """Headline totals first, then every millisecond statistic in A's order."""
    keys = [k for k in HEADLINE_KEYS if k in a or k in b]
    keys += [k for k in a if k.endswith("_ms") and k not in keys]
    keys += [k for k in b if k.endswith("_ms") and k not in keys]
    return keys


def differing_settings(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """(setting, A's value, B's value) for each setting the two runs do not share."""
    return [(key, a.get(key), b.get(key)) for key in SETTING_KEYS
            if (key in a or key in b) and _cell(a.get(key)) != _cell(b.get(key))]


def ratio(value_a: object, value_b: object) -> float | None:
    """B / A, or None when either is missing or A is zero."""
    if not (_is_number(value_a) and _is_number(value_b)) or value_a == 0:
        return None
    return float(value_b) / float(value_a)  # type: ignore[arg-type]


def format_number(value: float) -> str:
    """Four significant digits, without exponents for everyday magnitudes: 0.01234,
    12.35, 1,235, 123,457."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value != value:
        return "nan"
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:,.0f}"
    if magnitude == 0 or magnitude >= 0.001:
        decimals = 0 if magnitude == 0 else max(0, 3 - math.floor(math.log10(magnitude)))
        return f"{value:.{decimals}f}"
    return f"{value:.3g}"


def format_ratio(value: float) -> str:
    """Two decimals in the everyday range, three significant digits outside it."""
    return f"{value:.2f}×" if 0.01 <= value < 100 else f"{value:.3g}×"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return format_number(value)
    return str(value)


def _settings_lines(a: dict, b: dict) -> list[str]:
    differing = differing_settings(a, b)
    if not differing:
        shared = [f"{key}={_cell(a[key])}" for key in SETTING_KEYS[:5] if key in a]
        return ["settings: the same (" + ", ".join(shared) + ")"]
    width = max(len(key) for key, _, _ in differing)
    lines = ["settings that differ:"]
    lines += [f"  {key:<{width}}  A={_cell(va)}  B={_cell(vb)}" for key, va, vb in differing]
    return lines


def _metric_table(a: dict, b: dict) -> list[str]:
    rows = [("metric", "A", "B", "B/A")]
    for key in compared_keys(a, b):
        value_a, value_b = a.get(key), b.get(key)
        r = ratio(value_a, value_b)
        rows.append((key, _cell(value_a), _cell(value_b), "-" if r is None else format_ratio(r)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{row[0]:<{widths[0]}}  " + "  ".join(f"{cell:>{widths[i + 1]}}"
                                                      for i, cell in enumerate(row[1:]))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return lines


def _pairs(a_runs: list[Run], b_runs: list[Run]) -> list[tuple[str, dict, dict]]:
    if len(a_runs) > 1 and len(b_runs) > 1:
        b_by_name = dict(b_runs)
        pairs = [(name, a, b_by_name[name]) for name, a in a_runs if name in b_by_name]
        if not pairs:
            raise ResultFileError("the two sweeps share no sweep value: "
                                  f"{[n for n, _ in a_runs]} vs {[n for n, _ in b_runs]}")
        return pairs
    return [(name_a or name_b, a, b) for name_a, a in a_runs for name_b, b in b_runs]


def format_comparison(a: dict | list[Run], b: dict | list[Run]) -> str:
    """The settings that differ, then the metrics table, for each pair of runs."""
    a_runs = a if isinstance(a, list) else [("", a)]
    b_runs = b if isinstance(b, list) else [("", b)]
    blocks = []
    for name, run_a, run_b in _pairs(a_runs, b_runs):
        lines = [f"== {name} =="] if name else []
        lines += [*_settings_lines(run_a, run_b), "", *_metric_table(run_a, run_b)]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
