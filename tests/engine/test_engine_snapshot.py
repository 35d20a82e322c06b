"""The engine's snapshot for observers: each device block's state (free, cached, used,
shared) by block id through a prefix hit and the requests' ends, the queues, and the step
time and hit rate of the interval; built only when asked for, and never more than its share
of the loop's time."""

from __future__ import annotations

from engine_fakes import FakeRunner
from test_scheduler import add, make_scheduler

from pagedserve.server.engine.engine_snapshot import (
    MAX_LOOP_SHARE,
    BlockState,
    SnapshotPublisher,
)
from pagedserve.server.engine.engine_stats import StepStats

F, C, U, S = (bytes([state]) for state in BlockState)  # free, cached, used, shared


class Clock:
    """A clock that moves only by ``tick`` seconds a reading, or when set."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now, self.tick = 100.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def fresh(publisher: SnapshotPublisher):
    publisher.latest()  # asks for one
    publisher.publish()  # the loop builds it between steps
    return publisher.latest()


def step_stats(duration_s: float, prefill: int, decode: int) -> StepStats:
    return StepStats(num_prefill_tokens=prefill, num_decode_tokens=decode,
                     duration_s=duration_s, num_preempted=0, num_running=1, num_waiting=0,
                     finished=[])


def test_block_states_through_a_prefix_hit_and_the_requests_end() -> None:
    scheduler = make_scheduler(num_blocks=8, prefix_caching=True)
    publisher = SnapshotPublisher(scheduler, Clock())
    runner = FakeRunner(scheduler, {"a": 3, "b": 2})
    idle = fresh(publisher)
    assert (idle.block_states, idle.num_blocks, idle.count(BlockState.FREE)) == (b"", 8, 8)

    add(scheduler, "a", 8)  # two full blocks of prompt: 0 and 1
    runner.step()
    assert fresh(publisher).block_states == U + U

    add(scheduler, "b", 8)  # the same prompt: its first block is a's block 0 (its last
    runner.step()           # prompt token is always computed, so block 1 is its own: 3),
    snapshot = fresh(publisher)  # and a's ninth token opened block 2
    assert snapshot.block_states == S + U + U + U
    assert (snapshot.num_running, snapshot.num_waiting, snapshot.num_swapped) == (2, 0, 0)
    assert [snapshot.count(state) for state in BlockState] == [4, 0, 3, 1]
    assert snapshot.prefix_cache_hit_rate == 4 / 16  # b's 4 of the 16 prompt tokens looked up

    while scheduler.has_unfinished_requests():
        runner.step()
    # Full blocks keep their prefix (cached, evictable); the partly filled last blocks (a's
    # 2, and 4, which b's second step opened) are free. Block 3, b's second prompt block,
    # holds the same tokens as block 1, which stays the cache's entry for them: free too.
    assert fresh(publisher).block_states == C + C + F + F + F


def test_without_prefix_caching_freed_blocks_are_free_and_there_is_no_hit_rate() -> None:
    scheduler = make_scheduler(num_blocks=8)
    publisher = SnapshotPublisher(scheduler, Clock())
    runner = FakeRunner(scheduler, {"a": 2})
    add(scheduler, "a", 8, best_of=2)  # two samples share the prompt's blocks
    runner.step()
    forked = fresh(publisher)
    assert forked.block_states[:2] == S + S
    assert forked.prefix_cache_hit_rate is None
    while scheduler.has_unfinished_requests():
        runner.step()
    done = fresh(publisher)
    assert done.count(BlockState.FREE) == 8
    assert done.count(BlockState.USED) == done.count(BlockState.SHARED) == 0


def test_the_step_time_and_rates_cover_the_steps_since_the_last_snapshot() -> None:
    clock = Clock()
    publisher = SnapshotPublisher(make_scheduler(), clock)
    publisher(step_stats(0.010, prefill=30, decode=1))
    publisher(step_stats(0.030, prefill=0, decode=4))
    clock.now += 2.0
    snapshot = fresh(publisher)
    assert snapshot.num_steps == 2
    assert abs(snapshot.step_time_s - 0.020) < 1e-12
    assert (snapshot.prompt_tokens_per_s, snapshot.generation_tokens_per_s) == (15.0, 2.5)
    clock.now += 1.0
    quiet = fresh(publisher)  # no step since
    assert (quiet.num_steps, quiet.step_time_s, quiet.generation_tokens_per_s) == (2, None, 0.0)


def test_a_snapshot_is_built_only_when_asked_for() -> None:
    scheduler = make_scheduler(num_blocks=8)
    publisher = SnapshotPublisher(scheduler, Clock())
    first = publisher.latest()
    publisher.publish()
    built = publisher.latest()
    assert built is not first
    publisher.publish()  # latest() asked once more
    publisher.publish()  # nobody asked since
    assert publisher.latest() is publisher.latest() is not built
    add(scheduler, "a", 4)
    FakeRunner(scheduler).step()
    assert publisher.latest().block_states == b""  # the step alone builds nothing


def test_a_build_waits_until_the_last_one_is_paid_off() -> None:
    clock = Clock(tick=0.002)  # each reading 2 ms later: a build takes 2 ms
    publisher = SnapshotPublisher(make_scheduler(num_blocks=8), clock)
    publisher.latest()
    publisher.publish()
    built = publisher.latest()  # also asks for the next
    clock.now += 0.002 / MAX_LOOP_SHARE - 0.010  # not yet 99 builds' time later
    publisher.publish()
    assert publisher.latest() is built
    clock.now += 0.010
    publisher.publish()
    assert publisher.latest() is not built
