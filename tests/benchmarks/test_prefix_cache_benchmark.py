"""benchmarks/prefix_cache.py: the few-shot workload, and runs of the benchmark itself."""

from __future__ import annotations

import math

import pytest
from bench_scripts import last_json_line, run_script

RATIO_KEYS = ("throughput_ratio_1shot", "ttft_ratio_1shot", "throughput_ratio_5shot",
              "ttft_ratio_5shot")
SMALL_MODEL = ("--hidden-size", "128", "--num-layers", "2", "--vocab-size", "1000",
               "--num-kv-blocks", "512", "--max-tokens", "4")


@pytest.fixture
def prefix_cache(import_benchmark):
    return import_benchmark("prefix_cache")


def test_workload_shares_one_prefix(prefix_cache):
    workload = prefix_cache.build_workload(5, 8, 32000, seed=0)
    prefix = workload.prefix
    assert workload.name == "5shot"
    assert prefix[0] == prefix_cache.BOS
    # Content tokens sit above the markers, so each marker counts one shot.
    for marker in (prefix_cache.QUESTION, prefix_cache.ANSWER, prefix_cache.SEPARATOR):
        assert prefix.count(marker) == 5
    assert all(100 <= t < 32000 for t in prefix if t not in (1, 3, 4, 5))
    shortest = 1 + 24 + 5 * (3 + 24 + 160)
    longest = 1 + 24 + 5 * (3 + 72 + 320)
    assert shortest <= len(prefix) <= longest
    prompts = workload.prompts()
    assert len(prompts) == 8
    assert all(p["prompt_token_ids"][:len(prefix)] == prefix for p in prompts)
    assert len({tuple(q) for q in workload.questions}) == 8
    for question in workload.questions:
        assert question[0] == prefix_cache.QUESTION and question[-1] == prefix_cache.ANSWER
        assert 16 + 2 <= len(question) <= 64 + 2


def test_workload_is_seeded(prefix_cache):
    build = prefix_cache.build_workload
    assert build(1, 4, 1000, seed=3) == build(1, 4, 1000, seed=3)
    assert build(1, 4, 1000, seed=3).prefix != build(1, 4, 1000, seed=4).prefix
    # The 1-shot prefix is not the start of the 5-shot one: no hits carry between workloads.
    one, five = build(1, 4, 1000, seed=3), build(5, 4, 1000, seed=3)
    assert five.prefix[:len(one.prefix)] != one.prefix


def test_workload_needs_room_for_content_tokens(prefix_cache):
    with pytest.raises(ValueError, match="vocab_size must exceed 100, got 64"):
        prefix_cache.build_workload(1, 1, 64, seed=0)


def test_rejects_a_hidden_size_without_whole_heads(prefix_cache, capsys):
    with pytest.raises(SystemExit):
        prefix_cache.parse_args(["--hidden-size", "200"])
    assert "--hidden-size must be a multiple of 128" in capsys.readouterr().err


def test_small_run_reports_ratios_hits_and_equal_outputs(prefix_cache):
    completed = run_script("prefix_cache", "--num-requests", "4", *SMALL_MODEL)
    summary = last_json_line(completed)
    for key in RATIO_KEYS:
        assert isinstance(summary[key], float) and math.isfinite(summary[key])
        assert summary[key] > 0
    assert summary["outputs_match_1shot"] is True
    assert summary["outputs_match_5shot"] is True
    # The first step's 2048 tokens hold request 0 and a chunk of request 1, computed before
    # anything is cached; requests 2 and 3 then hit every full block of the prefix.
    workload = prefix_cache.build_workload(5, 4, 1000, seed=0)
    total = sum(len(p["prompt_token_ids"]) for p in workload.prompts())
    full_prefix_tokens = len(workload.prefix) // 16 * 16
    assert summary["cache_hit_rate_5shot"] == round(2 * full_prefix_tokens / total, 4)
    assert "5shot cached" in completed.stdout


@pytest.mark.slow
def test_quick_run():
    summary = last_json_line(run_script("prefix_cache", "--quick", timeout=300))
    assert all(summary[key] > 0 for key in RATIO_KEYS)
    assert summary["outputs_match_5shot"] is True
    assert summary["cache_hit_rate_5shot"] > 0.8
