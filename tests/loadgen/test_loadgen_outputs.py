"""compare, the summary table and the PNG plots."""

from __future__ import annotations

import struct
from pathlib import Path

import orjson
import pytest

from pagedserve.cli.main import main
from pagedserve.loadgen.compare import format_comparison, format_number, format_ratio, ratio
from pagedserve.loadgen.plots import (
    latency_cdf_figure,
    plot_run,
    plot_sweep,
    run_title,
    sweep_figure,
    timeline_figure,
)
from pagedserve.loadgen.request import RequestResult
from pagedserve.loadgen.runner import RunOutcome
from pagedserve.loadgen.summary import format_summary

A = {"completed": 100, "failed": 0, "duration": 10.0, "request_throughput": 10.0,
     "output_throughput": 500.0, "mean_ttft_ms": 40.0, "p99_ttft_ms": 90.0,
     "request_goodput": None}
B = {"completed": 100, "failed": 2, "duration": 8.0, "request_throughput": 12.5,
     "output_throughput": 650.0, "mean_ttft_ms": 30.0, "p99_ttft_ms": 120.0,
     "request_goodput": None}


SETTINGS_A = {"model_id": "tiny", "label": "base", "dataset_name": "random",
              "request_rate": 4.0, "max_concurrency": None, "num_prompts": 200}


def test_compare_table_has_both_values_and_ratio() -> None:
    lines = format_comparison(A, B).splitlines()
    assert lines[0] == "settings: the same ()"
    assert lines[2].split() == ["metric", "A", "B", "B/A"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[4:]}
    assert rows["request_throughput"] == ["10.00", "12.50", "1.25×"]
    assert rows["output_throughput"] == ["500.0", "650.0", "1.30×"]
    assert rows["mean_ttft_ms"] == ["40.00", "30.00", "0.75×"]
    assert rows["p99_ttft_ms"] == ["90.00", "120.0", "1.33×"]
    assert rows["failed"] == ["0", "2", "-"]  # no ratio against zero
    assert rows["request_goodput"] == ["-", "-", "-"]
    assert ratio(4, 6) == 1.5 and ratio(None, 1) is None and ratio(True, 2) is None


def test_compare_names_the_settings_that_differ_first() -> None:
    a = {**A, **SETTINGS_A}
    b = {**B, **SETTINGS_A, "request_rate": 8.0, "label": "candidate", "max_concurrency": 16}
    lines = format_comparison(a, b).splitlines()
    assert lines[:4] == ["settings that differ:",
                         "  label            A=base  B=candidate",
                         "  request_rate     A=4.000  B=8.000",
                         "  max_concurrency  A=-  B=16"]
    same = format_comparison(a, {**B, **SETTINGS_A}).splitlines()[0]
    assert same == ("settings: the same (model_id=tiny, label=base, dataset_name=random, "
                    "request_rate=4.000, max_concurrency=-)")


@pytest.mark.parametrize(("value", "text"), [
    (0.012345, "0.01235"), (1.0, "1.000"), (12.345, "12.35"), (123.456, "123.5"),
    (1234.5, "1,234"), (123456.7, "123,457"), (0.0, "0"), (0.00001234, "1.23e-05"),
    (float("inf"), "inf"),
])
def test_numbers_keep_four_significant_digits(value: float, text: str) -> None:
    assert format_number(value) == text


def test_ratios_have_two_decimals_or_three_significant_digits() -> None:
    assert [format_ratio(r) for r in (1.0, 0.123, 12.0, 0.004, 250.0)] == [
        "1.00×", "0.12×", "12.00×", "0.004×", "250×"]


