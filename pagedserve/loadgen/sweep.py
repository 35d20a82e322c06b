"""``pagedserve bench sweep``: one benchmark per request rate or per concurrency cap, on the
same prompts, giving the throughput–latency curve."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pagedserve.loadgen.bench import (
    BenchOutput,
    BenchSettings,
    make_counter,
    make_session,
    prepare_samples,
    run_once,
)
from pagedserve.loadgen.bench_errors import BenchConfigError

SWEEP_OPTIONS = {"request_rate": "--sweep-request-rates",
                 "max_concurrency": "--sweep-max-concurrency"}


def sweep_points(key: str, values: Sequence[float]) -> list[float | int]:
    """The validated, deduplicated values of one sweep, in the order given."""
    option = SWEEP_OPTIONS[key]
    points: list[float | int] = []
    for value in values:
        if key == "max_concurrency":
            if value != int(value) or value < 1:
                raise BenchConfigError(option, value, "whole numbers of at least 1")
            value = int(value)
        elif not value > 0:
            raise BenchConfigError(option, value, "positive rates (inf allowed)")
        if value not in points:
            points.append(value)
    if not points:
        raise BenchConfigError(option, list(values), "at least one value")
    return points


async def sweep(settings: BenchSettings, key: str,
                values: Sequence[float | int]) -> list[BenchOutput]:
    """Runs every point in order; the dataset is drawn once and shared by all points."""
    shapes = [settings.with_shape(**{key: value}) for value in values]  # validate all first
    async with make_session(None) as session:
        counter = make_counter(settings, session)
        samples = await prepare_samples(settings, counter)
        return [await run_once(session, counter, samples, shape) for shape in shapes]


def format_sweep_table(key: str, points: list[dict]) -> str:
    columns = [(key, key), ("completed", "ok"), ("failed", "failed"),
               ("request_throughput", "req/s"), ("output_throughput", "out tok/s"),
               ("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99"),
               ("median_tpot_ms", "TPOT p50"), ("median_e2el_ms", "E2EL p50"),
               ("p99_e2el_ms", "E2EL p99"), ("p99_sched_e2el_ms", "sched E2EL p99")]
    rows = [[title for _, title in columns]]
    rows += [[_cell(point.get(field)) for field, _ in columns] for point in points]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = ["  ".join(f"{cell:>{w}}" for cell, w in zip(row, widths, strict=True))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.2f}"
    return str(value)
