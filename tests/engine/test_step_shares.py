"""A step's prefill tokens split between tenants: per-step schedules (which request computes
how many tokens in each step) with one tenant's huge prompts beside another's small one, the
same requests under one tenant (first come, first served, as before), two backlogged tenants
taking turns, a tenant lingering for some seconds after its last request, and a tenant with
many requests beside one with few."""

from __future__ import annotations

import pytest
from engine_fakes import FakeRunner
from test_scheduler import BS, add, make_scheduler

from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import ScheduledSequence, SchedulerOutput
from pagedserve.server.engine.core.step_shares import least_served_first
from pagedserve.server.engine.core.tenant_activity import DECAY, TenantActivity

Step = list[tuple[str, int]]


def steps(runner: FakeRunner, count: int) -> list[Step]:
    return [[(item.seq_group.request_id, item.num_new_tokens) for item in runner.step().scheduled]
            for _ in range(count)]


def huge_beside_small(scheduler: Scheduler, huge: str | None, small: str | None) -> list[Step]:
    """Two 40-token prompts of one tenant; a 6-token prompt of another arrives after the first
    step. 16 tokens a step."""
    runner = FakeRunner(scheduler, {"h0": 1, "h1": 1, "s0": 2})
    add(scheduler, "h0", 40, tenant=huge)
    add(scheduler, "h1", 40, tenant=huge)
    schedule = steps(runner, 1)
    add(scheduler, "s0", 6, tenant=small)
    schedule += steps(runner, 5)
    runner.run_until_done()
    return schedule


def test_a_newly_arrived_tenants_prompt_goes_first_in_a_short_step() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16, max_shared_prefill_tokens=4,
                               tenant_linger_seconds=0.0)
    assert huge_beside_small(scheduler, "huge", "small") == [
        [("h0", 16)],             # one tenant live: the whole step, as before
        # Two tenants with prompts: 4 tokens each, 8 in all. The small tenant, served least
        # lately, takes its whole prompt first; the huge one what it leaves of 8 - 4 (none:
        # a token, so that it moves on).
        [("h0", 1), ("s0", 6)],
        [("h0", 4), ("s0", 1)],   # s0 decodes; one tenant prefills: 4 tokens
        [("h0", 16)],             # s0 finished, no lingering: one tenant, unbounded again
        [("h0", 3), ("h1", 13)],
        [("h1", 16)],
    ]


def test_one_tenant_is_first_come_first_served_as_before() -> None:
    for tenant in (None, "x"):
        scheduler = make_scheduler(max_num_batched_tokens=16, max_shared_prefill_tokens=4)
        assert huge_beside_small(scheduler, tenant, tenant) == [
            [("h0", 16)],
            [("h0", 16)],             # s0 waits for the older prompt
            [("h0", 8), ("h1", 8)],
            [("h1", 16)],
            [("h1", 16)],
            [("s0", 6)],
        ]


def test_two_backlogged_tenants_take_turns() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64, max_shared_prefill_tokens=8,
                               tenant_linger_seconds=0.0)
    runner = FakeRunner(scheduler, {"a0": 1, "b0": 1})
    add(scheduler, "a0", 40, tenant="A")
    add(scheduler, "b0", 40, tenant="B")
    # 16 tokens a step; the tenant served less lately takes them, the other a token. Whichever
    # is served becomes the one served more, so the two alternate. At the end A needs 6: B
    # gets what A leaves of 16 - 8.
    assert steps(runner, 6) == [
        [("a0", 16), ("b0", 1)],
        [("a0", 1), ("b0", 16)],
        [("a0", 16), ("b0", 1)],
        [("a0", 1), ("b0", 16)],
        [("a0", 6), ("b0", 2)],
        [("b0", 4)],
    ]
    assert not scheduler.has_unfinished_requests()


def test_an_older_prefill_does_not_hold_back_another_tenants_request() -> None:
    def schedule(first: str, second: str) -> list[Step]:
        scheduler = make_scheduler(max_num_batched_tokens=8, max_shared_prefill_tokens=8)
        runner = FakeRunner(scheduler, {"h0": 1, "d0": 4})
        add(scheduler, "h0", 40, tenant=first)
        add(scheduler, "d0", 2, tenant=second)
        return steps(runner, 3)

    # No bound (8 a tenant, the whole step): d0's prompt, then its decodes (outside the
    # prefill pool), go beside h0's chunks.
    assert schedule("A", "B") == [[("h0", 6), ("d0", 2)], [("h0", 7), ("d0", 1)],
                                  [("h0", 7), ("d0", 1)]]
    # One tenant: d0 waits for h0's whole prompt.
    assert schedule("A", "A") == [[("h0", 8)]] * 3