def test_compare_command_reads_two_files(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(orjson.dumps(A))
    b.write_bytes(orjson.dumps(B))
    assert main(["bench", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [f"A = {a}", f"B = {b}"]
    assert "1.25×" in out


def _sweep_file(path: Path, rates: list[float], throughput: float) -> None:
    points = [{**A, **SETTINGS_A, "request_rate": rate,
               "request_throughput": throughput * rate} for rate in rates]
    path.write_bytes(orjson.dumps({"sweep_key": "request_rate", "sweep_values": rates,
                                   "points": points}))


def test_compare_accepts_sweep_files_point_by_point(tmp_path: Path, capsys) -> None:
    a, b, single = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "one.json"
    _sweep_file(a, [1.0, 2.0, 4.0], 1.0)
    _sweep_file(b, [2.0, 4.0], 1.5)
    single.write_bytes(orjson.dumps({**A, **SETTINGS_A}))
    assert main(["bench", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("==")] == [
        "== request_rate=2 ==", "== request_rate=4 =="]
    throughput = [line.split() for line in out.splitlines()
                  if line.startswith("request_throughput")]
    assert throughput == [["request_throughput", "2.000", "3.000", "1.50×"],
                          ["request_throughput", "4.000", "6.000", "1.50×"]]
    assert main(["bench", "compare", str(a), str(single)]) == 0
    out = capsys.readouterr().out
    assert out.count("== request_rate=") == 3
    assert "  request_rate  A=1.000  B=4.000" in out


def test_compare_rejects_missing_and_foreign_files(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["bench", "compare", str(tmp_path / "nope.json")])
    assert info.value.code == 2
    assert "the following arguments are required: RESULT.json" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text('{"hello": 1}')
    assert main(["bench", "compare", str(other), str(other)]) == 2
    assert ("is not a benchmark result: missing completed, duration, request_throughput"
            in capsys.readouterr().err)
    assert main(["bench", "compare", str(tmp_path / "x.json"), str(other)]) == 2
    assert "cannot read result file" in capsys.readouterr().err


def test_summary_lists_headline_numbers_and_failures() -> None:
    result = {**A, "total_input_tokens": 1000, "total_output_tokens": 5000,
              "total_token_throughput": 600.0, "max_output_tokens_per_s": 700.0,
              "peak_running_requests": 8, "request_rate": "inf", "max_concurrency": 8,
              "median_ttft_ms": 35.0, "std_ttft_ms": 5.0, "p50_ttft_ms": 35.0,
              "request_goodput": 9.0, "failures": [{"request_id": 7, "error": "HTTP 500: x"}],
              "error_counts": {"HTTP 500": 1}}
    text = format_summary(result, ["ttft"], [50, 99])
    lines = text.splitlines()
    assert "Successful requests:" in lines[1] and lines[1].endswith(" 100")
    assert any(line.startswith("Request goodput (req/s):") and line.endswith(" 9.00")
               for line in lines)
    assert any(line.startswith("P99 TTFT (ms):") and line.endswith(" 90.00") for line in lines)
    assert any(line.startswith("Mean TTFT sched (ms):") and line.endswith(" -")
               for line in lines)
    assert "  #7: HTTP 500: x" in lines
    assert all(len(line) == 64 for line in lines if not line.startswith("  #"))


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def outcome() -> RunOutcome:
    results = []
    for i in range(20):
        sent = 1.0 + i * 0.05
        chunks = [sent + 0.02 + 0.01 * k for k in range(5)]
        results.append(RequestResult(i, 10, 5, scheduled=sent - 0.01, started=sent - 0.005,
                                     sent=sent, finished=chunks[-1] + 0.001, chunk_times=chunks,
                                     success=i != 3, error="" if i != 3 else "HTTP 500: x",
                                     output_tokens=5))
    return RunOutcome(results, start=0.99, duration=2.0, loop_lag=[0.0])


RUN = {"model_id": "tiny", "request_rate": 8.0, "num_prompts": 20, "label": "base",
       "max_concurrency": None}


def test_run_plots_are_valid_pngs(outcome: RunOutcome, tmp_path: Path) -> None:
    paths = plot_run(outcome, 1, tmp_path / "plots", RUN)
    assert [p.name for p in paths] == ["latency_cdf.png", "timeline.png"]
    assert _png_size(paths[0]) == (1000, 750)
    assert _png_size(paths[1]) == (1000, 600)


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def test_run_plots_name_the_run_and_mark_p50_and_p99(outcome: RunOutcome) -> None:
    title = run_title(RUN)
    assert title == "tiny · 8 req/s · 20 prompts · base"
    assert run_title({"request_rate": "inf", "num_prompts": 5, "max_concurrency": 4}) == (
        "model ? · inf req/s · 5 prompts · max concurrency 4")
    cdf = latency_cdf_figure(outcome, 1, title)
    assert cdf.get_suptitle() == title
    ttft_ms = [20.0] * 19  # every request's first chunk came 20 ms after its send
    marks = [t for t in _texts(cdf) if t.startswith("p")]
    assert marks[:2] == [f"p50 {ttft_ms[0]:.3g} ms", f"p99 {ttft_ms[0]:.3g} ms"]
    assert len(marks) == 8  # p50 and p99 in each of the four panels
    timeline = timeline_figure(outcome, title, bin_s=0.25)
    assert timeline.get_suptitle() == title
    assert timeline.axes[0].get_title() == "Throughput over time (0.25 s bins)"


def test_sweep_plot_names_the_sweep_and_has_a_tpot_panel(tmp_path: Path) -> None:
    points = [{"model_id": "tiny", "num_prompts": 50, "label": "base",
               "request_rate": rate, "request_throughput": rate * 0.9,
               "median_ttft_ms": 10.0 * rate, "p99_ttft_ms": 20.0 * rate,
               "median_tpot_ms": 2.0 * rate, "p99_tpot_ms": 3.0 * rate,
               "median_e2el_ms": 100.0 * rate, "p99_e2el_ms": 300.0 * rate}
              for rate in (1.0, 2.0, 4.0)]
    fig = sweep_figure(points, "request_rate")
    assert fig.get_suptitle() == "tiny · sweep over request_rate · 50 prompts per point · base"
    assert [ax.get_title().split()[0] for ax in fig.axes] == ["TTFT", "TPOT", "E2EL"]
    tpot = fig.axes[1]
    assert [line.get_label() for line in tpot.get_lines()] == ["p50", "p99"]
    assert list(tpot.get_lines()[1].get_ydata()) == [3.0, 6.0, 12.0]
    assert _png_size(plot_sweep(points, "request_rate", tmp_path)) == (1500, 480)
