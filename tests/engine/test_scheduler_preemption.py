"""Which request is preempted, how, and how it comes back.

Two 4-token requests run in a 4-block pool (block size 4): each holds two blocks after its
first decode, and at the 9th token ``a`` needs a third block, so ``b`` (the latest arrival)
must give its blocks up.
"""

from __future__ import annotations

from engine_fakes import FakeRunner, make_group

from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.core.sequence import SequenceGroup, SequenceStatus
from pagedserve.server.engine.logits.sampling_plan import SampledBatch, SampledToken, SamplingPlan

BS = 4


def make_scheduler(mode: str, num_blocks: int = 4, num_cpu_blocks: int = 8,
                   kv_allocation: str = "paged", max_model_len: int = 64) -> Scheduler:
    cache = CacheConfig(block_size=BS, watermark=0.0, kv_allocation=kv_allocation)
    config = SchedulerConfig(preemption_mode=mode, max_model_len=max_model_len)
    return Scheduler(config, cache, num_blocks, num_cpu_blocks)


def add(scheduler: Scheduler, request_id: str, best_of: int = 1) -> SequenceGroup:
    group = make_group(request_id, [1, 2, 3, 4], scheduler.new_seq_id(), BS, best_of=best_of)
    scheduler.add_seq_group(group)
    return group


def run_to_preemption(runner: FakeRunner) -> SchedulerOutput:
    for _ in range(5):
        assert runner.step().preempted == []
    return runner.step()


def test_recompute_preempts_the_latest_arrival_to_the_front_of_waiting() -> None:
    scheduler = make_scheduler("recompute")
    add(scheduler, "a")
    b = add(scheduler, "b")
    runner = FakeRunner(scheduler, {"a": 6, "b": 6, "c": 1})
    runner.step()
    add(scheduler, "c")  # arrives after b, and finds no room
    for _ in range(4):
        assert runner.step().preempted == []
    out = runner.step()
    assert out.preempted == ["b"]
    assert [(item.seq_group.request_id, item.num_new_tokens) for item in out.scheduled] == [
        ("a", 1)]
    assert out.blocks_to_swap_out == []
    seq = b.seqs[0]
    assert (seq.status, seq.num_computed_tokens, seq.block_table) == (
        SequenceStatus.WAITING, 0, [])
    assert seq.output_token_ids == seq.token_ids[4:] and seq.num_output_tokens == 5
    assert [group.request_id for group in scheduler.waiting] == ["b", "c"]
    assert scheduler.preemption_stats.num_recompute == 1
    # a finished at this step; b's prompt and outputs are prefilled again as one prompt.
    out = runner.step()
    assert [(i.seq_group.request_id, i.num_computed_tokens, i.num_new_tokens, i.samples)
            for i in out.scheduled] == [("b", 0, 9, True), ("c", 0, 4, True)]
    assert out.finished_request_ids == ["a"]


def test_swap_preempts_the_latest_arrival_to_cpu_and_back() -> None:
    scheduler = make_scheduler("swap")
    add(scheduler, "a")
    b = add(scheduler, "b")
    runner = FakeRunner(scheduler, {"a": 6, "b": 8})
    out = run_to_preemption(runner)
    seq = b.seqs[0]
    assert out.preempted == ["b"]
    assert out.blocks_to_swap_out == [(1, 0), (3, 1)]
    assert (seq.status, seq.block_table, seq.num_computed_tokens) == (
        SequenceStatus.SWAPPED, [0, 1], 8)
    assert [group.request_id for group in scheduler.swapped] == ["b"]
    assert scheduler.preemption_stats.num_swap == 1
    out = runner.step()  # a is done: b swaps back in and decodes its 9th token
    assert out.blocks_to_swap_in == [(0, 0), (1, 2)]
    assert [(i.seq_group.request_id, i.num_computed_tokens, i.num_new_tokens)
            for i in out.scheduled] == [("b", 8, 1)]
    assert seq.block_table == [0, 2, 1] and seq.status is SequenceStatus.RUNNING
    runner.run_until_done()
    assert sorted(runner.finished) == ["a", "b"]


