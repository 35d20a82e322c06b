"""benchmarks/kv_sim.py, the model-free simulation shared by the memory benchmarks."""

from __future__ import annotations

import pytest
from bench_scripts import last_json_line, run_script


@pytest.fixture
def kv_sim(import_benchmark):
    return import_benchmark("kv_sim")


def test_lengths_are_seeded_and_extend(kv_sim):
    short = kv_sim.lognormal_lengths(kv_sim.ALPACA, 10, 2048, seed=7)
    long = kv_sim.lognormal_lengths(kv_sim.ALPACA, 20, 2048, seed=7)
    assert long[:10] == short
    assert kv_sim.lognormal_lengths(kv_sim.ALPACA, 10, 2048, seed=8) != short


@pytest.mark.parametrize("profile_name", ["alpaca", "sharegpt"])
def test_lengths_follow_the_profile_means(kv_sim, profile_name):
    profile = kv_sim.PROFILES[profile_name]
    work = kv_sim.lognormal_lengths(profile, 4000, 4096, seed=0)
    mean_in = sum(i for i, _ in work) / len(work)
    mean_out = sum(o for _, o in work) / len(work)
    assert mean_in == pytest.approx(profile.mean_input, rel=0.05)
    assert mean_out == pytest.approx(profile.mean_output, rel=0.05)


def test_lengths_fit_max_model_len(kv_sim):
    work = kv_sim.lognormal_lengths(kv_sim.SHAREGPT, 500, 64, seed=0)
    assert all(1 <= i <= 63 and o >= 1 and i + o <= 64 for i, o in work)
    with pytest.raises(ValueError, match="max_model_len must be at least 2, got 1"):
        kv_sim.lognormal_lengths(kv_sim.SHAREGPT, 1, 1, seed=0)


def test_prompts_differ_between_requests(kv_sim):
    assert kv_sim.synthetic_prompt(0, 4) == [0, 1, 2, 3]
    assert kv_sim.synthetic_prompt(1, 4) == [31, 32, 33, 34]
    assert max(kv_sim.synthetic_prompt(5000, 100)) < kv_sim.PROMPT_VOCAB


def test_kv_memory_quick_run():
    result = last_json_line(run_script("kv_memory", "--quick"))
    assert result["num_requests"] == 200
    assert result["paged_kv_utilization"] > 0.9 > 0.5 > result["contiguous_kv_utilization"]
    assert result["contiguous_max_running"] == 8
