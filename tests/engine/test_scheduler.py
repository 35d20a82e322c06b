from __future__ import annotations

import pytest
from engine_fakes import FakeRunner, make_group

from pagedserve.common.engine_errors import InvalidRequestError, QueueFullError
from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.scheduler import Scheduler
from pagedserve.server.engine.core.scheduler_output import SchedulerOutput
from pagedserve.server.engine.core.sequence import SequenceGroup, SequenceStatus

BS = 4


def make_scheduler(num_blocks: int = 32, num_cpu_blocks: int = 0, *,
                   prefix_caching: bool = False, **config: object) -> Scheduler:
    config.setdefault("max_model_len", 64)
    cache = CacheConfig(block_size=BS, watermark=0.0, enable_prefix_caching=prefix_caching)
    return Scheduler(SchedulerConfig(**config), cache, num_blocks, num_cpu_blocks,
                     clock=lambda: 42.0)


def add(scheduler: Scheduler, request_id: str, prompt_len: int, **kwargs: object
        ) -> SequenceGroup:
    group = make_group(request_id, list(range(1, prompt_len + 1)), scheduler.new_seq_id(), BS,
                       **kwargs)
    scheduler.add_seq_group(group)
    return group


def batch(out: SchedulerOutput) -> list[tuple[str, int, int, bool]]:
    return [(item.seq_group.request_id, item.num_computed_tokens, item.num_new_tokens,
             item.samples) for item in out.scheduled]


def test_fcfs_admission_and_batch_order() -> None:
    scheduler = make_scheduler()
    for request_id in ("a", "b", "c"):
        add(scheduler, request_id, 3)
    runner = FakeRunner(scheduler)
    assert batch(runner.step()) == [("a", 0, 3, True), ("b", 0, 3, True), ("c", 0, 3, True)]
    assert batch(runner.step()) == [("a", 3, 1, True), ("b", 3, 1, True), ("c", 3, 1, True)]
    assert scheduler.running[0].metrics.first_scheduled_time == 42.0


def test_max_num_seqs_bounds_the_running_batch() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for request_id in ("a", "b", "c"):
        add(scheduler, request_id, 2)
    runner = FakeRunner(scheduler, {"a": 1, "b": 3, "c": 1})
    assert [g for g, *_ in batch(runner.step())] == ["a", "b"]  # a finishes (1 token)
    assert (scheduler.num_running, scheduler.num_waiting) == (1, 1)
    assert batch(runner.step()) == [("b", 2, 1, True), ("c", 0, 2, True)]


def test_parallel_samples_reserve_their_seats() -> None:
    scheduler = make_scheduler(max_num_seqs=3)
    add(scheduler, "a", 2, best_of=2)
    add(scheduler, "b", 2, best_of=2)
    runner = FakeRunner(scheduler, {"a": 2, "b": 2})
    assert [g for g, *_ in batch(runner.step())] == ["a"]  # b would make four sequences
    assert scheduler.running[0].num_unfinished_seqs() == 2
    assert [g for g, *_ in batch(runner.step())] == ["a", "a"]
    assert [g for g, *_ in batch(runner.step())] == ["b"]


def test_chunked_prefill_splits_to_the_token_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=4)
    add(scheduler, "a", 10)
    add(scheduler, "b", 3)
    runner = FakeRunner(scheduler)
    assert batch(runner.step()) == [("a", 0, 4, False)]
    assert batch(runner.step()) == [("a", 4, 4, False)]
    assert batch(runner.step()) == [("a", 8, 2, True), ("b", 0, 2, False)]
    out = runner.step()
    assert batch(out) == [("a", 10, 1, True), ("b", 2, 1, True)]
    assert out.num_batched_tokens == 2


def test_a_request_sequences_advance_together() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=2)
    add(scheduler, "a", 1, best_of=2)
    add(scheduler, "b", 1)
    runner = FakeRunner(scheduler, {"a": 3, "b": 3})
    assert batch(runner.step()) == [("a", 0, 1, True), ("b", 0, 1, True)]
    # a's two samples take the whole budget; b waits rather than split a.
    assert batch(runner.step()) == [("a", 1, 1, True), ("a", 1, 1, True)]
    assert batch(runner.step()) == [("a", 2, 1, True), ("a", 2, 1, True)]
    assert batch(runner.step()) == [("b", 1, 1, True)]


