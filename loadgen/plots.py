"""PNG plots with matplotlib's object API (Agg canvas, no pyplot): nothing global changes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
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


def _cdf(ax: object, values_s: np.ndarray, label: str, style: str = "-") -> None:
    values = np.sort(values_s) * MS_PER_S
    ax.plot(values, np.arange(1, len(values) + 1) / len(values), style, label=label)


def plot_latency_cdfs(outcome: RunOutcome, n: int, path: Path) -> Path:
    timings = collect_timings(outcome.results, n)
    fig = Figure(figsize=(10, 7), layout="constrained")
    for ax, (name, title) in zip(fig.subplots(2, 2).flat, _CDF_PANELS, strict=True):
        values = getattr(timings, name)
        if values.size:
            _cdf(ax, values, "from send")
        if name in _SCHEDULED and getattr(timings, _SCHEDULED[name]).size:
            _cdf(ax, getattr(timings, _SCHEDULED[name]), "from scheduled send", "--")
            ax.legend(loc="lower right")
        ax.set(title=title, xlabel="ms", ylabel="cumulative fraction", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return path


def plot_timeline(outcome: RunOutcome, path: Path, bin_s: float | None = None) -> Path:
    """Output tokens/s and requests in flight over the run."""
    bin_s = bin_s or max(outcome.duration / 60.0, 0.05)
    starts, tokens_per_s = output_timeline(outcome.results, outcome.start, bin_s)
    fig = Figure(figsize=(10, 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    top.step(starts, tokens_per_s, where="post")
    top.set(ylabel="output tokens/s", title="Throughput over time")
    grid = np.linspace(0.0, outcome.duration, 400)
    running = in_flight_at(outcome.results, outcome.start + grid) if outcome.results else grid * 0
    bottom.step(grid, running, where="post")
    bottom.set(xlabel="seconds since start", ylabel="requests in flight")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return path


def plot_run(outcome: RunOutcome, n: int, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return [plot_latency_cdfs(outcome, n, out / "latency_cdf.png"),
            plot_timeline(outcome, out / "timeline.png")]


def plot_sweep(points: list[dict], sweep_key: str, out_dir: str | Path) -> Path:
    """Latency against achieved request throughput, one marker per sweep point."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    x = [p["request_throughput"] for p in points]
    for ax, name in zip(fig.subplots(1, 2), ("ttft", "e2el"), strict=True):
        for stat in ("median", _highest_percentile(points[0], name)):
            y = [p.get(f"{stat}_{name}_ms") for p in points]
            ax.plot(x, [np.nan if v is None else v for v in y], "o-", label=stat)
        for p, xi in zip(points, x, strict=True):
            ax.annotate(f"{p[sweep_key]}", (xi, p.get(f"median_{name}_ms") or 0.0),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set(title=f"{name.upper()} vs throughput ({sweep_key} labelled)",
               xlabel="request throughput (req/s)", ylabel="ms")
        ax.legend()
        ax.grid(alpha=0.3)
    path = out / "sweep.png"
    fig.savefig(path, dpi=100)
    return path


def _highest_percentile(result: dict, name: str) -> str:
    pattern = re.compile(rf"^p(\d+(?:\.\d+)?)_{name}_ms$")
    found = [m for key in result if (m := pattern.match(key))]
    best = max(found, key=lambda m: float(m.group(1)), default=None)
    return "median" if best is None else f"p{best.group(1)}"
