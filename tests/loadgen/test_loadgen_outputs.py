"""compare, the summary table and the PNG plots."""

from __future__ import annotations

import struct
from pathlib import Path

import orjson
import pytest

from pagedserve.loadgen.compare import format_comparison, ratio
from pagedserve.loadgen.plots import plot_run, plot_sweep
from pagedserve.loadgen.request import RequestResult
from pagedserve.loadgen.runner import RunOutcome
from pagedserve.loadgen.summary import format_summary
from pagedserve.server.cli.main import main

A = {"completed": 100, "failed": 0, "duration": 10.0, "request_throughput": 10.0,
     "output_throughput": 500.0, "mean_ttft_ms": 40.0, "p99_ttft_ms": 90.0,
     "request_goodput": None}
B = {"completed": 100, "failed": 2, "duration": 8.0, "request_throughput": 12.5,
     "output_throughput": 650.0, "mean_ttft_ms": 30.0, "p99_ttft_ms": 120.0,
     "request_goodput": None}


def test_compare_table_has_both_values_and_ratio() -> None:
    lines = format_comparison(A, B).splitlines()
    assert lines[0].split() == ["metric", "A", "B", "B/A"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["request_throughput"] == ["10.00", "12.50", "1.250"]
    assert rows["output_throughput"] == ["500.00", "650.00", "1.300"]
    assert rows["mean_ttft_ms"] == ["40.00", "30.00", "0.750"]
    assert rows["p99_ttft_ms"] == ["90.00", "120.00", "1.333"]
    assert rows["failed"] == ["0", "2", "-"]  # no ratio against zero
    assert rows["request_goodput"] == ["-", "-", "-"]
    assert ratio(4, 6) == 1.5 and ratio(None, 1) is None and ratio(True, 2) is None


def test_compare_command_reads_two_files(tmp_path: Path, capsys) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_bytes(orjson.dumps(A))
    b.write_bytes(orjson.dumps(B))
    assert main(["bench", "compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[:2] == [f"A = {a}", f"B = {b}"]
    assert "1.250" in out


def test_compare_rejects_missing_and_foreign_files(tmp_path: Path, capsys) -> None:
    assert main(["bench", "compare", str(tmp_path / "nope.json")]) == 2
    assert "compare must be two result files (A.json B.json)" in capsys.readouterr().err
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


def test_run_plots_are_valid_pngs(outcome: RunOutcome, tmp_path: Path) -> None:
    paths = plot_run(outcome, 1, tmp_path / "plots")
    assert [p.name for p in paths] == ["latency_cdf.png", "timeline.png"]
    assert _png_size(paths[0]) == (1000, 700)
    assert _png_size(paths[1]) == (1000, 600)


def test_sweep_plot_is_a_valid_png(tmp_path: Path) -> None:
    points = [{"request_rate": rate, "request_throughput": rate * 0.9,
               "median_ttft_ms": 10.0 * rate, "p99_ttft_ms": 20.0 * rate,
               "median_e2el_ms": 100.0 * rate, "p99_e2el_ms": 300.0 * rate}
              for rate in (1.0, 2.0, 4.0)]
    assert _png_size(plot_sweep(points, "request_rate", tmp_path)) == (1100, 450)