def test_update_after_step_twice_raises() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", 3)
    out = scheduler.schedule()
    scheduler.update_after_step(out)
    with pytest.raises(RuntimeError, match="sequence 0 was already advanced past this step"):
        scheduler.update_after_step(out)


def test_finished_request_leaves_and_is_reported_once() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 3)
    runner = FakeRunner(scheduler, {"a": 1})
    out = runner.step()
    assert out.finished_request_ids == []
    assert group.seqs[0].status is SequenceStatus.FINISHED_LENGTH
    assert group.seqs[0].finish_reason == "length"
    assert scheduler.num_running == 0 and not scheduler.has_unfinished_requests()
    assert scheduler.schedule().finished_request_ids == ["a"]
    assert scheduler.schedule().finished_request_ids == []
    assert scheduler.block_manager.device_pool.num_free_blocks == 32


@pytest.mark.parametrize("where", ["waiting", "running"])
def test_abort_frees_everything(where: str) -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 9)
    if where == "running":
        FakeRunner(scheduler).step()
        assert scheduler.block_manager.device_pool.num_used_blocks == 3
    assert scheduler.abort("a") is group
    assert scheduler.abort("a") is None
    assert group.seqs[0].status is SequenceStatus.FINISHED_ABORTED
    assert group.seqs[0].finish_reason == "abort"
    assert scheduler.block_manager.device_pool.num_used_blocks == 0
    out = scheduler.schedule()
    assert out.finished_request_ids == ["a"] and out.is_empty
    scheduler.check_integrity()


def test_fork_and_free_seq() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 6, best_of=3)
    out = scheduler.schedule()
    scheduler.update_after_step(out)
    parent = group.seqs[0]
    child = scheduler.fork_seq(parent, group, new_seq_id=10)
    other = scheduler.fork_seq(parent, group)
    assert (child.seq_id, other.seq_id) == (10, 11)
    assert child.block_table == other.block_table == parent.block_table == [0, 1]
    assert scheduler.block_manager.device_pool.ref_cnt(1) == 3
    with pytest.raises(ValueError, match="sequence id 10 is already in use"):
        scheduler.fork_seq(parent, group, new_seq_id=10)
    scheduler.free_seq(other)
    assert [seq.seq_id for seq in group.seqs] == [0, 10]
    assert scheduler.block_manager.device_pool.ref_cnt(1) == 2
    scheduler.check_integrity()


def test_finish_seq_validates() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 2)
    seq = group.seqs[0]
    with pytest.raises(ValueError, match="status must be a finished status, got RUNNING"):
        scheduler.finish_seq(seq, SequenceStatus.RUNNING)
    scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)
    assert seq.finish_reason == "stop"
    with pytest.raises(ValueError, match="sequence 0 is not live in this scheduler"):
        scheduler.finish_seq(seq, SequenceStatus.FINISHED_STOPPED)


def test_prompt_longer_than_max_model_len_is_rejected() -> None:
    scheduler = make_scheduler(max_model_len=8)
    with pytest.raises(InvalidRequestError) as info:
        add(scheduler, "a", 9)
    assert info.value.param == "prompt"
    assert info.value.message == (
        "This model's maximum context length is 8 tokens. However, the prompt has 9 tokens, "
        "which leaves no room for a completion. Please reduce the prompt.")
    assert scheduler.num_waiting == 0


def test_prompt_larger_than_the_device_pool_is_rejected() -> None:
    cache = CacheConfig(block_size=BS, watermark=0.25)
    scheduler = Scheduler(SchedulerConfig(max_model_len=64), cache, 8, 0)
    add(scheduler, "fits", 24)
    with pytest.raises(InvalidRequestError) as info:
        add(scheduler, "a", 25)
    assert info.value.param == "prompt"
    assert info.value.message == (
        "the prompt needs 7 KV cache blocks of 4 tokens, more than the 6 the device pool can "
        "hold (8 blocks, 2 kept free)")


