"""``pagedserve bench``: measure an OpenAI-compatible server (options follow vLLM's
``bench serve``), ``pagedserve bench compare A.json B.json`` and ``pagedserve bench sweep``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pagedserve.loadgen.bench import BenchOutput, BenchSettings, bench
from pagedserve.loadgen.cli_options import add_arguments, settings_from_args
from pagedserve.loadgen.compare import format_comparison, load_result
from pagedserve.loadgen.errors import BenchConfigError, LoadgenError
from pagedserve.loadgen.report import timestamp, write_json, write_request_jsonl
from pagedserve.loadgen.summary import format_summary
from pagedserve.loadgen.sweep import format_sweep_table, sweep, sweep_points

__all__ = ["add_arguments", "run"]

T = TypeVar("T")


def run_event_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Runs ``coro`` on uvloop where it is installed (faster sockets and timers)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run(args: argparse.Namespace) -> int:
    """0 when at least one request succeeded (or compare printed), 1 when none did,
    2 for a usage error."""
    action = args.action[0] if args.action else "run"
    try:
        if action == "compare":
            return _compare(args.action[1:])
        if len(args.action) > 1 or action not in ("run", "sweep"):
            raise BenchConfigError("the first argument", " ".join(args.action),
                                   "'compare A.json B.json', 'sweep' or nothing")
        settings = settings_from_args(args)
        if action == "sweep":
            return _sweep(args, settings)
        return _bench(args, settings)
    except LoadgenError as exc:
        print(f"pagedserve bench: error: {exc}", file=sys.stderr)
        return 2


def _compare(paths: list[str]) -> int:
    if len(paths) != 2:
        raise BenchConfigError("compare", paths, "two result files (A.json B.json)")
    a, b = (load_result(path) for path in paths)
    print(f"A = {paths[0]}\nB = {paths[1]}")
    print(format_comparison(a, b))
    return 0


def _bench(args: argparse.Namespace, settings: BenchSettings) -> int:
    output = run_event_loop(bench(settings))
    spec = settings.metrics
    print(format_summary(output.result, spec.percentile_metrics, spec.metric_percentiles))
    for path in _result_paths(args, settings, "bench"):
        print(f"result written to {write_json(path, output.result)}")
    if args.per_request_jsonl:
        path = write_request_jsonl(args.per_request_jsonl, output.outcome.results,
                                   output.outcome.start, settings.request.n)
        print(f"per-request results written to {path}")
    if args.plot:
        from pagedserve.loadgen.plots import plot_run  # matplotlib only when asked

        for path in plot_run(output.outcome, settings.request.n, args.plot):
            print(f"plot written to {path}")
    return 0 if output.result["completed"] > 0 else 1


def _sweep(args: argparse.Namespace, settings: BenchSettings) -> int:
    key, values = _sweep_values(args)
    outputs: list[BenchOutput] = run_event_loop(sweep(settings, key, values))
    points = [output.result for output in outputs]
    print(format_sweep_table(key, points))
    summary = {"sweep_key": key, "sweep_values": values, "points": points}
    for path in _result_paths(args, settings, "sweep"):
        print(f"sweep written to {write_json(path, summary)}")
    if args.plot:
        from pagedserve.loadgen.plots import plot_sweep

        print(f"plot written to {plot_sweep(points, key, args.plot)}")
    return 0 if any(point["completed"] > 0 for point in points) else 1


def _sweep_values(args: argparse.Namespace) -> tuple[str, list[float | int]]:
    given = {key: getattr(args, f"sweep_{key}") for key in ("request_rate", "max_concurrency")}
    chosen = [(key, values) for key, values in given.items() if values is not None]
    if len(chosen) != 1:
        raise BenchConfigError("sweep", sorted(k for k, _ in chosen),
                               "exactly one of --sweep-request-rates, --sweep-max-concurrency")
    key, values = chosen[0]
    return key, sweep_points(key, values)


def _result_paths(args: argparse.Namespace, settings: BenchSettings, kind: str) -> list[Path]:
    paths = []
    if args.result_json:
        paths.append(Path(args.result_json))
    if args.save_result:
        name = args.result_filename or _default_filename(settings, kind)
        paths.append(Path(args.result_dir or ".") / name)
    return list(dict.fromkeys(paths))


def _default_filename(settings: BenchSettings, kind: str) -> str:
    shape = settings.shape
    rate = f"{shape.request_rate:g}qps"
    concurrency = f"-concurrency{shape.max_concurrency}" if shape.max_concurrency else ""
    model = Path(settings.request.model).name or "model"
    label = settings.label or settings.request.endpoint
    return f"{label}-{kind}-{rate}{concurrency}-{model}-{timestamp()}.json"

