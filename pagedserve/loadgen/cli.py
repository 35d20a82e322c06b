"""``pagedserve bench``: measure an OpenAI-compatible server (options follow vLLM's
``bench serve``), ``pagedserve bench sweep`` and ``pagedserve bench compare A.json B.json``.

Each subcommand has its own parser, so ``bench sweep --help`` documents the sweep and a sweep
option given to a plain ``bench`` is an error rather than silently ignored."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from pagedserve.loadgen.bench import BenchOutput, BenchSettings, bench
from pagedserve.loadgen.bench_errors import BenchConfigError, LoadgenError
from pagedserve.loadgen.cli_options import (
    add_bench_arguments,
    add_sweep_arguments,
    settings_from_args,
)
from pagedserve.loadgen.compare import format_comparison, load_runs
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Measure an OpenAI-compatible server; the options follow vLLM's "
                          "'vllm bench serve'. 'bench sweep --help' and 'bench compare --help' "
                          "describe the subcommands.")
    add_bench_arguments(parser)
    for option in ("--sweep-request-rates", "--sweep-max-concurrency"):
        parser.add_argument(option, action=_SweepOnly, help=argparse.SUPPRESS)
    actions = parser.add_subparsers(dest="action", metavar="{sweep,compare}")
    sweep_parser = actions.add_parser(
        "sweep", help="one benchmark per request rate or concurrency cap",
        description="Run one benchmark per value of --sweep-request-rates or "
                    "--sweep-max-concurrency (exactly one), on the same prompts, and print "
                    "the throughput-latency table. Every option of 'pagedserve bench' "
                    "(see 'pagedserve bench --help') applies to each point, before or "
                    "after 'sweep'; the swept one is replaced at each point.")
    add_sweep_arguments(sweep_parser)
    add_bench_arguments(sweep_parser)
    # The benchmark options are documented by 'bench --help'; here they take no default, so
    # that those given before 'sweep' are not overwritten by this parser's defaults.
    sweep_dests = {"sweep_request_rate", "sweep_max_concurrency", "help"}
    for action in sweep_parser._actions:
        if action.dest not in sweep_dests:
            action.default = action.help = argparse.SUPPRESS
    compare_parser = actions.add_parser(
        "compare", help="two results side by side",
        description="Print the settings that differ between two result files, then their "
                    "metrics side by side with B/A ratios. A sweep file is compared point "
                    "by point with the other file's points of the same sweep value.")
    compare_parser.add_argument("files", nargs=2, metavar="RESULT.json",
                                help="results of 'bench' or 'bench sweep' (--result-json)")


class _SweepOnly(argparse.Action):
    """A sweep option given without 'sweep': an error that says where it belongs."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        parser.error(f"{option_string} belongs to the sweep: pagedserve bench sweep "
                     f"{option_string} {values} ...")


def run(args: argparse.Namespace) -> int:
    """0 when at least one request succeeded (or compare printed), 1 when none did,
    2 for a usage error."""
    try:
        if args.action == "compare":
            return _compare(args.files)
        settings = settings_from_args(args)
        if args.action == "sweep":
            return _sweep(args, settings)
        return _bench(args, settings)
    except LoadgenError as exc:
        print(f"pagedserve bench: error: {exc}", file=sys.stderr)
        return 2


def _compare(paths: list[str]) -> int:
    a, b = (load_runs(path) for path in paths)
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

        for path in plot_run(output.outcome, settings.request.n, args.plot, output.result):
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

