"""vs_peers: peers that are not installed are skipped with the reason, llama.cpp's slots fit
the KV budget, and the last line reports ratios over completed requests only."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def vs_peers(import_benchmark):
    return import_benchmark("vs_peers")


def test_missing_peers_are_skipped_with_the_reason(vs_peers, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert vs_peers.find_tool(None, "vllm") == (
        None, "not installed (not on PATH; pass --vllm PATH)")
    path, why = vs_peers.find_tool(str(tmp_path / "llama-server"), "llama-server")
    assert path is None and why == f"{tmp_path / 'llama-server'} is not an executable"


def test_llama_slots_hold_whole_requests_within_the_budget(vs_peers):
    short = vs_peers.Workload("s", 128, 128, 128, 64)
    assert vs_peers.llama_slots(short, 65536) == 64
    bound = vs_peers.Workload("b", 512, 128, 128, 128)
    assert vs_peers.llama_slots(bound, 65536) == 102  # 65536 // 640


def test_report_counts_completed_requests_and_takes_the_minimum(vs_peers, capsys):
    a = vs_peers.Workload("a", 8, 8, 10, 4)
    b = vs_peers.Workload("b", 8, 8, 10, 4)
    raw = {"completed": 8, "duration": 2.0, "total_output_tokens": 64}
    dropped = vs_peers._summary(raw, a)
    assert (dropped["output_tok_s"], dropped["failed"]) == (32.0, 2)
    results = {
        "pagedserve": {"startup_s": 1.0, "a": {"output_tok_s": 30.0}, "b": {"output_tok_s": 40.0}},
        "vllm_cpu": {"startup_s": 2.0, "a": {"output_tok_s": 20.0}, "b": {"output_tok_s": 50.0}},
    }
    vs_peers.report([results], [a, b], {"llama_cpp": "not installed"}, None, 100, 1, "f32")
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["llama_cache_type"] == "f32"
    assert last["workloads"]["a"]["ratio_vs_vllm_cpu"] == 1.5
    assert last["workloads"]["b"]["ratio_vs_vllm_cpu"] == 0.8
    assert last["min_ratio_vs_vllm_cpu"] == 0.8
    assert last["min_ratio_vs_llama_cpp"] is None
    assert last["skipped"] == {"llama_cpp": "not installed"}


def test_a_run_without_pagedserve_reports_no_ratios(vs_peers, capsys):
    a = vs_peers.Workload("a", 8, 8, 10, 4)
    results = {"llama_cpp": {"startup_s": 1.0, "a": {"output_tok_s": 20.0}}}
    vs_peers.report([results], [a], {"pagedserve": "not in --servers"}, None, 100, 1, "f16")
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["workloads"]["a"]["pagedserve"] is None
    assert last["workloads"]["a"]["llama_cpp"] == {"output_tok_s": 20.0, "rounds_tok_s": [20.0]}
    assert last["min_ratio_vs_llama_cpp"] is None


def test_rounds_report_each_servers_median_and_the_ratio_within_each_round(vs_peers, capsys):
    a = vs_peers.Workload("a", 8, 8, 10, 4)

    def round_of(ours: float, theirs: float) -> dict:
        return {"pagedserve": {"startup_s": 1.0, "a": {"output_tok_s": ours}},
                "vllm_cpu": {"startup_s": 2.0, "a": {"output_tok_s": theirs}}}

    rounds = [round_of(30.0, 20.0), round_of(36.0, 30.0), round_of(33.0, 24.0)]
    vs_peers.report(rounds, [a], {}, None, 100, 1, "f32")
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = last["workloads"]["a"]
    assert last["rounds"] == 3
    assert row["pagedserve"] == {"output_tok_s": 33.0, "rounds_tok_s": [30.0, 36.0, 33.0]}
    assert row["vllm_cpu"]["output_tok_s"] == 24.0
    assert row["ratio_vs_vllm_cpu"] == 1.375  # 33 / 24, the medians
    assert row["round_ratios_vs_vllm_cpu"] == [1.5, 1.2, 1.375]
    vs_peers.report(rounds[:2], [a], {}, None, 100, 1, "f32")
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["workloads"]["a"]
    assert row["pagedserve"]["output_tok_s"] == 30.0  # the lower middle of an even count


def test_llama_cpp_keeps_its_kv_cache_in_the_given_type(vs_peers, tmp_path):
    w = vs_peers.Workload("s", 128, 128, 64, 64)
    command = vs_peers.llama_server(tmp_path / "llama-server", tmp_path / "m.gguf", 8000, w,
                                    65536, tmp_path).command
    assert command[command.index("--cache-type-k") + 1] == "f32"
    assert command[command.index("--cache-type-v") + 1] == "f32"
    command = vs_peers.llama_server(tmp_path / "llama-server", tmp_path / "m.gguf", 8000, w,
                                    65536, tmp_path, "f16").command
    assert command[command.index("--cache-type-k") + 1] == "f16"


def test_peer_tokenizer_covers_every_id(import_benchmark, tmp_path):
    from transformers import AutoTokenizer

    import_benchmark("peer_model").write_tokenizer(tmp_path, 600)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == 600
    assert all(tokenizer.convert_ids_to_tokens(i) is not None for i in range(600))