def test_a_tenant_with_many_requests_does_not_starve_one_with_few() -> None:
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=12,
                               max_shared_prefill_tokens=12, tenant_linger_seconds=0.0)
    runner = FakeRunner(scheduler, {f"a{i}": 1 for i in range(8)} | {"b0": 1})
    for i in range(8):
        add(scheduler, f"a{i}", 10, tenant="A")
    add(scheduler, "b0", 20, tenant="B")
    # No bound. B's one prompt (the smaller demand) goes first; then A, served less lately,
    # takes the step but for B's token; then B again, and its prompt is done in three steps
    # while A's eight, in arrival order, take seven. With B gone A has the steps to itself.
    assert steps(runner, 4) == [
        [("a0", 1), ("b0", 11)],
        [("a0", 9), ("b0", 1), ("a1", 2)],
        [("a1", 4), ("b0", 8)],
        [("a1", 4), ("a2", 8)],
    ]


def test_a_request_waiting_for_blocks_keeps_no_share() -> None:
    scheduler = make_scheduler(num_blocks=12, max_num_batched_tokens=16,
                               max_shared_prefill_tokens=8, tenant_linger_seconds=0.0)
    runner = FakeRunner(scheduler, {"h0": 1, "s0": 1})
    add(scheduler, "h0", 40, tenant="huge")   # 10 of the 12 blocks
    schedule = steps(runner, 1)
    add(scheduler, "s0", 12, tenant="small")  # 3 blocks: it starts when h0 frees its own
    schedule += steps(runner, 3)
    # Unbounded while s0 cannot start, so that h0's prompt, and its blocks, finish soonest.
    assert schedule == [[("h0", 16)], [("h0", 16)], [("h0", 8)], [("s0", 12)]]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_tenant_lingers_for_some_seconds_after_its_last_request() -> None:
    clock = Clock()
    config = SchedulerConfig(max_model_len=64, max_num_batched_tokens=16,
                             max_shared_prefill_tokens=4, tenant_linger_seconds=1.0)
    scheduler = Scheduler(config, CacheConfig(block_size=BS, watermark=0.0), 32, 0, clock=clock)
    runner = FakeRunner(scheduler, {"h0": 1, "s0": 1, "s1": 1})
    add(scheduler, "h0", 60, tenant="huge")
    add(scheduler, "s0", 2, tenant="small")
    schedule = steps(runner, 1)   # s0 finishes at 0 s
    for now in (0.5, 0.99, 1.0):
        clock.now = now
        schedule += steps(runner, 1)
    add(scheduler, "s1", 3, tenant="small")
    schedule += steps(runner, 2)
    assert schedule == [
        [("h0", 2), ("s0", 2)],   # 8 for two tenants: the smaller demand first, 8 - 4 left
        [("h0", 4)],              # the small tenant lingers: 4 tokens a step
        [("h0", 4)],
        [("h0", 16)],             # a second after its last request: no longer live
        [("h0", 1), ("s1", 3)],   # its next one: two tenants again, s1's prompt first
        [("h0", 4)],
    ]


def test_least_served_first_meets_demands_in_order_and_keeps_a_token_a_sequence() -> None:
    demand, width = {"a": 100, "b": 3, "c": 100}, {"a": 1, "b": 1, "c": 2}
    assert least_served_first(["b", "a", "c"], demand, width, 20, 20) == {
        "b": 3, "a": 17, "c": 2}
    assert least_served_first(["a", "b", "c"], demand, width, 20, 20) == {
        "a": 20, "b": 1, "c": 2}
    assert least_served_first(["c", "a", "b"], demand, width, 0, 0) == {"c": 2, "a": 1, "b": 1}
    # The others share what the first leaves of 10.
    assert least_served_first(["b", "a", "c"], demand, width, 20, 10) == {
        "b": 3, "a": 7, "c": 2}
    assert least_served_first(["a", "b", "c"], demand, width, 20, 10) == {
        "a": 20, "b": 1, "c": 2}


def scheduled(tenant: str | None, prompt_len: int, computed: int, new: int) -> ScheduledSequence:
    scheduler = make_scheduler()
    group = add(scheduler, "r", prompt_len, tenant=tenant)
    return ScheduledSequence(group.seqs[0], group, new, computed, max(prompt_len, computed + 1))


def test_recent_service_counts_prompt_tokens_and_decays() -> None:
    activity = TenantActivity(1.0, lambda: 0.0)
    activity.record(SchedulerOutput(scheduled=[scheduled("a", 10, 0, 10),
                                               scheduled("a", 10, 10, 1),  # a decode
                                               scheduled("b", 1, 0, 1)]))  # a 1-token prompt
    assert activity.recent == {"a": 10.0, "b": 1.0}
    activity.record(SchedulerOutput())
    assert activity.recent == {"a": 10 * DECAY, "b": DECAY}
    for _ in range(8):
        activity.record(SchedulerOutput())
    assert activity.recent == {"a": pytest.approx(10 * DECAY ** 9)}  # b fell below half a
    # token: forgotten
    assert activity.served("b") == 0.0