def test_swapped_request_waits_while_the_running_one_holds_the_blocks() -> None:
    scheduler = make_scheduler("swap")
    add(scheduler, "a")
    add(scheduler, "b")
    runner = FakeRunner(scheduler, {"a": 8, "b": 8})
    assert run_to_preemption(runner).preempted == ["b"]
    out = runner.step()
    assert out.blocks_to_swap_in == [] and scheduler.num_swapped == 1
    assert [item.seq_group.request_id for item in out.scheduled] == ["a"]
    runner.run_until_done()
    assert sorted(runner.finished) == ["a", "b"]


def test_auto_swaps_groups_with_several_sequences() -> None:
    scheduler = make_scheduler("auto", num_blocks=5)
    add(scheduler, "a")
    b = add(scheduler, "b", best_of=2)
    runner = FakeRunner(scheduler, {"a": 8, "b": 8})
    preempted = []
    while not preempted:
        out = runner.step()
        preempted = out.preempted
    assert preempted == ["b"] and out.blocks_to_swap_out
    assert [seq.status for seq in b.seqs] == [SequenceStatus.SWAPPED] * 2
    # The two samples shared their prompt block on the device and still do on the CPU.
    assert b.seqs[0].block_table[0] == b.seqs[1].block_table[0]
    assert scheduler.block_manager.cpu_pool.ref_cnt(b.seqs[0].block_table[0]) == 2
    runner.run_until_done()


def test_auto_recomputes_single_sequences() -> None:
    scheduler = make_scheduler("auto")
    add(scheduler, "a")
    add(scheduler, "b")
    out = run_to_preemption(FakeRunner(scheduler, {"a": 6, "b": 6}))
    assert out.preempted == ["b"] and out.blocks_to_swap_out == []
    assert scheduler.preemption_stats.num_recompute == 1


def test_swap_without_cpu_room_falls_back_to_recompute() -> None:
    scheduler = make_scheduler("swap", num_cpu_blocks=1)
    add(scheduler, "a")
    b = add(scheduler, "b")
    out = run_to_preemption(FakeRunner(scheduler, {"a": 6, "b": 6}))
    assert out.preempted == ["b"] and out.blocks_to_swap_out == []
    assert b.seqs[0].status is SequenceStatus.WAITING
    assert (scheduler.preemption_stats.num_swap, scheduler.preemption_stats.num_recompute) == (
        0, 1)


def test_a_step_that_preempts_admits_nothing() -> None:
    scheduler = make_scheduler("recompute", num_blocks=5)
    add(scheduler, "a")
    add(scheduler, "b")
    runner = FakeRunner(scheduler, {"a": 6, "b": 6, "c": 1})
    for _ in range(5):
        runner.step()
    add(scheduler, "c")  # one block is free, enough for c's prompt
    out = runner.step()
    assert out.preempted == ["b"]
    assert [item.seq_group.request_id for item in out.scheduled] == ["a"]
    assert [group.request_id for group in scheduler.waiting] == ["b", "c"]


def test_request_alone_that_outgrows_the_pool_preempts_itself_and_is_ignored() -> None:
    scheduler = make_scheduler("recompute", num_blocks=2)
    group = add(scheduler, "a")
    runner = FakeRunner(scheduler, {"a": 20})
    for _ in range(5):
        runner.step()
    out = runner.step()  # the 9th token needs a third block that does not exist
    assert out.preempted == ["a"] and out.scheduled == []
    out = runner.step()
    assert out.ignored_seq_groups == [group] and out.finished_request_ids == ["a"]
    assert group.seqs[0].status is SequenceStatus.FINISHED_IGNORED
    assert group.seqs[0].finish_reason == "length"
    assert not scheduler.has_unfinished_requests()