def test_other_rejections() -> None:
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=64)
    with pytest.raises(InvalidRequestError) as info:
        add(scheduler, "wide", 2, best_of=3)
    assert (info.value.param, info.value.message) == (
        "n", "the request runs 3 sequences at once (n / best_of), more than max_num_seqs (2)")
    with pytest.raises(InvalidRequestError) as info:
        add(scheduler, "empty", 0)
    assert (info.value.param, info.value.message) == (
        "prompt", "the prompt must contain at least 1 token")
    add(scheduler, "a", 2)
    with pytest.raises(InvalidRequestError) as info:
        add(scheduler, "a", 2)
    assert (info.value.param, info.value.message) == (
        "request_id", "request id 'a' is already in use")


def test_queue_full_raises() -> None:
    scheduler = make_scheduler(max_waiting_requests=2)
    add(scheduler, "a", 2)
    add(scheduler, "b", 2)
    with pytest.raises(QueueFullError) as info:
        add(scheduler, "c", 2)
    assert info.value.message == (
        "the waiting queue is full (2 requests, max_waiting_requests=2); retry later")
    scheduler.schedule()  # both start running: the queue has room again
    add(scheduler, "c", 2)
    assert scheduler.num_waiting == 1


def test_prefix_hit_skips_cached_tokens() -> None:
    scheduler = make_scheduler(prefix_caching=True)
    first = add(scheduler, "a", 10)
    runner = FakeRunner(scheduler, {"a": 5, "b": 5})
    runner.step()
    second = add(scheduler, "b", 10)
    assert batch(runner.step()) == [("a", 10, 1, True), ("b", 8, 2, True)]
    assert second.seqs[0].block_table[:2] == first.seqs[0].block_table[:2]
    stats = scheduler.stats()
    assert (stats.prefix_cache_queried_tokens, stats.prefix_cache_hit_tokens) == (20, 8)
    assert stats.prefix_cache_hit_rate == 0.4


def test_stats_snapshot() -> None:
    scheduler = make_scheduler(num_blocks=10, num_cpu_blocks=3)
    add(scheduler, "a", 5)
    add(scheduler, "b", 4, best_of=2)
    runner = FakeRunner(scheduler, {"a": 8, "b": 8})
    runner.step()
    add(scheduler, "c", 2)
    stats = scheduler.stats()
    # a holds 6 tokens in blocks 0-1; b's two samples share block 2, full with the prompt
    # (their sampled tokens get slots next step). A shared block counts once.
    assert (stats.num_waiting, stats.num_running, stats.num_swapped) == (1, 2, 0)
    assert stats.num_running_seqs == 3
    assert (stats.kv.device.num_used_blocks, stats.kv.device.num_free_blocks) == (3, 7)
    assert stats.kv_cache_usage == 0.3 and stats.free_token_capacity == 28
    assert (stats.occupancy.num_token_slots, stats.occupancy.num_real_tokens) == (12, 10)
    assert stats.kv.cpu.num_blocks == 3 and stats.num_preemptions == 0


def test_abort_while_the_step_runs_is_skipped_by_the_update() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 5)
    out = scheduler.schedule()
    scheduler.abort("a")
    scheduler.update_after_step(out)
    assert group.seqs[0].num_computed_tokens == 0
    assert scheduler.schedule().finished_request_ids == ["a"]


def test_dropping_the_last_sequence_retires_the_request() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 5)
    scheduler.update_after_step(scheduler.schedule())
    scheduler.free_seq(group.seqs[0])
    assert group.seqs == [] and not scheduler.has_unfinished_requests()
    assert scheduler.get_seq_group("a") is None
    assert scheduler.schedule().finished_request_ids == ["a"]
    assert scheduler.block_manager.device_pool.num_used_blocks == 0


def test_sequences_must_be_new_and_unique() -> None:
    scheduler = make_scheduler()
    group = add(scheduler, "a", 2)
    reused = make_group("b", [1], group.seqs[0].seq_id, BS)
    with pytest.raises(ValueError, match="sequence id 0 is already in use"):
        scheduler.add_seq_group(reused)
    started = make_group("c", [1], 5, BS)
    started.seqs[0].status = SequenceStatus.RUNNING
    with pytest.raises(ValueError, match=r"sequence 5 must be new \(WAITING, no blocks\)"):
        scheduler.add_seq_group(started)
    with pytest.raises(ValueError, match="sequence 0 is not running in request 'a'"):
        scheduler.fork_seq(group.seqs[0], group)
    scheduler.finish_seq(group.seqs[0], SequenceStatus.FINISHED_STOPPED)
    assert scheduler.get_seq_group("a") is None
