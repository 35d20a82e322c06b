"""Admission fair between tenants (lowest counter of admitted prompt tokens first), FCFS
within one; a small request's time to first token, in steps, stays bounded while another
tenant's huge request runs."""

from __future__ import annotations

import math

from engine_fakes import FakeRunner
from test_scheduler import add, batch, make_scheduler

from pagedserve.server.engine.core.scheduler import Scheduler


def admitted(scheduler: Scheduler) -> list[str]:
    return [request_id for request_id, *_ in batch(FakeRunner(scheduler).step())]


def test_one_tenant_is_first_come_first_served() -> None:
    scheduler = make_scheduler(max_num_seqs=8)
    for request_id in ("a0", "a1", "b0", "a2"):
        add(scheduler, request_id, 4, tenant="x")
    assert admitted(scheduler) == ["a0", "a1", "b0", "a2"]


def test_tenants_take_turns() -> None:
    scheduler = make_scheduler(max_num_seqs=8)
    for request_id in ("a0", "a1", "a2", "a3"):
        add(scheduler, request_id, 4, tenant="A")
    for request_id in ("b0", "b1"):
        add(scheduler, request_id, 4, tenant="B")
    # On a tie (equal tokens admitted) the tenant served least recently goes first, then the
    # older request.
    assert admitted(scheduler) == ["a0", "b0", "a1", "b1", "a2", "a3"]
    assert scheduler.tenant_shares.served == {"A": 16, "B": 8}


def test_turns_are_weighted_by_prompt_tokens() -> None:
    # The whole queue fits one step (no bound on shared steps): only the admission order shows.
    scheduler = make_scheduler(max_num_seqs=8, max_num_batched_tokens=64,
                               max_shared_prefill_tokens=64)
    add(scheduler, "a0", 12, tenant="A")
    add(scheduler, "a1", 12, tenant="A")
    for request_id in ("b0", "b1", "b2", "b3"):
        add(scheduler, request_id, 4, tenant="B")
    assert admitted(scheduler) == ["a0", "b0", "b1", "b2", "a1", "b3"]


def test_a_tenant_that_starts_waiting_gets_no_credit_for_its_idle_time() -> None:
    scheduler = make_scheduler(max_num_seqs=1)
    runner = FakeRunner(scheduler, {f"a{i}": 1 for i in range(6)} | {"b0": 1, "b1": 1})
    for i in range(6):
        add(scheduler, f"a{i}", 4, tenant="A")
    order = [batch(runner.step())[0][0] for _ in range(3)]  # A alone: a0, a1, a2
    add(scheduler, "b0", 4, tenant="B")
    add(scheduler, "b1", 4, tenant="B")
    order += [batch(runner.step())[0][0] for _ in range(5)]
    # B starts level with A, not 12 tokens behind it: the two alternate, B first.
    assert order == ["a0", "a1", "a2", "b0", "a3", "b1", "a4", "a5"]


def steps_to_first_token(fair: bool) -> int:
    """One tenant's 60 prompts of 40 tokens (max_tokens 1) are running when another
    tenant's single 8-token prompt arrives; the steps until that prompt's first token."""
    scheduler = make_scheduler(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16)
    huge = {f"h{i}": 1 for i in range(60)}
    runner = FakeRunner(scheduler, huge | {"small": 1})
    for request_id in huge:
        add(scheduler, request_id, 40, tenant="huge" if fair else None)
    for _ in range(5):
        runner.step()
    add(scheduler, "small", 8, tenant="small" if fair else None)
    steps = 0
    while "small" not in runner.finished:  # finished at its first token
        runner.step()
        steps += 1
    runner.run_until_done()
    return steps


def test_a_small_requests_first_token_is_not_held_back_by_a_huge_one() -> None:
    # Bound: what was running when it arrived (max_num_seqs prompts, at most) computes,
    # then its own prompt, at max_num_batched_tokens a step; plus the step that admits it.
    bound = math.ceil((4 * 40 + 8) / 16) + 1
    assert steps_to_first_token(fair=True) <= bound
    # One tenant for both (first come, first served): it waits for all 60 prompts.
    assert steps_to_first_token(fair=False) > 60 * 40 // 16 - 5
