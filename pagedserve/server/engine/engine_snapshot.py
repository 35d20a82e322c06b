"""What an observer sees of the engine between steps: every device block's state, the queues,
the recent step time and throughput (``EngineSnapshot``), published by the step loop.

Building a snapshot visits every block the pool has handed out, so the loop builds one only
when someone has asked since the last (``SnapshotPublisher.latest`` asks): a server nobody
watches pays one attribute test per step, and a watched one pays a build per read, never more
than one per step, and never more than ``MAX_LOOP_SHARE`` of the loop's time (a build that
took d seconds waits 99·d before the next one), however many read and however large the
cache. benchmarks/engine_snapshot.py measures the build against a step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pagedserve.server.engine.core.block_pool import BlockPool
    from pagedserve.server.engine.core.scheduler import Scheduler
    from pagedserve.server.engine.engine_stats import StepStats


# The most of the step loop's time that snapshots may take.
MAX_LOOP_SHARE = 0.01


class BlockState(IntEnum):
    """A device block's state, ordered so that the larger of two says more about a group."""

    FREE = 0  # no reference and no cached prefix: the next allocation may take it
    CACHED = 1  # no reference, but it holds a cached prefix a request can revive (evictable)
    USED = 2  # one sequence holds it
    SHARED = 3  # ref count above 1: forked samples or beams, or a prefix-cache hit


def block_states(pool: BlockPool) -> bytes:
    """One ``BlockState`` byte per block the pool has handed out so far, by block id; the
    blocks past them were never used and are free."""
    return bytes([3 if b.ref_cnt > 1 else 2 if b.ref_cnt else 0 if b.block_hash is None else 1
                  for b in pool.blocks])


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    """The engine's state after a step. ``block_states`` covers the first blocks only
    (``block_states()``); ``step_time_s`` is the mean of the steps since the previous
    snapshot (None when none ran), and the rates count tokens over the same interval."""

    taken_at: float  # the publisher's clock (time.perf_counter by default)
    num_steps: int
    num_running: int
    num_waiting: int
    num_swapped: int
    step_time_s: float | None
    generation_tokens_per_s: float
    prompt_tokens_per_s: float
    prefix_cache_hit_rate: float | None  # None: caching off, or no prompt looked up yet
    num_preemptions: int
    block_size: int
    num_blocks: int
    block_states: bytes

    def count(self, state: BlockState) -> int:
        """How many device blocks are in ``state``."""
        counted = self.block_states.count(state)
        if state is BlockState.FREE:
            counted += self.num_blocks - len(self.block_states)
        return counted


class SnapshotPublisher:
    """Builds ``EngineSnapshot``s in the step loop's thread, between steps, on request.

    A step observer (``__call__``) adds up each step's time and tokens; ``publish`` runs in
    the loop between steps and builds a snapshot if ``latest`` was called since the last one
    (and the last build's cost has been paid off, ``MAX_LOOP_SHARE``). ``latest`` may be
    called from any thread: it returns an immutable object and only sets a flag, so a reader
    never waits for a step and a step never waits for a reader. ``clock``: seconds, monotonic.
    """

    def __init__(self, scheduler: Scheduler,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self._scheduler = scheduler
        self._clock = clock
        self._wanted = False
        self._next_build_at = 0.0
        self._num_steps = 0
        self._window_steps = 0
        self._window_seconds = 0.0
        self._window_prompt_tokens = 0
        self._window_generated_tokens = 0
        self._latest = self._capture(self._clock(), elapsed=0.0)

    def __call__(self, step: StepStats) -> None:
        self._num_steps += 1
        self._window_steps += 1
        self._window_seconds += step.duration_s
        self._window_prompt_tokens += step.num_prefill_tokens
        self._window_generated_tokens += step.num_decode_tokens

    def latest(self) -> EngineSnapshot:
        """The newest snapshot; asks the loop for a fresh one after its next step."""
        self._wanted = True
        return self._latest

    @property
    def current(self) -> EngineSnapshot:
        """The newest snapshot, without asking for another."""
        return self._latest

    def publish(self) -> None:
        """Builds a snapshot if one was asked for since the last, unless the last build is
        too recent for its cost (the step loop's thread)."""
        if not self._wanted:
            return
        start = self._clock()
        if start < self._next_build_at:
            return
        self._wanted = False
        self._latest = self._capture(start, start - self._latest.taken_at)
        cost = self._clock() - start
        self._next_build_at = start + cost / MAX_LOOP_SHARE

    def _capture(self, now: float, elapsed: float) -> EngineSnapshot:
        scheduler = self._scheduler
        manager = scheduler.block_manager
        pool, cache = manager.device_pool, manager.prefix_cache_stats
        preemptions = scheduler.preemption_stats
        snapshot = EngineSnapshot(
            taken_at=now,
            num_steps=self._num_steps,
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_swapped=scheduler.num_swapped,
            step_time_s=(self._window_seconds / self._window_steps
                         if self._window_steps else None),
            generation_tokens_per_s=_rate(self._window_generated_tokens, elapsed),
            prompt_tokens_per_s=_rate(self._window_prompt_tokens, elapsed),
            prefix_cache_hit_rate=(cache.num_hit_tokens / cache.num_queried_tokens
                                   if pool.enable_caching and cache.num_queried_tokens
                                   else None),
            num_preemptions=preemptions.num_recompute + preemptions.num_swap,
            block_size=manager.block_size,
            num_blocks=pool.num_blocks,
            block_states=block_states(pool),
        )
        self._window_steps = self._window_prompt_tokens = self._window_generated_tokens = 0
        self._window_seconds = 0.0
        return snapshot


def _rate(tokens: int, seconds: float) -> float:
    return tokens / seconds if seconds > 0 else 0.0
