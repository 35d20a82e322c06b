"""PNG plots with matplotlib's object API (Agg canvas, no pyplot): nothing global changes.

Every figure is titled with the run it shows (model, request rate, number of prompts, label),
so a PNG found later still says where it came from. Latency CDFs mark p50 and p99; the
timeline states its bin size.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pagedserve.loadgen.metrics import (
    MS_PER_S,
    collect_timings,
    in_flight_at,
    output_timeline,
)
from pagedserve.loadgen.runner import RunOutcome

_CDF_PANELS = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2el", "E2E latency"))
_SCHEDULED = {"ttft": "sched_ttft", "e2el": "sched_e2el"}
_SWEEP_PANELS = ("ttft", "tpot", "e2el")
MARKED_PERCENTILES = (50.0, 99.0)


def _rate(value: object) -> str:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g} req/s"
    return "inf req/s" if value in ("inf", None) else f"{value} req/s"


def run_title(result: dict) -> str:
    """``model · rate · N prompts · concurrency · label`` from a result's header fields."""
    parts = [str(result.get("model_id") or "model ?"), _rate(result.get("request_rate")),
             f"{result.get('num_prompts', '?')} prompts"]
    if result.get("max_concurrency"):
        parts.append(f"max concurrency {result['max_concurrency']}")
    if result.get("label"):
        parts.append(str(result["label"]))
    return " · ".join(parts)


def sweep_title(points: list[dict], sweep_key: str) -> str:
    first = points[0] if points else {}
    parts = [str(first.get("model_id") or "model ?"), f"sweep over {sweep_key}",
             f"{first.get('num_prompts', '?')} prompts per point"]
    if first.get("label"):
        parts.append(str(first["label"]))
    return " · ".join(parts)


def _cdf(ax: Axes, values_ms: np.ndarray, label: str, style: str = "-") -> None:
    values = np.sort(values_ms)
    ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, label=label)


def _mark_percentiles(ax: Axes, values_ms: np.ndarray) -> None:
    for p, style in zip(MARKED_PERCENTILES, (":", "--"), strict=True):
        at = float(np.percentile(values_ms, p))
        ax.axvline(at, color="grey", linestyle=style, linewidth=1)
        ax.annotate(f"p{p:g} {at:.3g} ms", (at, p / 100.0), textcoords="offset points",
                    xytext=(4, -10), fontsize=8)


def latency_cdf_figure(outcome: RunOutcome, n: int, title: str) -> Figure:
    timings = collect_timings(outcome.results, n)
    fig = Figure(figsize=(10, 7.5), layout="constrained")
    fig.suptitle(title)
    for ax, (name, label) in zip(fig.subplots(2, 2).flat, _CDF_PANELS, strict=True):
        values = getattr(timings, name) * MS_PER_S
        if values.size:
            _cdf(ax, values, "from send")
            _mark_percentiles(ax, values)
        else:
            ax.text(0.5, 0.5, "not applicable (requests not streamed)" if name != "e2el"
                    else "no successful request", ha="center", transform=ax.transAxes)
        if name in _SCHEDULED and getattr(timings, _SCHEDULED[name]).size:
            _cdf(ax, getattr(timings, _SCHEDULED[name]) * MS_PER_S, "from scheduled send", "--")
            ax.legend(loc="lower right")
        ax.set(title=label, xlabel="ms", ylabel="cumulative fraction", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    return fig


def timeline_figure(outcome: RunOutcome, title: str, bin_s: float | None = None) -> Figure:
    """Output tokens/s (in bins of ``bin_s``) and requests in flight over the run."""
    bin_s = bin_s or max(outcome.duration / 60.0, 0.05)
    starts, tokens_per_s = output_timeline(outcome.results, outcome.start, bin_s)
    fig = Figure(figsize=(10, 6), layout="constrained")
    fig.suptitle(title)
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.step(starts, tokens_per_s, where="post")
    top.set(ylabel="output tokens/s", title=f"Throughput over time ({bin_s:.3g} s bins)")
    grid = np.linspace(0.0, outcome.duration, 400)
    running = in_flight_at(outcome.results, outcome.start + grid) if outcome.results else grid * 0
    bottom.step(grid, running, where="post")
    bottom.set(xlabel="seconds since start", ylabel="requests in flight")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    return fig


def plot_run(outcome: RunOutcome, n: int, out_dir: str | Path,
             result: dict | None = None) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    title = run_title(result or {})
    paths = [out / "latency_cdf.png", out / "timeline.png"]
    for fig, path in zip((latency_cdf_figure(outcome, n, title), timeline_figure(outcome, title)),
                         paths, strict=True):
        fig.savefig(path, dpi=100)
    return paths


def sweep_figure(points: list[dict], sweep_key: str) -> Figure:
    """p50 and p99 latency against achieved request throughput, one marker per point."""
    fig = Figure(figsize=(15, 4.8), layout="constrained")
    fig.suptitle(sweep_title(points, sweep_key))
    x = [p["request_throughput"] for p in points]
    for ax, name in zip(fig.subplots(1, len(_SWEEP_PANELS)), _SWEEP_PANELS, strict=True):
        for stat in ("median", _highest_percentile(points[0], name)):
            y = [p.get(f"{stat}_{name}_ms") for p in points]
            ax.plot(x, [np.nan if v is None else v for v in y], "o-",
                    label="p50" if stat == "median" else stat)
        for p, xi in zip(points, x, strict=True):
            ax.annotate(f"{p[sweep_key]}", (xi, p.get(f"median_{name}_ms") or 0.0),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set(title=f"{name.upper()} vs throughput ({sweep_key} labelled)",
               xlabel="request throughput (req/s)", ylabel="ms")
        ax.legend()
        ax.grid(alpha=0.3)
    return fig


def plot_sweep(points: list[dict], sweep_key: str, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sweep.png"
    sweep_figure(points, sweep_key).savefig(path, dpi=100)
    return path


def _highest_percentile(result: dict, name: str) -> str:
    pattern = re.compile(rf"^p(\d+(?:\.\d+)?)_{name}_ms$")
    found = [m for key in result if (m := pattern.match(key))]
    best = max(found, key=lambda m: float(m.group(1)), default=None)
    return "median" if best is None else f"p{best.group(1)}"
