"""Whole runs through ``pagedserve bench`` against the fault-injecting server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from pagedserve.cli.main import main
from pagedserve.loadgen.arrivals import arrivals_rng, schedule
from pagedserve.loadgen.bench import make_session
from pagedserve.loadgen.bench_config import LoadShape, RequestSpec
from pagedserve.loadgen.datasets import SampleRequest
from pagedserve.loadgen.runner import BenchmarkRunner

FAULTS = {3: "http500", 5: "drop", 7: "malformed", 9: "error_event", 11: "no_done"}


def _bench(url: str, *extra: str) -> int:
    return main(["bench", "--base-url", url, "--model", "tiny", "--disable-tqdm",
                 "--random-input-len", "12", "--random-output-len", "4",
                 "--random-range-ratio", "0.5", *extra])


def _load(path: Path) -> dict:
    return orjson.loads(path.read_bytes())


def test_result_totals_match_what_the_server_served(serve, tmp_path: Path, capsys) -> None:
    server, url = serve(faults=FAULTS, token_delay=0.001)
    result_path, jsonl = tmp_path / "result.json", tmp_path / "requests.jsonl"
    assert _bench(url, "--num-prompts", "24", "--request-rate", "400",
                  "--result-json", str(result_path), "--per-request-jsonl", str(jsonl)) == 0
    result = _load(result_path)
    done = [s for s in server.served if s.completed]
    assert len(server.served) == 24
    assert result["completed"] == len(done) == 19
    assert result["failed"] == 5
    assert result["total_input_tokens"] == sum(s.prompt_tokens for s in done)
    assert result["total_output_tokens"] == sum(s.completion_tokens for s in done)
    assert result["output_tokens_from_usage"] == 19
    assert result["error_counts"] == {"StreamProtocolError": 2, "HTTP 500": 1,
                                      "ClientPayloadError": 1, "SSEDecodeError": 1}
    assert len(result["failures"]) == 5
    assert {f["error"] for f in result["failures"]} >= {
        "HTTP 500: injected failure",
        "StreamProtocolError: error event in stream: injected stream error",
        "StreamProtocolError: stream ended before 'data: [DONE]'"}
    lines = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    assert [line["request_id"] for line in lines] == list(range(24))
    assert sum(line["success"] for line in lines) == 19
    assert all(line["ttft_ms"] > 0 for line in lines if line["success"])
    out = capsys.readouterr().out
    assert "Successful requests:" in out and "#" in out and "HTTP 500: injected failure" in out
    # Every request asked for usage and carried its dataset's max_tokens.
    assert all(s.payload["stream_options"] == {"include_usage": True} for s in server.served)
    assert sorted(s.payload["max_tokens"] for s in server.served) == sorted(
        line["max_tokens"] for line in lines)


def test_output_tokens_fall_back_to_the_tokenizer(serve, tmp_path: Path) -> None:
    server, url = serve(send_usage=False)
    path = tmp_path / "r.json"
    assert _bench(url, "--num-prompts", "6", "--result-json", str(path)) == 0
    result = _load(path)
    assert result["output_tokens_from_tokenizer"] == 6
    assert result["total_output_tokens"] == sum(s.completion_tokens for s in server.served)
    # Without usage the dataset's prompt lengths are the input count (tiktoken = the server's).
    assert result["total_input_tokens"] == sum(s.prompt_tokens for s in server.served)


def test_chat_with_parallel_samples(serve, tmp_path: Path) -> None:
    server, url = serve()
    path = tmp_path / "r.json"
    assert _bench(url, "--endpoint", "chat", "--n", "2", "--num-prompts", "5",
                  "--result-json", str(path)) == 0
    result = _load(path)
    assert all(s.path == "/v1/chat/completions" and s.payload["n"] == 2 for s in server.served)
    assert result["total_output_tokens"] == sum(2 * s.payload["max_tokens"]
                                                for s in server.served)


def test_max_concurrency_caps_requests_in_flight(serve, tmp_path: Path) -> None:
    server, url = serve(token_delay=0.002)
    path = tmp_path / "r.json"
    assert _bench(url, "--num-prompts", "16", "--max-concurrency", "3",
                  "--result-json", str(path)) == 0
    result = _load(path)
    assert server.peak_in_flight <= 3
    assert result["peak_running_requests"] <= 3 and result["completed"] == 16
    # Everything is due at once, so later requests wait for a slot.
    assert result["max_queue_wait_ms"] > 0


def test_warmups_are_sent_but_not_measured(serve, tmp_path: Path) -> None:
    server, url = serve()
    path = tmp_path / "r.json"
    assert _bench(url, "--num-prompts", "5", "--num-warmups", "3",
                  "--result-json", str(path)) == 0
    assert len(server.served) == 8 and _load(path)["completed"] == 5


def test_duration_closed_loop_keeps_sending_until_time_is_up(serve, tmp_path: Path) -> None:
    server, url = serve(token_delay=0.002)
    path, jsonl = tmp_path / "r.json", tmp_path / "req.jsonl"
    assert _bench(url, "--duration", "0.4", "--max-concurrency", "2", "--num-prompts", "3",
                  "--result-json", str(path), "--per-request-jsonl", str(jsonl)) == 0
    result = _load(path)
    lines = [orjson.loads(line) for line in jsonl.read_bytes().splitlines()]
    assert result["completed"] == len(server.served) == len(lines) > 3  # prompts are cycled
    assert max(line["sent_s"] for line in lines) < 0.4
    assert server.peak_in_flight <= 2


def test_server_tokenizer_sizes_prompts(serve, tmp_path: Path) -> None:
    server, url = serve()
    path = tmp_path / "r.json"
    assert _bench(url, "--num-prompts", "4", "--tokenizer", "server",
                  "--result-json", str(path)) == 0
    assert server.tokenize_calls >= 4
    assert _load(path)["tokenizer_id"] == "server"


def test_every_request_failing_exits_1(serve, tmp_path: Path) -> None:
    _, url = serve(faults={i: "http500" for i in range(3)})
    path = tmp_path / "r.json"
    assert _bench(url, "--num-prompts", "3", "--result-json", str(path)) == 1
    result = _load(path)
    assert result["completed"] == 0 and result["mean_ttft_ms"] is None
    assert result["error_counts"] == {"HTTP 500": 3}


def test_all_warmups_failing_aborts(serve, capsys) -> None:
    _, url = serve(faults={0: "http500", 1: "http500"})
    assert _bench(url, "--num-prompts", "3", "--num-warmups", "2") == 2
    assert ("error: all 2 warm-up requests failed; the first error: HTTP 500: injected "
            "failure") in capsys.readouterr().err


def test_save_result_uses_result_dir_and_filename(serve, tmp_path: Path) -> None:
    _, url = serve()
    assert _bench(url, "--num-prompts", "2", "--save-result", "--save-detailed",
                  "--result-dir", str(tmp_path / "out"), "--result-filename", "x.json",
                  "--label", "base", "--metadata", "gpu=none") == 0
    result = _load(tmp_path / "out" / "x.json")
    assert result["label"] == "base" and result["gpu"] == "none"
    assert len(result["ttfts"]) == 2 and result["errors"] == ["", ""]


def test_sweep_over_rates_writes_every_point(serve, tmp_path: Path, capsys) -> None:
    server, url = serve()
    path = tmp_path / "sweep.json"
    assert _bench(url, "sweep", "--sweep-request-rates", "200,inf", "--num-prompts", "4",
                  "--result-json", str(path), "--plot", str(tmp_path / "plots")) == 0
    sweep = _load(path)
    assert sweep["sweep_key"] == "request_rate"
    assert [p["request_rate"] for p in sweep["points"]] == [200.0, "inf"]
    assert [p["completed"] for p in sweep["points"]] == [4, 4]
    assert len(server.served) == 8
    assert (tmp_path / "plots" / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "req/s" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["bench"], "--model must be given (the model name to request), got None"),
    (["bench", "--model", "m", "--goodput", "ttft"], "--goodput must be KEY:MILLISECONDS, "
                                                      "got 'ttft'"),
    (["bench", "--model", "m", "--goodput", "itl:5"], "--goodput must be one of ('ttft', "
                                                       "'tpot', 'e2el'), got 'itl'"),
    (["bench", "--model", "m", "--percentile-metrics", "ttft,foo"],
     "--percentile-metrics must be one of ('ttft', 'tpot', 'itl', 'e2el'), got 'foo'"),
    (["bench", "--model", "m", "--metric-percentiles", "50,101"],
     "--metric-percentiles must be in [0, 100], got 101.0"),
    (["bench", "--model", "m", "--base-url", "localhost:8000"],
     "--base-url must be an http:// or https:// URL, got 'localhost:8000'"),
    (["bench", "--model", "m", "--use-beam-search", "--temperature", "0.7"],
     "--temperature must be 0 with --use-beam-search, got 0.7"),
    (["bench", "--model", "m", "--extra-body", "[1]"], "--extra-body must be a JSON object, "
                                                        "got '[1]'"),
    (["bench", "sweep", "--model", "m"], "sweep must be exactly one of --sweep-request-rates, "
                                         "--sweep-max-concurrency, got []"),
    (["bench", "sweep", "--model", "m", "--sweep-max-concurrency", "2,0.5"],
     "--sweep-max-concurrency must be whole numbers of at least 1, got 0.5"),
    (["bench", "--model", "m", "--backend", "openai-chat", "--endpoint", "/v1/completions"],
     "--endpoint must be a chat completions endpoint with --backend openai-chat, "
     "got '/v1/completions'"),
    (["bench", "--model", "m", "--endpoint", "/v1/embeddings"],
     "--endpoint must be 'completions', 'chat' or a path such as /v1/completions or "
     "/v1/chat/completions, got '/v1/embeddings'"),
    (["bench", "--model", "m", "--best-of", "3", "--goodput", "ttft:100"],
     "--goodput must be e2el only with unstreamed requests (--best-of above --n, "
     "--use-beam-search), which have no TTFT or TPOT, got ['ttft:100']"),
    (["bench", "--model", "m", "--tokenizer", "org/some-model"],
     "--tokenizer 'org/some-model' is neither a tiktoken encoding, a local directory with "
     "tokenizer.json, nor 'server' (nothing is downloaded): "),
])
def test_usage_errors_exit_2_with_the_reason(argv: list[str], message: str, capsys) -> None:
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().startswith(f"pagedserve bench: error: {message}")


@pytest.mark.parametrize(("argv", "message"), [
    (["bench", "frobnicate", "--model", "m"], "invalid choice: 'frobnicate'"),
    # Sweep options belong to 'sweep': given to a plain run they are an error, not ignored.
    (["bench", "--model", "m", "--sweep-request-rates", "1,2"],
     "error: --sweep-request-rates belongs to the sweep: pagedserve bench sweep "
     "--sweep-request-rates 1,2 ..."),
])
def test_argument_errors(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_sweep_help_documents_the_sweep_only(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "sweep", "--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: pagedserve bench sweep [-h] [--sweep-request-rates")
    assert "--sweep-max-concurrency" in text and "--random-input-len" not in text
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = capsys.readouterr().out
    assert "--random-input-len" in text and "--sweep-request-rates" not in text


def test_duration_open_loop_sends_the_whole_schedule(serve, tmp_path: Path) -> None:
    server, url = serve()
    path = tmp_path / "r.json"
    assert _bench(url, "--request-rate", "100", "--duration", "0.25", "--num-prompts", "4",
                  "--seed", "5", "--result-json", str(path)) == 0
    expected = len(schedule(LoadShape(request_rate=100.0, duration=0.25), arrivals_rng(5)))
    assert len(server.served) == _load(path)["completed"] == expected


def test_ramp_up_runs_through_the_cli(serve, tmp_path: Path) -> None:
    _, url = serve()
    path = tmp_path / "r.json"
    assert _bench(url, "--num-prompts", "8", "--ramp-up-strategy", "exponential",
                  "--ramp-up-start-rps", "100", "--ramp-up-end-rps", "800",
                  "--result-json", str(path)) == 0
    result = _load(path)
    assert result["completed"] == 8 and result["ramp_up_strategy"] == "exponential"


async def test_a_late_client_cannot_hide_its_queueing(serve) -> None:
    """The loop is blocked for 0.3 s right after the first request: requests due meanwhile
    go out late, and their latency from the scheduled time shows it."""
    _, url = serve()
    spec = RequestSpec(base_url=url, model="tiny")
    shape = LoadShape(num_prompts=4, request_rate=20.0, arrival="constant")  # due 0, .05, ...
    samples = [SampleRequest(" the cat", 2, 2)]
    asyncio.get_running_loop().call_soon(time.sleep, 0.3)
    async with make_session(None) as session:
        outcome = await BenchmarkRunner(session, spec, shape, samples,
                                        show_progress=False).run()
    late = outcome.results[1]  # due at 0.05, sent after the 0.3 s block
    assert late.success
    assert late.started - late.scheduled >= 0.25
    assert (late.finished - late.scheduled) - late.e2el >= 0.25


def test_loadgen_imports_neither_torch_nor_the_server() -> None:
    code = ("import sys, pagedserve.loadgen.cli, pagedserve.loadgen.plots; "
            "print(sorted(m for m in sys.modules "
            "if m == 'torch' or m.startswith('pagedserve.server')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
