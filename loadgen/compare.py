"""``pagedserve bench compare A.json B.json``: two results side by side, with B/A ratios."""

from __future__ import annotations

import math
from pathlib import Path

import orjson

from pagedserve.loadgen.errors import ResultFileError

HEADLINE_KEYS = (
    "completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
    "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
    "max_output_tokens_per_s", "peak_running_requests",
)
REQUIRED_KEYS = ("completed", "duration", "request_throughput")


def load_result(path: str | Path) -> dict:
    """A single-run result JSON as ``pagedserve bench`` (or vLLM's ``bench serve``) writes it."""
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise ResultFileError(f"cannot read result file {str(path)!r}: {exc}") from exc
    except orjson.JSONDecodeError as exc:
        raise ResultFileError(f"result file {str(path)!r} is not valid JSON: {exc}") from exc
    missing = [key for key in REQUIRED_KEYS if not isinstance(data, dict) or key not in data]
    if missing:
        raise ResultFileError(f"result file {str(path)!r} is not a benchmark result: "
                              f"missing {', '.join(missing)}")
    return data


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def compared_keys(a: dict, b: dict) -> list[str]:
    """Headline totals first, then every millisecond statistic in A's order."""
    keys = [k for k in HEADLINE_KEYS if k in a or k in b]
    keys += [k for k in a if k.endswith("_ms") and k not in keys]
    keys += [k for k in b if k.endswith("_ms") and k not in keys]
    return keys


def ratio(value_a: object, value_b: object) -> float | None:
    """B / A, or None when either is missing or A is zero."""
    if not (_is_number(value_a) and _is_number(value_b)) or value_a == 0:
        return None
    return float(value_b) / float(value_a)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.2f}"
    return str(value)


def format_comparison(a: dict, b: dict, label_a: str = "A", label_b: str = "B") -> str:
    rows = [("metric", label_a, label_b, "B/A")]
    for key in compared_keys(a, b):
        value_a, value_b = a.get(key), b.get(key)
        r = ratio(value_a, value_b)
        rows.append((key, _cell(value_a), _cell(value_b), "-" if r is None else f"{r:.3f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{row[0]:<{widths[0]}}  " + "  ".join(f"{cell:>{widths[i + 1]}}"
                                                      for i, cell in enumerate(row[1:]))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
