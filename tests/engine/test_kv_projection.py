"""The projected KV peak against the peak the scheduler then reaches, step by step."""

from __future__ import annotations

from dataclasses import replace

from engine_fakes import FakeRunner, make_group

from pagedserve.server.engine.config.engine_config import CacheConfig, SchedulerConfig
from pagedserve.server.engine.core.kv_projection import (
    CachedProjection,
    Demands,
    peak_growth_blocks,
    projected_blocks,
    projected_usage,
)
from pagedserve.server.engine.core.scheduler import Scheduler

BS = 4


def make_scheduler(num_blocks: int = 64, *, prefix_caching: bool = False,
                   **config: object) -> Scheduler:
    config.setdefault("max_model_len", 64)
    cache = CacheConfig(block_size=BS, watermark=0.0, enable_prefix_caching=prefix_caching)
    return Scheduler(SchedulerConfig(**config), cache, num_blocks, 0, clock=lambda: 0.0)


def add(scheduler: Scheduler, request_id: str, prompt: list[int], max_tokens: int,
        **kwargs: object) -> None:
    group = make_group(request_id, prompt, scheduler.new_seq_id(), BS, **kwargs)
    group.sampling_params = replace(group.sampling_params, max_tokens=max_tokens)
    scheduler.add_seq_group(group)


def projections_and_peaks(scheduler: Scheduler, runner: FakeRunner
                          ) -> list[tuple[int, int]]:
    """Before every step, (the projection, the most blocks in use from then to the end)."""
    used_after_schedule: list[int] = []
    schedule = scheduler.schedule

    def recording_schedule():
        out = schedule()
        used_after_schedule.append(scheduler.block_manager.device_pool.num_used_blocks)
        return out

    scheduler.schedule = recording_schedule  # type: ignore[method-assign]
    projections = []
    while scheduler.has_unfinished_requests():
        projections.append(projected_blocks(scheduler))
        runner.step()
    peaks = [max(used_after_schedule[i:]) for i in range(len(projections))]
    return list(zip(projections, peaks, strict=True))


def test_the_projection_is_the_peak_the_batch_reaches() -> None:
    scheduler = make_scheduler()
    lengths = {"a": (5, 9), "b": (3, 2), "c": (8, 5), "d": (2, 12), "e": (4, 1)}
    for request_id, (prompt_len, max_tokens) in lengths.items():
        add(scheduler, request_id, list(range(1, prompt_len + 1)), max_tokens)
    runner = FakeRunner(scheduler, {r: m for r, (_, m) in lengths.items()})
    pairs = projections_and_peaks(scheduler, runner)
    assert len(pairs) == 12
    # Exact before the first step (every request starts at once) and at every step after.
    assert all(projection == peak for projection, peak in pairs), pairs
    # Step 5: a holds 9 slots (3 blocks), c 12 (3), d 6 (2); b and e have ended.
    assert pairs[0] == (8, 8)


def test_a_shared_prefix_counts_once_and_stays_held_while_one_reader_runs() -> None:
    scheduler = make_scheduler(prefix_caching=True)
    prefix = list(range(1, 9))  # two full blocks
    add(scheduler, "a", [*prefix, 20], 3)
    runner = FakeRunner(scheduler, {"a": 3, "b": 7})
    runner.step()  # a's prefill caches the prefix's blocks
    add(scheduler, "b", [*prefix, 30], 7)
    pairs = projections_and_peaks(scheduler, runner)
    # Waiting, b counts in blocks of its own (its hits are known only at admission): a's
    # three and b's three at the step a ends, where b then reuses a's first two.
    assert pairs[0] == (6, 4)
    assert all(projection == peak for projection, peak in pairs[1:]), pairs
    # Admitted: the prefix's two blocks once, a's third, b's third; b's fourth (8 + 1 + 6
    # slots, the last token never cached) comes after a gave its third back.
    assert pairs[1] == (4, 4)


def test_forks_count_the_copy_their_first_write_makes() -> None:
    scheduler = make_scheduler()
    add(scheduler, "a", [1, 2, 3, 4, 5, 6], 5, best_of=3)
    runner = FakeRunner(scheduler, {"a": 5})
    pairs = projections_and_peaks(scheduler, runner)
    assert all(projection >= peak for projection, peak in pairs), pairs
    # Waiting, the forks count apart from the start: 3 forks x 3 blocks.
    assert pairs[0] == (9, 7)
    # Forked, sharing the prompt's two blocks: each fork counts a copy of the second for its
    # first write, where the last writer finds it its own (one block to spare); exact after.
    assert pairs[1] == (8, 7)
    assert all(projection == peak for projection, peak in pairs[2:]), pairs


def test_max_tokens_absent_runs_to_the_model_length() -> None:
    scheduler = make_scheduler(max_model_len=16)
    group = make_group("a", [1, 2, 3], scheduler.new_seq_id(), BS)
    group.sampling_params = replace(group.sampling_params, max_tokens=None)
    scheduler.add_seq_group(group)
    # 3 prompt tokens and 13 to come; the last is sampled, never cached: 15 slots.
    assert projected_blocks(scheduler) == 4
    assert projected_usage(scheduler) == 4 / 64


def test_growth_peaks_where_a_sequence_ends() -> None:
    demands = Demands()
    demands.add(num_tokens=1, remaining=8, held=0, private=0)
    demands.add(num_tokens=13, remaining=1, held=4, private=4)
    # Step 1: the first needs a block; the second ends after it. Step 8: the first holds
    # two, the second gave back four.
    assert peak_growth_blocks(demands, 4) == 1
    assert peak_growth_blocks(Demands(), 4) == 0
    ended = Demands()
    ended.add(num_tokens=5, remaining=0, held=2, private=2)
    assert peak_growth_blocks(ended, 4) == 0


def test_the_cached_projection_follows_the_requests_held_and_the_clock() -> None:
    scheduler = make_scheduler(num_blocks=16)
    now = [0.0]
    cached = CachedProjection(scheduler, every_s=1.0, clock=lambda: now[0])
    assert cached.usage() == 0.0
    add(scheduler, "a", [1, 2, 3], 5)  # one request waiting: computed again
    assert cached.usage() == projected_usage(scheduler) == 2 / 16
    scheduler.schedule()  # running now: computed again
    add(scheduler, "b", [1, 2], 2)
    before = projected_usage(scheduler)
    assert cached.usage() == before
    scheduler.abort("b")
    add(scheduler, "c", list(range(1, 13)), 20)  # as many held, a larger projection
    assert projected_usage(scheduler) > before
    assert cached.usage() == before  # the last value until the clock moves on
    now[0] = 1.0
    assert cached.usage() == projected_usage(scheduler)