def test_swapped_request_that_cannot_come_back_is_recomputed() -> None:
    # Three blocks of CPU room but two device blocks: b cannot return by swap-in while it
    # needs a third block for its next token, so it is prefilled again (and ignored).
    scheduler = make_scheduler("swap", num_blocks=2)
    group = add(scheduler, "a")
    runner = FakeRunner(scheduler, {"a": 20})
    for _ in range(5):
        runner.step()
    out = runner.step()
    assert out.preempted == ["a"] and out.blocks_to_swap_out == [(0, 0), (1, 1)]
    out = runner.step()
    assert out.blocks_to_swap_in == [] and out.ignored_seq_groups == [group]
    assert scheduler.block_manager.cpu_pool.num_free_blocks == 8


def test_contiguous_fork_preempts_the_latest_other_arrival() -> None:
    scheduler = make_scheduler("recompute", num_blocks=8, kv_allocation="contiguous",
                               max_model_len=16)
    a = add(scheduler, "a", best_of=2)  # 4 blocks reserved, 4 more needed by its fork
    b = make_group("b", [9], scheduler.new_seq_id(), BS)
    scheduler.add_seq_group(b)
    out = scheduler.schedule()  # the fork's blocks are not held yet: b takes them
    assert [i.seq_group.request_id for i in out.scheduled] == ["a", "b"]
    assert b.seqs[0].block_table == [4, 5, 6, 7]
    scheduler.update_after_step(out)
    child = scheduler.fork_seq(a.seqs[0], a)
    assert child.block_table == [4, 5, 6, 7]
    assert b.seqs[0].status is SequenceStatus.WAITING
    scheduler.check_integrity()
    for seq, token in ((a.seqs[0], 5), (child, 6)):
        seq.append_token(token, 0.0)
    out = scheduler.schedule()
    assert out.preempted == ["b"] and out.blocks_to_copy == [(0, 4)]
    assert [(i.seq.seq_id, i.num_computed_tokens, i.num_new_tokens) for i in out.scheduled] == [
        (0, 4, 1), (child.seq_id, 4, 1)]
    assert [group.request_id for group in scheduler.waiting] == ["b"]


def test_a_preemption_caused_by_a_fork_is_reported_in_its_own_step() -> None:
    scheduler = make_scheduler("recompute", num_blocks=8, kv_allocation="contiguous",
                               max_model_len=16)
    a = add(scheduler, "a", best_of=2)
    b = make_group("b", [9], scheduler.new_seq_id(), BS)
    scheduler.add_seq_group(b)
    out = scheduler.schedule()
    plan = SamplingPlan.of(out, [0, 4, 5])
    assert [(d.seq.seq_id, d.index, d.forks) for d in plan.draws] == [
        (0, 0, False), (0, 1, True), (1, 0, False)]
    tokens = [SampledToken(draw, 5 + draw.index, 0.0, None) for draw in plan.draws]
    scheduler.update_from_output(out, SampledBatch(tokens=tokens))
    assert out.preempted == ["b"]  # the step that forked reports it
    # b was preempted after sampling: it keeps its token and recomputes.
    assert b.seqs[0].status is SequenceStatus.WAITING and b.seqs[0].output_token_ids == [5]
    parent, child = a.seqs
    assert (parent.output_token_ids, child.output_token_ids) == ([5], [6])
    assert child.sample_index == 1 and child.block_table == [4, 5, 6, 7]
    scheduler.check_integrity()
    out = scheduler.schedule()
    assert out.preempted == [] and out.blocks_to_copy == [(0, 4)]


def test_abort_of_a_swapped_request_frees_its_cpu_blocks() -> None:
    scheduler = make_scheduler("swap")
    add(scheduler, "a")
    b = add(scheduler, "b")
    runner = FakeRunner(scheduler, {"a": 8, "b": 8})
    run_to_preemption(runner)
    assert scheduler.block_manager.cpu_pool.num_used_blocks == 2
    assert scheduler.abort("b") is b
    assert scheduler.block_manager.cpu_pool.num_used_blocks == 0
    assert b.seqs[0].status is SequenceStatus.FINISHED_ABORTED and scheduler.num_swapped == 0
    scheduler.check_integrity()
    assert runner.step().finished_request_ids == ["b"]
