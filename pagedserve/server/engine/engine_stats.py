"""Engine-level snapshots for observers: what one step did, where the engine stands, and how
the model is split over ranks."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedserve.server.engine.core.outputs import RequestOutput
from pagedserve.server.engine.core.scheduler_stats import SchedulerStats


@dataclass(slots=True)
class StepStats:
    """What one step did; observers (the server's metrics) read it after each step."""

    num_prefill_tokens: int  # prompt tokens computed (recomputation included)
    num_decode_tokens: int  # tokens sampled
    duration_s: float
    num_preempted: int
    num_running: int
    num_waiting: int
    finished: list[RequestOutput]
    # Seconds per phase (step_timing.STEP_PHASES); they add up to duration_s.
    phase_seconds: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class EngineStats:
    """A snapshot the server reads for /metrics, /load and the load-hint headers."""

    num_running: int
    num_waiting: int
    num_swapped: int
    kv_cache_usage: float
    cpu_kv_cache_usage: float
    free_token_capacity: int
    total_kv_tokens: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    prompt_tokens_total: int
    generation_tokens_total: int
    max_num_seqs: int
    max_num_batched_tokens: int
    # The KV cache the work held will need at most, as a share of it (None: not computed).
    kv_projected_usage: float | None = None

    @classmethod
    def of(cls, scheduler: SchedulerStats, *, prompt_tokens_total: int,
           generation_tokens_total: int, max_num_seqs: int,
           max_num_batched_tokens: int,
           kv_projected_usage: float | None = None) -> EngineStats:
        kv = scheduler.kv
        return cls(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_swapped=scheduler.num_swapped,
            kv_cache_usage=kv.kv_cache_usage,
            cpu_kv_cache_usage=kv.cpu.usage,
            free_token_capacity=kv.free_token_capacity,
            total_kv_tokens=kv.device.num_blocks * kv.block_size,
            prefix_cache_queries=scheduler.prefix_cache_queried_tokens,
            prefix_cache_hits=scheduler.prefix_cache_hit_tokens,
            num_preemptions=scheduler.num_preemptions,
            prompt_tokens_total=prompt_tokens_total,
            generation_tokens_total=generation_tokens_total,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            kv_projected_usage=kv_projected_usage,
        )


@dataclass(frozen=True, slots=True)
class ParallelInfo:
    """What /metrics and the start-up log state about the split: fixed once the engine is up."""

    tensor_parallel_size: int
    kv_blocks_per_rank: int  # the same on every rank: the block tables are shared
    kv_bytes_per_rank: int  # device memory of one rank's KV shard
    cpu_kv_blocks_per_rank: int
