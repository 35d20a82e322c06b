from __future__ import annotations

import dataclasses

import pytest

from pagedserve.client import AdaptiveBudget, AdaptiveConfig, TokenBudget
from pagedserve.client.adaptive.adaptive_budget import BudgetPlan, plan_budget
from pagedserve.client.adaptive.latency_target import LatencyTarget
from pagedserve.client.api.types import ServerLoad

LOAD = ServerLoad(0.0, 0, 0, 1000, 0, max_num_seqs=8, max_num_batched_tokens=512,
                  total_kv_tokens=1000)


def test_plan_from_load():
    assert plan_budget(AdaptiveConfig(), LOAD, 500, None) == BudgetPlan(
        initial_tokens=900, min_tokens=56, max_tokens=4000, initial_concurrency=16,
        max_concurrency=16, waiting_high=2, kv_tokens=1000,
    )


def test_plan_starts_where_the_server_measured_its_best():
    # What others run and queue at the best is theirs; a cold server names no best, and a
    # best under the default start leaves the default.
    load = ServerLoad.from_dict({
        "kv_cache_usage": 0.1, "num_running": 20, "num_waiting": 4, "max_num_seqs": 256,
        "total_kv_tokens": 100_000, "best_running": 120})
    assert load.best_running == 120
    assert plan_budget(AdaptiveConfig(), load, 500, None).initial_concurrency == 96
    cold = dataclasses.replace(load, best_running=None)
    assert plan_budget(AdaptiveConfig(), cold, 500, None).initial_concurrency == 16
    small = dataclasses.replace(load, best_running=30)
    assert plan_budget(AdaptiveConfig(), small, 500, None).initial_concurrency == 16
    explicit = AdaptiveConfig(initial_concurrency=8)
    assert plan_budget(explicit, load, 500, None).initial_concurrency == 8


def test_plan_without_hints_is_fixed():
    assert plan_budget(AdaptiveConfig(), None, 500, 7) == BudgetPlan(
        initial_tokens=500, min_tokens=31, max_tokens=500, initial_concurrency=7,
        max_concurrency=7, waiting_high=2, kv_tokens=None,
    )


def test_plan_honours_explicit_settings():
    config = AdaptiveConfig(initial_tokens=300, min_tokens=50, max_tokens=600,
                            initial_concurrency=2, waiting_high=5)
    assert plan_budget(config, LOAD, 500, 3) == BudgetPlan(300, 50, 600, 2, 3, 5, 1000)


# -- a simulated server whose throughput peaks at a known concurrency ----------------------


# -- without load hints: only 429s move the window -------------------------------------------


def fixed_controller(window: int = 8) -> AdaptiveBudget:
    plan = plan_budget(AdaptiveConfig(), None, 1000, window)
    return AdaptiveBudget(TokenBudget(1000, hard_limit=1000), plan, AdaptiveConfig())


def test_rate_limit_halves_the_window_once_per_epoch():
    c = fixed_controller(8)
    c.on_rate_limited(0)
    assert (c.concurrency, c.epoch) == (4, 1)
    c.on_rate_limited(0)  # sent before the cut: stale
    assert c.concurrency == 4
    c.on_rate_limited(1)
    assert (c.concurrency, c.budget.max_concurrency) == (2, 2)


def test_without_hints_grows_back_to_where_it_started():
    c = fixed_controller(8)
    c.on_rate_limited(0)
    for _ in range(40):
        c.on_success(1, 100, None)
    assert c.concurrency == 8
    assert [reason for reason, _, _ in c.history][:2] == ["start", "rate-limited"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"decrease_factor": 1.0}, "decrease_factor must be in (0, 1), got 1.0"),
        ({"kv_usage_high": 0.0}, "kv_usage_high must be in (0, 1], got 0.0"),
        ({"kv_usage_low": 0.95}, "kv_usage_low must be in (0, kv_usage_high), got 0.95"),
        ({"min_tokens": 0}, "min_tokens must be at least 1, got 0"),
        ({"waiting_high": -1}, "waiting_high must be at least 0, got -1"),
        ({"interval_s": 0}, "interval_s must be positive, got 0"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError) as info:
        AdaptiveConfig(**kwargs)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("p99", 10.0), "metric must be 'tpot' or 'ttft', got 'p99'"),
        (("tpot", 0.0), "target_ms must be positive, got 0.0"),
        (("ttft", 10.0, 0), "percentile must be in (0, 100], got 0"),
    ],
)
def test_latency_target_rejects_bad_values(args, message):
    with pytest.raises(ValueError) as info:
        LatencyTarget(*args)
    assert str(info.value) == message


def test_cli_latency_target_flags():
    import argparse

    from pagedserve.client import cli

    parser = argparse.ArgumentParser(prog="pagedserve batch")
    cli.add_arguments(parser)
    args = parser.parse_args(["i", "o", "--base-url", "http://a:1", "--target-tpot-ms", "40",
                              "--target-percentile", "99"])
    pool, _ = cli.configs_from_args(args)
    assert pool.adaptive.target == LatencyTarget("tpot", 40.0, 99.0)
    args = parser.parse_args(["i", "o", "--base-url", "http://a:1", "--target-ttft-ms", "500"])
    assert cli.configs_from_args(args)[0].adaptive.target == LatencyTarget("ttft", 500.0)
    with pytest.raises(SystemExit):
        parser.parse_args(["i", "o", "--base-url", "http://a:1", "--target-tpot-ms", "4",
                           "--target-ttft-ms", "5"])
