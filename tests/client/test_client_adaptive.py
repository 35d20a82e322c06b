from __future__ import annotations

import pytest

from pagedserve.client import AdaptiveBudget, AdaptiveConfig, TokenBudget
from pagedserve.client.adaptive import BudgetPlan, plan_budget
from pagedserve.client.types import ServerLoad
from pagedserve.common.load_hints import LoadHints

LOAD = ServerLoad(0.0, 0, 0, 1000, 0, max_num_seqs=8, max_num_batched_tokens=512,
                  total_kv_tokens=1000)


def hints(usage: float = 0.5, waiting: int = 0, preemptions: int = 0) -> LoadHints:
    return LoadHints(usage, waiting, 4, 100, preemptions)


def controller(initial: int = 1000, floor: int = 100, ceiling: int = 4000,
               waiting_high: int | None = 2) -> AdaptiveBudget:
    plan = BudgetPlan(initial, floor, ceiling, None, increase_per_window=100,
                      waiting_high=waiting_high)
    budget = TokenBudget(initial, hard_limit=ceiling)
    return AdaptiveBudget(budget, plan, AdaptiveConfig())


def test_plan_from_load():
    assert plan_budget(AdaptiveConfig(), LOAD, 500, None) == BudgetPlan(
        initial_tokens=1000, min_tokens=62, max_tokens=4000, max_concurrency=16,
        increase_per_window=125, waiting_high=2,
    )


def test_plan_without_hints_is_fixed():
    assert plan_budget(AdaptiveConfig(), None, 500, 7) == BudgetPlan(
        initial_tokens=500, min_tokens=31, max_tokens=500, max_concurrency=7,
        increase_per_window=62, waiting_high=None,
    )


def test_plan_honours_explicit_settings():
    config = AdaptiveConfig(initial_tokens=300, min_tokens=50, max_tokens=600,
                            increase_per_window=10, waiting_high=5)
    assert plan_budget(config, LOAD, 500, 3) == BudgetPlan(300, 50, 600, 3, 10, 5)


def test_additive_increase_per_window():
    c = controller()
    c.on_success(0, 1000, hints())  # a whole budget's worth completed: +100
    assert c.capacity == 1100
    c.on_success(0, 550, hints())  # half a window: +50
    c.on_success(0, 575, hints())
    assert c.capacity == 1200
    c.on_success(0, 6, hints())  # fractions accumulate: 0.5 of a token, no step yet
    c.on_success(0, 6, hints())
    assert list(c.history) == [("start", 1000), ("increase", 1100), ("increase", 1150),
                               ("increase", 1200), ("increase", 1201)]


def test_preemption_cuts_once_per_window():
    c = controller()
    c.on_success(0, 1, hints(preemptions=3))  # first sample: a baseline, not a rise
    assert c.capacity == 1000
    c.on_success(0, 1, hints(preemptions=4))
    assert (c.capacity, c.epoch) == (500, 1)
    c.on_success(0, 1, hints(preemptions=6))  # sent before the cut: stale, ignored
    assert c.capacity == 500
    c.on_success(1, 1, hints(preemptions=7))  # sent after the cut: cuts again
    assert (c.capacity, c.epoch) == (250, 2)
    assert [reason for reason, _ in c.history] == ["start", "preemption", "preemption"]


def test_rising_queue_cuts_and_a_full_server_holds():
    c = controller()
    c.on_success(0, 1000, hints(waiting=2))  # at the threshold: still room, grows
    assert c.capacity == 1100
    c.on_success(0, 1000, hints(waiting=3))  # above it and rising: cut
    assert c.capacity == 550
    c.on_success(1, 1000, hints(waiting=3))  # above but not rising: hold
    c.on_success(1, 1000, hints(usage=0.97))  # KV nearly full: hold
    assert c.capacity == 550


def test_rate_limit_cuts_and_floor_holds():
    c = controller(initial=300, floor=100)
    c.on_rate_limited(0)
    assert c.capacity == 150
    c.on_rate_limited(1)
    assert c.capacity == 100
    c.on_rate_limited(2)
    assert c.capacity == 100


def test_without_hints_grows_only_back_to_the_ceiling():
    c = controller(initial=1000, ceiling=1000, waiting_high=None)
    c.on_success(0, 1000, None)
    assert c.capacity == 1000
    c.on_rate_limited(0)
    assert c.capacity == 500
    c.on_success(1, 5000, None)
    assert c.capacity == 1000


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"decrease_factor": 1.0}, "decrease_factor must be in (0, 1), got 1.0"),
        ({"kv_usage_high": 0.0}, "kv_usage_high must be in (0, 1], got 0.0"),
        ({"min_tokens": 0}, "min_tokens must be at least 1, got 0"),
        ({"waiting_high": -1}, "waiting_high must be at least 0, got -1"),
    ],
)
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError) as info:
        AdaptiveConfig(**kwargs)
    assert str(info.value) == message
