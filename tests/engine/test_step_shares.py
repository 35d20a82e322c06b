"""A step's prefill tokens split fairly between tenants: per-step schedules (which request
computes how many tokens in each step) with one tenant's huge prompts beside another's small
one, the same requests under one tenant (first come, first served, as before), and a tenant
with many requests beside one with few."""

from __future__ import annotations

from engine_fakes import FakeRunner
from test_scheduler import add, make_scheduler

from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.step_shares import water_fill

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


def test_a_small_tenants_prompt_is_prefilled_in_the_step_that_admits_it() -> None:
    schedule = huge_beside_small(make_scheduler(max_num_batched_tokens=16), "huge", "small")
    assert schedule == [
        [("h0", 16)],             # one tenant live: the whole step, as before
        [("h0", 10), ("s0", 6)],  # the small prompt in full; the huge one the rest
        [("h0", 14), ("s0", 1), ("h1", 1)],  # s0 decodes; one tenant prefills: all of it
        [("h1", 16)],
        [("h1", 16)],
        [("h1", 7)],
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


def test_a_bound_keeps_steps_short_while_two_tenants_are_live() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=16, max_shared_prefill_tokens=12)
    assert huge_beside_small(scheduler, "huge", "small") == [
        [("h0", 16)],             # one tenant live: unbounded
        [("h0", 6), ("s0", 6)],   # 12 in all: the small prompt's 6, the rest to h0
        [("h0", 12), ("s0", 1)],  # s0 decodes; h0's tenant alone prefills, 12 at most
        [("h0", 6), ("h1", 10)],  # s0 finished: one tenant, the whole step again
        [("h1", 16)],
        [("h1", 14)],
    ]


def test_an_older_prefill_does_not_hold_back_another_tenants_request() -> None:
    def schedule(first: str, second: str) -> list[Step]:
        scheduler = make_scheduler(max_num_batched_tokens=8)
        runner = FakeRunner(scheduler, {"h0": 1, "d0": 4})
        add(scheduler, "h0", 40, tenant=first)
        add(scheduler, "d0", 2, tenant=second)
        return steps(runner, 3)

    # d0's prompt, then its decodes, go beside h0's chunks.
    assert schedule("A", "B") == [[("h0", 6), ("d0", 2)], [("h0", 7), ("d0", 1)],
                                  [("h0", 7), ("d0", 1)]]
    # One tenant: d0 waits for h0's whole prompt.
    assert schedule("A", "A") == [[("h0", 8)]] * 3


def test_a_tenant_with_many_requests_does_not_starve_one_with_few() -> None:
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=12)
    runner = FakeRunner(scheduler, {f"a{i}": 1 for i in range(8)} | {"b0": 1})
    for i in range(8):
        add(scheduler, f"a{i}", 10, tenant="A")
    add(scheduler, "b0", 20, tenant="B")
    # B's one long prompt gets half of every step while it prefills; A's eight split the
    # other half in arrival order.
    assert steps(runner, 5) == [
        [("a0", 6), ("b0", 6)],
        [("a0", 4), ("b0", 6), ("a1", 2)],
        [("a1", 6), ("b0", 6)],
        [("a1", 2), ("b0", 2), ("a2", 8)],
        [("a2", 2), ("a3", 10)],
    ]


def test_water_fill_meets_small_demands_and_splits_the_rest() -> None:
    served = {"a": (0, 0), "b": (0, 1), "c": (5, 2)}
    assert water_fill({"a": 100, "b": 3, "c": 100}, 20, served.__getitem__) == {
        "b": 3, "a": 9, "c": 8}  # the odd token to a, served less than c
    assert water_fill({"a": 4, "b": 4}, 20, served.__getitem__) == {"a": 4, "b": 4}
    assert water_fill({"a": 10, "b": 10}, 0, served.__getitem__) == {"a": 0, "b": 0}


def test_a_request_waiting_for_blocks_keeps_no_share() -> None:
    scheduler = make_scheduler(num_blocks=12, max_num_batched_tokens=16,
                               max_shared_prefill_tokens=8)
    runner = FakeRunner(scheduler, {"h0": 1, "s0": 1})
    add(scheduler, "h0", 40, tenant="huge")   # 10 of the 12 blocks
    schedule = steps(runner, 1)
    add(scheduler, "s0", 12, tenant="small")  # 3 blocks: it starts when h0 frees its own
    schedule += steps(runner, 3)
    # Unbounded while s0 cannot start, so that h0's prompt, and its blocks, finish soonest.
    assert schedule == [[("h0", 16)], [("h0", 16)], [("h0", 8)], [("s0", 12)]]


def test_a_tenant_lingers_for_some_steps_after_its_last_request() -> None:
    def schedule(linger: int) -> list[Step]:
        scheduler = make_scheduler(max_num_batched_tokens=16, max_shared_prefill_tokens=8,
                                   tenant_linger_steps=linger)
        runner = FakeRunner(scheduler, {"h0": 1, "s0": 1})
        add(scheduler, "h0", 40, tenant="huge")
        add(scheduler, "s0", 2, tenant="small")
        return steps(runner, 5)

    # s0 finishes in the first step; its tenant still counts for two steps more, so the
    # steps stay short for its next request.
    assert schedule(2) == [[("h0", 6), ("s0", 2)], [("h0", 8)], [("h0", 8)], [("h0", 16)],
                           [("h0", 2)]]
    assert schedule(0) == [[("h0", 6), ("s0", 2)], [("h0", 16)], [("h0", 16)], [("h0", 2)],
                           []]
